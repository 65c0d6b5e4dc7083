#include "node/image_inputs.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer::node {

absl::StatusOr<std::vector<engine::ImageEmbeddings>> ImagesFromHandles(
    const google::protobuf::RepeatedPtrField<internal::v1::EmbeddingHandle>& handles,
    const std::vector<int32_t>& prompt, int32_t image_token_id, int hidden_size, bool with_data) {
  std::vector<engine::ImageEmbeddings> out;
  if (handles.empty()) return out;
  if (image_token_id < 0) {
    return absl::InvalidArgumentError(
        "images: this model takes no images (its config has no image token)");
  }
  size_t cursor = 0;
  for (int k = 0; k < handles.size(); ++k) {
    const internal::v1::EmbeddingHandle& h = handles[k];
    const std::string field = absl::StrCat("images[", k, "]");
    if (h.content_hash().size() != 32) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".content_hash: expected 32 bytes (SHA-256); got ", h.content_hash().size()));
    }
    if (h.num_tokens() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".num_tokens: expected >= 1; got 0"));
    }
    if (static_cast<int>(h.hidden_size()) != hidden_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".hidden_size: expected ",
                                                     hidden_size, " (the model's); got ",
                                                     h.hidden_size()));
    }
    while (cursor < prompt.size() && prompt[cursor] != image_token_id) ++cursor;
    if (cursor >= prompt.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": no placeholder run left in prompt_token_ids for this image (image token ",
          image_token_id, ")"));
    }
    engine::ImageEmbeddings e;
    e.content_hash = h.content_hash();
    e.position = static_cast<int64_t>(cursor);
    e.num_tokens = h.num_tokens();
    cursor += h.num_tokens();
    if (with_data) {
      if (h.dtype() != "f32") {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".dtype: expected \"f32\"; got \"", h.dtype(), "\""));
      }
      const size_t values = static_cast<size_t>(h.num_tokens()) * h.hidden_size();
      if (h.data().size() != values * sizeof(float)) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".data: expected ",
                                                       values * sizeof(float), " bytes (",
                                                       h.num_tokens(), " x ", h.hidden_size(),
                                                       " f32); got ", h.data().size()));
      }
      auto data = std::make_shared<std::vector<float>>(values);
      std::memcpy(data->data(), h.data().data(), h.data().size());
      e.data = std::move(data);
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace deepinfer::node
