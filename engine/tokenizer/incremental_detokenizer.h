// Streams generated token ids to text. Each Push() returns only text that later tokens cannot
// change, so the concatenation of everything Push() and Flush() return equals
// Tokenizer::Decode() of all the ids, and no returned chunk ever ends inside a UTF-8 sequence.
//
// Held back until more tokens (or Flush) decide them: the bytes of an incomplete UTF-8 sequence
// spelled by byte-level tokens, a run of byte-fallback tokens (<0xE4><0xBD>...), and characters
// a Strip decoder may still remove. Flush() emits the rest, with U+FFFD for trailing bytes that
// never completed, exactly as Hugging Face's decode of the full sequence would.
//
// Cost: O(length of each token) per Push; nothing is re-decoded.
//
// Thread-safety: none; use one object per sequence. The Tokenizer must outlive it.
#ifndef DEEPINFER_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define DEEPINFER_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

namespace internal {
class DecodeStream;
}

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  ~IncrementalDetokenizer();
  IncrementalDetokenizer(const IncrementalDetokenizer&) = delete;
  IncrementalDetokenizer& operator=(const IncrementalDetokenizer&) = delete;

  // Adds one generated token; returns the text that became final (often empty while bytes of a
  // character are still arriving). kInvalidArgument for an id outside the vocabulary (the
  // stream is unchanged); kFailedPrecondition after Flush().
  absl::StatusOr<std::string> Push(int32_t id);

  // Ends the stream and returns all text still held back. kFailedPrecondition if called twice.
  absl::StatusOr<std::string> Flush();

  // Tokens accepted so far (skipped special tokens included).
  int64_t num_tokens() const { return num_tokens_; }

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::unique_ptr<internal::DecodeStream> stream_;
  bool flushed_ = false;
  int64_t num_tokens_ = 0;
};

}  // namespace deepinfer::tokenizer

#endif  // DEEPINFER_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
