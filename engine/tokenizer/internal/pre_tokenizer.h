// Pre-tokenizers of Hugging Face tokenizer.json ("pre_tokenizer" field): ByteLevel, Split,
// Sequence, Digits, Metaspace, WhitespaceSplit. They cut normalized text into the pieces the
// model tokenizes one by one, with the same split semantics as `tokenizers` (behaviors
// Removed / Isolated / MergedWithPrevious / MergedWithNext / Contiguous, `invert`, empty pieces
// dropped).
//
// Thread-safety: immutable after parsing; PreTokenize() may be called concurrently.
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_PRE_TOKENIZER_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/internal/json_util.h"

namespace deepinfer::tokenizer::internal {

struct PreToken {
  std::string text;
  // True if this piece starts at offset 0 of the original input (Metaspace's "first" scheme).
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` with their sub-pieces, in order; empty pieces are dropped.
  virtual absl::Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `piece` given the matches of a pattern in it (sorted, non-overlapping [begin, end)),
// following tokenizers' NormalizedString::split. Appends non-empty results to `out`.
void SplitPiece(const PreToken& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                bool invert, SplitBehavior behavior, std::vector<PreToken>* out);

// Parses one pre-tokenizer object. kInvalidArgument naming the type if it is not supported,
// e.g. `pre_tokenizer type "Whitespace" is not supported`.
absl::StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const Json& j, int depth = 0);

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_PRE_TOKENIZER_H_
