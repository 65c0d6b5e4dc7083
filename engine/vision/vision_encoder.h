// The vision side of a LLaVA-style multimodal model on the CPU: image bytes -> decoded RGB ->
// CLIP preprocessing -> CLIP vision tower -> selected hidden state -> multimodal projector ->
// one embedding row per image token, in the language model's hidden size.
//
// Model directory (Hugging Face layout):
//   config.json: model_type "llava"; vision_config of model_type "clip_vision_model" (absent
//     fields take CLIPVisionConfig's defaults); vision_feature_layer (an int; negative counts
//     from the end of the tower's hidden_states, where hidden_states[0] is the embeddings after
//     pre_layrnorm and hidden_states[i] the output of layer i); vision_feature_select_strategy
//     "default" (drop the CLS row) or "full"; projector_hidden_act "gelu" (exact erf);
//     multimodal_projector_bias; image_token_index (or image_token_id); text_config.hidden_size.
//   *.safetensors: the tower under model.vision_tower.vision_model.*, vision_tower.vision_model.*
//     or vision_tower.* and the projector under model.multi_modal_projector.* or
//     multi_modal_projector.*; f32, bf16 or f16 weights (computation is f32 throughout; bf16/f16
//     models therefore differ from a bf16/f16 framework run by that dtype's rounding).
//   processor_config.json / preprocessor_config.json: see image_processor.h.
// Tower math (CLIPVisionTransformer): patch convolution (stride = patch, no bias) + class
// embedding + learned position embeddings, pre_layrnorm, then per layer: LayerNorm -> MHA with
// q/k/v/out biases, bidirectional, scale head_dim^-0.5 -> residual; LayerNorm -> fc1 ->
// hidden_act (quick_gelu, gelu or gelu_pytorch_tanh) -> fc2 -> residual. Only the layers up to
// the selected one run.
//
// Errors: Load gives kInvalidArgument / kNotFound naming the file and the key or tensor; the
// Encode methods give kInvalidArgument for bad input (image errors as in image_decode.h, pixel
// buffers of the wrong size).
//
// Thread-safety: all const methods are thread-safe; encodes are serialised internally (they share
// one thread pool). Not copyable or movable.
#ifndef DEEPINFER_ENGINE_VISION_VISION_ENCODER_H_
#define DEEPINFER_ENGINE_VISION_VISION_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/safetensors.h"
#include "engine/vision/image_decode.h"
#include "engine/vision/image_processor.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace deepinfer::engine::vision {

struct VisionEncoderOptions {
  int num_threads = 0;  // compute threads; <= 0: hardware concurrency
  ImageLimits limits;   // applied by EncodeImage
};

// The tower's shape, from config.json.
struct VisionTowerConfig {
  int hidden_size = 768;
  int intermediate_size = 3072;
  int num_layers = 12;
  int num_heads = 12;
  int image_size = 224;
  int patch_size = 32;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";
};

class VisionEncoder {
 public:
  static absl::StatusOr<std::unique_ptr<VisionEncoder>> Load(
      const std::string& model_dir, const VisionEncoderOptions& options = {});

  VisionEncoder(const VisionEncoder&) = delete;
  VisionEncoder& operator=(const VisionEncoder&) = delete;
  ~VisionEncoder();

  // Rows per image: patches (+1 with the "full" strategy).
  int num_image_tokens() const { return num_image_tokens_; }
  // The language model's hidden size: columns of each embedding row.
  int output_hidden_size() const { return output_hidden_size_; }
  int32_t image_token_id() const { return image_token_id_; }
  const VisionTowerConfig& tower_config() const { return tower_; }
  const ImageProcessorConfig& processor_config() const { return processor_; }
  // Side of the square input the tower takes (pixels).
  int image_size() const { return tower_.image_size; }

  // Decode + preprocess + tower + projector: num_image_tokens x output_hidden_size, row-major.
  absl::StatusOr<std::vector<float>> EncodeImage(absl::string_view image_bytes) const;
  // Tower + projector on preprocessed CHW pixels (3 x image_size x image_size).
  absl::StatusOr<std::vector<float>> EncodePixels(const std::vector<float>& chw) const;
  // The selected vision features before the projector: num_image_tokens x vision hidden size.
  absl::StatusOr<std::vector<float>> Features(const std::vector<float>& chw) const;

 private:
  struct Weight {
    const void* data = nullptr;
    kernels::DType dtype = kernels::DType::kF32;
  };
  struct Linear {
    Weight weight;
    const void* bias = nullptr;  // same dtype as the weight; may be null
    int64_t out = 0;
    int64_t in = 0;
  };
  struct LayerNorm {
    std::vector<float> weight;
    std::vector<float> bias;
  };
  struct Layer {
    LayerNorm norm1, norm2;
    Linear q, k, v, o, fc1, fc2;
  };

  VisionEncoder() = default;
  absl::Status LoadWeights();
  absl::StatusOr<Linear> GetLinear(const std::string& name, int64_t out, int64_t in,
                                   bool bias) const;
  absl::StatusOr<LayerNorm> GetLayerNorm(const std::string& name, int64_t size) const;
  absl::StatusOr<std::vector<float>> GetF32(const std::string& name,
                                            const std::vector<int64_t>& shape) const;

  absl::Status CheckPixels(const std::vector<float>& chw) const;
  void RunLinear(const Linear& l, const float* x, int64_t m, float* y) const;
  void RunLayerNorm(const LayerNorm& ln, float* x, int64_t m) const;
  void RunActivation(const std::string& act, float* x, int64_t count) const;
  // Tower up to the selected layer and row selection; caller holds mu_.
  std::vector<float> FeaturesLocked(const std::vector<float>& chw) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<float> ProjectLocked(const std::vector<float>& features) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string model_dir_;
  VisionEncoderOptions options_;
  VisionTowerConfig tower_;
  ImageProcessorConfig processor_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::string tower_prefix_;
  std::string projector_prefix_;
  int feature_layer_ = 0;  // index into hidden_states: layers to run
  bool drop_cls_ = true;
  bool projector_bias_ = true;
  int num_image_tokens_ = 0;
  int output_hidden_size_ = 0;
  int32_t image_token_id_ = -1;

  Linear patch_embedding_;  // [hidden, 3 * patch * patch]
  std::vector<float> class_embedding_;
  std::vector<float> position_embedding_;  // [patches + 1, hidden]
  LayerNorm pre_layernorm_;
  std::vector<Layer> layers_;
  Linear projector_1_, projector_2_;

  mutable absl::Mutex mu_;
  std::unique_ptr<kernels::ThreadPool> pool_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace deepinfer::engine::vision

#endif  // DEEPINFER_ENGINE_VISION_VISION_ENCODER_H_
