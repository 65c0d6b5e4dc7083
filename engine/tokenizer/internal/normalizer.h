// Normalizers of Hugging Face tokenizer.json ("normalizer" field): NFC, Sequence, Prepend,
// Replace, Strip, ByteLevel. They rewrite text before pre-tokenization; offsets are not tracked
// (the engine never needs them).
//
// Thread-safety: immutable after parsing; Normalize() may be called concurrently.
#ifndef DEEPINFER_ENGINE_TOKENIZER_INTERNAL_NORMALIZER_H_
#define DEEPINFER_ENGINE_TOKENIZER_INTERNAL_NORMALIZER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/internal/json_util.h"

namespace deepinfer::tokenizer::internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8 in, valid UTF-8 out).
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// Parses one normalizer object. kInvalidArgument naming the type if it is not supported, e.g.
// `normalizer type "Lowercase" is not supported`.
absl::StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const Json& j, int depth = 0);

}  // namespace deepinfer::tokenizer::internal

#endif  // DEEPINFER_ENGINE_TOKENIZER_INTERNAL_NORMALIZER_H_
