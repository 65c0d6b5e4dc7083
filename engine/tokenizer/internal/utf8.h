// UTF-8 helpers for the tokenizer: validation with error offsets, code point iteration, a
// streaming lossy decoder with Rust `String::from_utf8_lossy` semantics (which Hugging Face
// `tokenizers` uses), Unicode White_Space, and the GPT-2 byte-level alphabet.
//
// All functions are pure and thread-safe; Utf8StreamDecoder objects are not (one per stream).
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_UTF8_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_UTF8_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer::internal {

inline constexpr char32_t kReplacementChar = 0xFFFD;
inline constexpr char kReplacementUtf8[] = "\xEF\xBF\xBD";

// Returns OK if `s` is well-formed UTF-8 (no overlongs, surrogates or code points past
// U+10FFFF); otherwise kInvalidArgument naming the byte offset of the first bad sequence.
absl::Status ValidateUtf8(absl::string_view s);

// Length of the longest prefix of `s` that is a complete, valid UTF-8 sequence starting at
// s[0], or 0 if s[0] does not start one (s must be non-empty). For the bytes at which an invalid
// sequence starts, *maximal_subpart receives the number of bytes that Unicode's "maximal subpart"
// rule replaces with one U+FFFD (>= 1), or, when `s` ends inside a sequence that could still be
// completed, the number of bytes of that incomplete prefix with *incomplete set to true.
size_t ValidSequenceLength(absl::string_view s, size_t* maximal_subpart, bool* incomplete);

// Decodes one code point from valid UTF-8 at `s[pos]`; advances `pos`. Precondition: `s` is valid.
char32_t NextCodePoint(absl::string_view s, size_t& pos);

// Appends the UTF-8 encoding of `cp` (must be a scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for invalid lead bytes).
inline size_t SequenceLengthFromLead(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool IsUnicodeWhitespace(char32_t cp);

// Converts bytes to text the way Rust's String::from_utf8_lossy does, incrementally: complete
// valid sequences pass through, each maximal invalid subpart becomes one U+FFFD, and an
// incomplete sequence at the end of the input so far is held back until more bytes arrive or
// Finish() is called (which replaces it with one U+FFFD). Output is always valid UTF-8.
class Utf8StreamDecoder {
 public:
  // Appends the text decodable so far from the pending bytes plus `bytes` to `out`.
  void Append(absl::string_view bytes, std::string* out);
  // Flushes held-back bytes (an incomplete sequence) as U+FFFD.
  void Finish(std::string* out);
  bool has_pending() const { return !pending_.empty(); }

 private:
  std::string pending_;  // at most 3 bytes of an incomplete sequence
};

// One-shot lossy conversion (Rust String::from_utf8_lossy).
std::string Utf8Lossy(absl::string_view bytes);

// GPT-2 byte-level alphabet: every byte maps to a printable code point (bytes_to_unicode()).
// ByteToUnicodeUtf8()[b] is that code point's UTF-8 encoding.
const std::array<std::string, 256>& ByteToUnicodeUtf8();
// Inverse mapping: the byte a code point stands for, or -1 if it is not in the alphabet.
int UnicodeToByte(char32_t cp);

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_UTF8_H_
