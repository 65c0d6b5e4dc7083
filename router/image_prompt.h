// Images in a chat prompt: the chat template renders each image part as one placeholder token
// (the model's image token, e.g. "<image>"); the vision encoder says how many embedding rows
// each image has; the prompt the workers see repeats the placeholder once per row, as
// transformers' LlavaProcessor does, and the decode/prefill request carries the embeddings in
// the same order.
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_ROUTER_IMAGE_PROMPT_H_
#define DEEPINFER_ROUTER_IMAGE_PROMPT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace deepinfer::router {

// Where the images' placeholder runs are in an expanded prompt.
struct ExpandedPrompt {
  std::vector<uint32_t> token_ids;
  // For image k: its first placeholder's index in token_ids; rows_per_image[k] tokens follow.
  std::vector<int64_t> image_positions;
};

// Replaces the i-th occurrence of `image_token_id` in `rendered` with rows_per_image[i] copies.
// kInvalidArgument naming `messages` when the rendered prompt holds a different number of
// placeholders than there are images (e.g. a template that drops image parts, or a text part
// that spells the placeholder itself), or when a row count is < 1.
absl::StatusOr<ExpandedPrompt> ExpandImagePlaceholders(absl::Span<const int32_t> rendered,
                                                       int32_t image_token_id,
                                                       absl::Span<const int64_t> rows_per_image);

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_IMAGE_PROMPT_H_
