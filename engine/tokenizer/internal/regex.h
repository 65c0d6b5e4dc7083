// A compiled PCRE2 regular expression in UTF + UCP mode (\p{L}, \s, \w are Unicode-aware), JIT
// compiled when the PCRE2 build supports it. Used for pre-tokenizer splits, Replace patterns and
// added-token boundary checks; these patterns need look-ahead, which RE2 lacks.
//
// Thread-safety: a Regex is immutable after Create() and may be used from any number of threads
// at once (match data and the JIT stack are per thread).
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_REGEX_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_REGEX_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer::internal {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma/Perl syntax as found in tokenizer.json files).
  // kInvalidArgument if it does not compile, naming the pattern and the offset of the error.
  static absl::StatusOr<std::unique_ptr<Regex>> Create(absl::string_view pattern);
  // A regex matching `literal` exactly (for the `{"String": ...}` pattern form).
  static absl::StatusOr<std::unique_ptr<Regex>> CreateLiteral(absl::string_view literal);

  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches in `text` (valid UTF-8), left to right, as [begin, end) byte
  // offsets. After an empty match the search resumes one code point further. Errors (match or
  // JIT stack limits) come back as kResourceExhausted.
  absl::Status FindAll(absl::string_view text,
                       std::vector<std::pair<size_t, size_t>>* matches) const;

  // True if the pattern matches somewhere in `text`.
  absl::StatusOr<bool> Search(absl::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex(std::string pattern, void* code) : pattern_(std::move(pattern)), code_(code) {}

  std::string pattern_;
  void* code_;  // pcre2_code*
};

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_REGEX_H_
