// CLIP-style image preprocessing, reproducing transformers' CLIPImageProcessorPil (the PIL
// backend, transformers 5) bit for bit where PIL's integer arithmetic allows:
//   1. do_convert_rgb: images with alpha are composited onto opaque white with PIL's
//      alpha_composite fixed-point arithmetic (transformers' convert_to_rgb); others pass as RGB.
//   2. do_resize: output size from `size` ({"shortest_edge": s}: the short side becomes s, the
//      long side int(s * long / short); or {"height", "width"}), then PIL's Image.resize with the
//      configured filter: separable convolution, horizontal pass then vertical pass, filter
//      support scaled by the downscale factor (antialiasing), coefficients normalised in double
//      and quantised to 22-bit fixed point, each pass rounded and clipped to uint8. An image that
//      already has the target size is not touched.
//   3. do_center_crop: top = (h - crop_h) / 2, left = (w - crop_w) / 2 (floor); an image smaller
//      than the crop is zero-padded first (padding ceil((crop - size) / 2) before), as
//      transformers' center_crop does.
//   4. do_rescale: float32(double(v) * rescale_factor); do_normalize: (x - mean) / std in
//      float32 with mean and std rounded to float32.
// Output: CHW float32, 3 x out_height x out_width.
//
// Thread-safety: all functions are pure and thread-safe.
#ifndef DEEPINFER_ENGINE_VISION_IMAGE_PROCESSOR_H_
#define DEEPINFER_ENGINE_VISION_IMAGE_PROCESSOR_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/vision/image_decode.h"
#include "nlohmann/json_fwd.hpp"

namespace deepinfer::engine::vision {

// PIL resampling codes (PIL.Image.Resampling) that Preprocess implements.
inline constexpr int kResampleBilinear = 2;
inline constexpr int kResampleBicubic = 3;

struct ImageProcessorConfig {
  bool do_resize = true;
  // Either shortest_edge > 0, or resize_height and resize_width > 0.
  int shortest_edge = 224;
  int resize_height = 0;
  int resize_width = 0;
  int resample = kResampleBicubic;
  bool do_center_crop = true;
  int crop_height = 224;
  int crop_width = 224;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};
  bool do_convert_rgb = true;
};

// Reads `model_dir`/processor_config.json (its "image_processor" object, transformers 5) or, if
// that file is absent or has no such object, `model_dir`/preprocessor_config.json (older
// layout). Accepts image_processor_type CLIPImageProcessor (and its Fast/Pil variants), size as
// an int or {"shortest_edge"} or {"height", "width"}, crop_size as an int or {"height",
// "width"}. Unsupported settings (another processor type, resample other than 2 or 3, do_pad,
// crop_pct, size.longest_edge, ...) and unknown keys are kInvalidArgument naming the file and key.
absl::StatusOr<ImageProcessorConfig> LoadImageProcessorConfig(const std::string& model_dir);

// Parses one image processor JSON object; `source` labels error messages.
absl::StatusOr<ImageProcessorConfig> ParseImageProcessorConfig(const nlohmann::json& json,
                                                               const std::string& source);

// (height, width) of Preprocess's output for an image of the given size.
std::pair<int, int> PreprocessedSize(int width, int height, const ImageProcessorConfig& config);

// CHW float32 pixel values (3 x height x width of PreprocessedSize). `image` must be valid
// (pixels.size() == width * height * 3, alpha empty or width * height).
std::vector<float> Preprocess(const RgbImage& image, const ImageProcessorConfig& config);

// PIL's Image.resize of an 8-bit RGB image (HWC) to out_width x out_height with
// kResampleBilinear or kResampleBicubic; exposed for tests.
std::vector<uint8_t> ResizeRgb(const std::vector<uint8_t>& pixels, int width, int height,
                               int out_width, int out_height, int resample);

}  // namespace deepinfer::engine::vision

#endif  // DEEPINFER_ENGINE_VISION_IMAGE_PROCESSOR_H_
