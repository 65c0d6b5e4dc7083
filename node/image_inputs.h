// Image embeddings on the wire (internal::v1::EmbeddingHandle, inline float32 data from a vision
// encoder) -> the engine's ImageEmbeddings, for decode and prefill nodes.
//
// The handles come in prompt order, one per image; image k's run is the next `num_tokens`
// placeholder tokens (the model's image_token_id) of the prompt after image k-1's run, so two
// adjacent images need no separator.
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_NODE_IMAGE_INPUTS_H_
#define DEEPINFER_NODE_IMAGE_INPUTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/llm_engine.h"
#include "google/protobuf/repeated_field.h"
#include "proto/deepinfer/internal/v1/encoder.pb.h"

namespace deepinfer::node {

// kInvalidArgument naming images[k].<field> (content_hash not 32 bytes, num_tokens 0, hidden_size
// not the model's, dtype not "f32", data size not num_tokens x hidden_size x 4 when `with_data`,
// no placeholder run left in the prompt for it) and naming `images` when the model has no image
// token. `with_data` false (a decode node reserving KV for a remote prefill) converts only the
// hashes and positions.
absl::StatusOr<std::vector<engine::ImageEmbeddings>> ImagesFromHandles(
    const google::protobuf::RepeatedPtrField<internal::v1::EmbeddingHandle>& handles,
    const std::vector<int32_t>& prompt, int32_t image_token_id, int hidden_size, bool with_data);

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_IMAGE_INPUTS_H_
