#include "router/image_prompt.h"

#include "absl/strings/str_cat.h"

namespace deepinfer::router {

absl::StatusOr<ExpandedPrompt> ExpandImagePlaceholders(absl::Span<const int32_t> rendered,
                                                       int32_t image_token_id,
                                                       absl::Span<const int64_t> rows_per_image) {
  int64_t placeholders = 0;
  for (int32_t id : rendered) placeholders += id == image_token_id ? 1 : 0;
  if (placeholders != static_cast<int64_t>(rows_per_image.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "messages: the chat template rendered ", placeholders, " image placeholder token",
        placeholders == 1 ? "" : "s", " (id ", image_token_id, ") for ", rows_per_image.size(),
        " image", rows_per_image.size() == 1 ? "" : "s",
        "; every image part must render exactly one, and text must not contain the placeholder"));
  }
  ExpandedPrompt out;
  int64_t total = static_cast<int64_t>(rendered.size());
  for (size_t k = 0; k < rows_per_image.size(); ++k) {
    if (rows_per_image[k] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("messages: image ", k, " has ",
                                                     rows_per_image[k], " embedding rows"));
    }
    total += rows_per_image[k] - 1;
  }
  out.token_ids.reserve(static_cast<size_t>(total));
  size_t image = 0;
  for (int32_t id : rendered) {
    if (id != image_token_id) {
      out.token_ids.push_back(static_cast<uint32_t>(id));
      continue;
    }
    out.image_positions.push_back(static_cast<int64_t>(out.token_ids.size()));
    out.token_ids.insert(out.token_ids.end(), static_cast<size_t>(rows_per_image[image]),
                         static_cast<uint32_t>(id));
    ++image;
  }
  return out;
}

}  // namespace deepinfer::router
