#include "engine/vision/vision_encoder.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/linear_cpu.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::vision {
namespace {

using json = nlohmann::json;

absl::Status ConfigError(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, ": ", what));
}

// An integer field with a default for absent/null values, within [lo, hi].
absl::StatusOr<int64_t> IntField(const json& obj, const std::string& prefix, const char* key,
                                 int64_t fallback, int64_t lo, int64_t hi) {
  if (!obj.contains(key) || obj[key].is_null()) return fallback;
  const json& v = obj[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    return ConfigError(prefix + key,
                       absl::StrCat("expected an integer in [", lo, ", ", hi, "], got ", v.dump()));
  }
  return v.get<int64_t>();
}

absl::StatusOr<kernels::DType> ComputeDType(const TensorView& t, const std::string& file) {
  switch (t.dtype) {
    case StDType::kF32:
      return kernels::DType::kF32;
    case StDType::kBF16:
      return kernels::DType::kBF16;
    case StDType::kF16:
      return kernels::DType::kF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", t.name, ": dtype ",
                                                     StDTypeName(t.dtype),
                                                     " is not a float type (f32, bf16, f16)"));
  }
}

float Gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

float GeluTanh(float x) {
  constexpr float kAlpha = 0.79788456080286536f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(kAlpha * (x + 0.044715f * x * x * x)));
}

float QuickGelu(float x) { return x / (1.0f + std::exp(-1.702f * x)); }

}  // namespace

VisionEncoder::~VisionEncoder() = default;

absl::StatusOr<std::unique_ptr<VisionEncoder>> VisionEncoder::Load(
    const std::string& model_dir, const VisionEncoderOptions& options) {
  std::unique_ptr<VisionEncoder> e(new VisionEncoder());
  e->model_dir_ = model_dir;
  e->options_ = options;

  const std::string config_path = model_dir + "/config.json";
  std::ifstream in(config_path, std::ios::binary);
  if (!in) return absl::NotFoundError(config_path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const json config = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(config_path + ": not a JSON object");
  }
  if (config.value("model_type", "") != "llava") {
    return ConfigError("model_type", "expected \"llava\", got " + (config.contains("model_type")
                                                                       ? config["model_type"].dump()
                                                                       : std::string("nothing")));
  }
  if (!config.contains("vision_config") || !config["vision_config"].is_object()) {
    return ConfigError("vision_config", "missing");
  }
  const json& vc = config["vision_config"];
  const std::string vision_type = vc.value("model_type", "clip_vision_model");
  if (vision_type != "clip_vision_model") {
    return ConfigError("vision_config.model_type",
                       "only clip_vision_model is supported, got \"" + vision_type + "\"");
  }
  VisionTowerConfig& t = e->tower_;
  const std::string vp = "vision_config.";
  DI_ASSIGN_OR_RETURN(int64_t hidden, IntField(vc, vp, "hidden_size", 768, 1, 1 << 16));
  DI_ASSIGN_OR_RETURN(int64_t inter, IntField(vc, vp, "intermediate_size", 3072, 1, 1 << 18));
  DI_ASSIGN_OR_RETURN(int64_t layers, IntField(vc, vp, "num_hidden_layers", 12, 1, 1024));
  DI_ASSIGN_OR_RETURN(int64_t heads, IntField(vc, vp, "num_attention_heads", 12, 1, 1024));
  DI_ASSIGN_OR_RETURN(int64_t image_size, IntField(vc, vp, "image_size", 224, 1, 8192));
  DI_ASSIGN_OR_RETURN(int64_t patch, IntField(vc, vp, "patch_size", 32, 1, 8192));
  DI_ASSIGN_OR_RETURN(int64_t channels, IntField(vc, vp, "num_channels", 3, 1, 16));
  t.hidden_size = hidden;
  t.intermediate_size = inter;
  t.num_layers = layers;
  t.num_heads = heads;
  t.image_size = image_size;
  t.patch_size = patch;
  if (channels != 3) return ConfigError(vp + "num_channels", "only 3 channels are supported");
  if (hidden % heads != 0) {
    return ConfigError(vp + "num_attention_heads",
                       absl::StrCat(heads, " does not divide hidden_size ", hidden));
  }
  if (image_size % patch != 0) {
    return ConfigError(vp + "patch_size",
                       absl::StrCat(patch, " does not divide image_size ", image_size));
  }
  if (vc.contains("layer_norm_eps") && !vc["layer_norm_eps"].is_null()) {
    if (!vc["layer_norm_eps"].is_number() || !(vc["layer_norm_eps"].get<double>() > 0)) {
      return ConfigError(vp + "layer_norm_eps", "expected a positive number");
    }
    t.layer_norm_eps = vc["layer_norm_eps"].get<double>();
  }
  t.hidden_act = vc.value("hidden_act", std::string("quick_gelu"));
  if (t.hidden_act != "quick_gelu" && t.hidden_act != "gelu" &&
      t.hidden_act != "gelu_pytorch_tanh") {
    return ConfigError(vp + "hidden_act", "unsupported activation \"" + t.hidden_act + "\"");
  }

  // Feature selection.
  if (config.contains("vision_feature_layer") && !config["vision_feature_layer"].is_null() &&
      !config["vision_feature_layer"].is_number_integer()) {
    return ConfigError("vision_feature_layer", "only a single layer index is supported, got " +
                                                   config["vision_feature_layer"].dump());
  }
  const int64_t feature_layer = config.value("vision_feature_layer", int64_t{-2});
  const int64_t num_states = layers + 1;
  const int64_t index = feature_layer < 0 ? num_states + feature_layer : feature_layer;
  if (index < 0 || index >= num_states) {
    return ConfigError("vision_feature_layer",
                       absl::StrCat(feature_layer, " is outside the ", num_states,
                                    " hidden states of a ", layers, "-layer tower"));
  }
  e->feature_layer_ = static_cast<int>(index);
  const std::string strategy = config.value("vision_feature_select_strategy", "default");
  if (strategy != "default" && strategy != "full") {
    return ConfigError("vision_feature_select_strategy",
                       "expected \"default\" or \"full\", got \"" + strategy + "\"");
  }
  e->drop_cls_ = strategy == "default";
  const std::string act = config.value("projector_hidden_act", "gelu");
  if (act != "gelu") {
    return ConfigError("projector_hidden_act", "only \"gelu\" is supported, got \"" + act + "\"");
  }
  if (config.contains("multimodal_projector_bias")) {
    if (!config["multimodal_projector_bias"].is_boolean()) {
      return ConfigError("multimodal_projector_bias", "expected a boolean");
    }
    e->projector_bias_ = config["multimodal_projector_bias"].get<bool>();
  }
  const char* token_key =
      config.contains("image_token_index") ? "image_token_index" : "image_token_id";
  DI_ASSIGN_OR_RETURN(int64_t token_id, IntField(config, "", token_key, 32000, 0,
                                                 std::numeric_limits<int32_t>::max()));
  e->image_token_id_ = static_cast<int32_t>(token_id);
  int64_t text_hidden = 0;
  if (config.contains("text_config") && config["text_config"].is_object()) {
    DI_ASSIGN_OR_RETURN(
        text_hidden, IntField(config["text_config"], "text_config.", "hidden_size", 0, 1, 1 << 18));
  }
  const int64_t patches = (image_size / patch) * (image_size / patch);
  e->num_image_tokens_ = static_cast<int>(e->drop_cls_ ? patches : patches + 1);

  DI_ASSIGN_OR_RETURN(e->processor_, LoadImageProcessorConfig(model_dir));
  DI_ASSIGN_OR_RETURN(e->checkpoint_, Checkpoint::Open(model_dir));
  // The projector's output size: text_config.hidden_size, or (absent) linear_1's rows.
  for (const char* prefix : {"model.multi_modal_projector.", "multi_modal_projector."}) {
    if (e->checkpoint_->Find(std::string(prefix) + "linear_1.weight") != nullptr) {
      e->projector_prefix_ = prefix;
      break;
    }
  }
  if (e->projector_prefix_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir,
                     ": no tensor multi_modal_projector.linear_1.weight (nor "
                     "model.multi_modal_projector.linear_1.weight)"));
  }
  if (text_hidden == 0) {
    const TensorView* w = e->checkpoint_->Find(e->projector_prefix_ + "linear_1.weight");
    text_hidden = w->shape.empty() ? 0 : w->shape[0];
  }
  e->output_hidden_size_ = static_cast<int>(text_hidden);
  DI_RETURN_IF_ERROR(e->LoadWeights());
  e->pool_ = kernels::ThreadPool::Create(options.num_threads);
  return e;
}

absl::StatusOr<std::vector<float>> VisionEncoder::GetF32(const std::string& name,
                                                         const std::vector<int64_t>& shape) const {
  DI_ASSIGN_OR_RETURN(const TensorView* t, checkpoint_->Get(name, shape));
  DI_ASSIGN_OR_RETURN(kernels::DType dtype, ComputeDType(*t, checkpoint_->dir()));
  std::vector<float> out(t->numel());
  for (int64_t i = 0; i < t->numel(); ++i) out[i] = kernels::LoadAsF32(t->data, dtype, i);
  return out;
}

absl::StatusOr<VisionEncoder::Linear> VisionEncoder::GetLinear(const std::string& name, int64_t out,
                                                               int64_t in, bool bias) const {
  Linear l;
  l.out = out;
  l.in = in;
  DI_ASSIGN_OR_RETURN(const TensorView* w, checkpoint_->Get(name + ".weight", {out, in}));
  DI_ASSIGN_OR_RETURN(l.weight.dtype, ComputeDType(*w, checkpoint_->dir()));
  l.weight.data = w->data;
  if (bias) {
    DI_ASSIGN_OR_RETURN(const TensorView* b, checkpoint_->Get(name + ".bias", {out}));
    if (b->dtype != w->dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(checkpoint_->dir(), ": tensor ", b->name, ": dtype ", StDTypeName(b->dtype),
                       " differs from its weight's ", StDTypeName(w->dtype)));
    }
    l.bias = b->data;
  }
  return l;
}

absl::StatusOr<VisionEncoder::LayerNorm> VisionEncoder::GetLayerNorm(const std::string& name,
                                                                     int64_t size) const {
  LayerNorm ln;
  DI_ASSIGN_OR_RETURN(ln.weight, GetF32(name + ".weight", {size}));
  DI_ASSIGN_OR_RETURN(ln.bias, GetF32(name + ".bias", {size}));
  return ln;
}

absl::Status VisionEncoder::LoadWeights() {
  for (const char* prefix : {"model.vision_tower.vision_model.", "vision_tower.vision_model.",
                             "model.vision_tower.", "vision_tower."}) {
    if (checkpoint_->Find(std::string(prefix) + "embeddings.class_embedding") != nullptr) {
      tower_prefix_ = prefix;
      break;
    }
  }
  if (tower_prefix_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir_,
                     ": no tensor vision_tower.vision_model.embeddings.class_embedding (nor with "
                     "prefix model., or without vision_model.)"));
  }
  const int64_t d = tower_.hidden_size;
  const int64_t p = tower_.patch_size;
  const int64_t grid = tower_.image_size / p;
  const std::string& tp = tower_prefix_;
  {
    DI_ASSIGN_OR_RETURN(const TensorView* w,
                        checkpoint_->Get(tp + "embeddings.patch_embedding.weight", {d, 3, p, p}));
    DI_ASSIGN_OR_RETURN(patch_embedding_.weight.dtype, ComputeDType(*w, checkpoint_->dir()));
    patch_embedding_.weight.data = w->data;
    patch_embedding_.out = d;
    patch_embedding_.in = 3 * p * p;
  }
  DI_ASSIGN_OR_RETURN(class_embedding_, GetF32(tp + "embeddings.class_embedding", {d}));
  DI_ASSIGN_OR_RETURN(position_embedding_,
                      GetF32(tp + "embeddings.position_embedding.weight", {grid * grid + 1, d}));
  DI_ASSIGN_OR_RETURN(pre_layernorm_, GetLayerNorm(tp + "pre_layrnorm", d));
  const int64_t inter = tower_.intermediate_size;
  for (int i = 0; i < feature_layer_; ++i) {
    const std::string lp = absl::StrCat(tp, "encoder.layers.", i, ".");
    Layer layer;
    DI_ASSIGN_OR_RETURN(layer.norm1, GetLayerNorm(lp + "layer_norm1", d));
    DI_ASSIGN_OR_RETURN(layer.norm2, GetLayerNorm(lp + "layer_norm2", d));
    DI_ASSIGN_OR_RETURN(layer.q, GetLinear(lp + "self_attn.q_proj", d, d, true));
    DI_ASSIGN_OR_RETURN(layer.k, GetLinear(lp + "self_attn.k_proj", d, d, true));
    DI_ASSIGN_OR_RETURN(layer.v, GetLinear(lp + "self_attn.v_proj", d, d, true));
    DI_ASSIGN_OR_RETURN(layer.o, GetLinear(lp + "self_attn.out_proj", d, d, true));
    DI_ASSIGN_OR_RETURN(layer.fc1, GetLinear(lp + "mlp.fc1", inter, d, true));
    DI_ASSIGN_OR_RETURN(layer.fc2, GetLinear(lp + "mlp.fc2", d, inter, true));
    layers_.push_back(std::move(layer));
  }
  DI_ASSIGN_OR_RETURN(projector_1_, GetLinear(projector_prefix_ + "linear_1", output_hidden_size_,
                                              d, projector_bias_));
  DI_ASSIGN_OR_RETURN(projector_2_, GetLinear(projector_prefix_ + "linear_2", output_hidden_size_,
                                              output_hidden_size_, projector_bias_));
  return absl::OkStatus();
}

void VisionEncoder::RunLinear(const Linear& l, const float* x, int64_t m, float* y) const {
  kernels::LinearParams p;
  p.x = x;
  p.weight = l.weight.data;
  p.weight_dtype = l.weight.dtype;
  p.bias = l.bias;
  p.y = y;
  p.m = m;
  p.n = l.out;
  p.k = l.in;
  p.round_to = kernels::DType::kF32;
  kernels::LinearCpu(p, pool_.get());
}

void VisionEncoder::RunLayerNorm(const LayerNorm& ln, float* x, int64_t m) const {
  const int64_t d = static_cast<int64_t>(ln.weight.size());
  const double eps = tower_.layer_norm_eps;
  pool_->ParallelFor(m, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = x + r * d;
      double mean = 0;
      for (int64_t i = 0; i < d; ++i) mean += row[i];
      mean /= d;
      double var = 0;
      for (int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean);
      var /= d;
      const float mean_f = static_cast<float>(mean);
      const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
      for (int64_t i = 0; i < d; ++i) {
        row[i] = (row[i] - mean_f) * inv * ln.weight[i] + ln.bias[i];
      }
    }
  });
}

void VisionEncoder::RunActivation(const std::string& act, float* x, int64_t count) const {
  float (*fn)(float) = act == "quick_gelu" ? &QuickGelu : (act == "gelu" ? &Gelu : &GeluTanh);
  pool_->ParallelFor(count, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = fn(x[i]);
  });
}

absl::Status VisionEncoder::CheckPixels(const std::vector<float>& chw) const {
  const size_t expected = size_t{3} * tower_.image_size * tower_.image_size;
  if (chw.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("pixel values: expected 3x", tower_.image_size,
                                                   "x", tower_.image_size, " = ", expected,
                                                   " floats, got ", chw.size()));
  }
  return absl::OkStatus();
}

std::vector<float> VisionEncoder::FeaturesLocked(const std::vector<float>& chw) const {
  const int64_t d = tower_.hidden_size;
  const int64_t p = tower_.patch_size;
  const int64_t side = tower_.image_size;
  const int64_t grid = side / p;
  const int64_t num_patches = grid * grid;
  const int64_t tokens = num_patches + 1;
  const int64_t k = 3 * p * p;

  // Patch convolution as a matmul: each patch flattened in the conv weight's (c, y, x) order.
  std::vector<float> patches(num_patches * k);
  for (int64_t gy = 0; gy < grid; ++gy) {
    for (int64_t gx = 0; gx < grid; ++gx) {
      float* dst = &patches[(gy * grid + gx) * k];
      for (int64_t c = 0; c < 3; ++c) {
        for (int64_t y = 0; y < p; ++y) {
          const float* src = &chw[(c * side + gy * p + y) * side + gx * p];
          std::copy(src, src + p, dst + (c * p + y) * p);
        }
      }
    }
  }
  std::vector<float> x(tokens * d);
  RunLinear(patch_embedding_, patches.data(), num_patches, x.data() + d);
  std::copy(class_embedding_.begin(), class_embedding_.end(), x.begin());
  for (int64_t i = 0; i < tokens * d; ++i) x[i] += position_embedding_[i];
  RunLayerNorm(pre_layernorm_, x.data(), tokens);

  const int heads = tower_.num_heads;
  const int64_t head_dim = d / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t inter = tower_.intermediate_size;
  std::vector<float> h(tokens * d), q(tokens * d), kk(tokens * d), v(tokens * d), attn(tokens * d),
      mlp(tokens * inter);
  for (const Layer& layer : layers_) {
    std::copy(x.begin(), x.end(), h.begin());
    RunLayerNorm(layer.norm1, h.data(), tokens);
    RunLinear(layer.q, h.data(), tokens, q.data());
    RunLinear(layer.k, h.data(), tokens, kk.data());
    RunLinear(layer.v, h.data(), tokens, v.data());
    // Bidirectional attention, one task per (head, query row).
    pool_->ParallelFor(heads * tokens, 4, [&](int64_t begin, int64_t end) {
      std::vector<float> scores(tokens);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t head = task / tokens;
        const int64_t row = task % tokens;
        const float* qr = &q[row * d + head * head_dim];
        float max_score = -INFINITY;
        for (int64_t j = 0; j < tokens; ++j) {
          const float* kr = &kk[j * d + head * head_dim];
          float dot = 0;
          for (int64_t e = 0; e < head_dim; ++e) dot += qr[e] * kr[e];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float total = 0;
        for (int64_t j = 0; j < tokens; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          total += scores[j];
        }
        float* out = &attn[row * d + head * head_dim];
        std::fill(out, out + head_dim, 0.0f);
        for (int64_t j = 0; j < tokens; ++j) {
          const float w = scores[j] / total;
          const float* vr = &v[j * d + head * head_dim];
          for (int64_t e = 0; e < head_dim; ++e) out[e] += w * vr[e];
        }
      }
    });
    RunLinear(layer.o, attn.data(), tokens, h.data());
    for (int64_t i = 0; i < tokens * d; ++i) x[i] += h[i];

    std::copy(x.begin(), x.end(), h.begin());
    RunLayerNorm(layer.norm2, h.data(), tokens);
    RunLinear(layer.fc1, h.data(), tokens, mlp.data());
    RunActivation(tower_.hidden_act, mlp.data(), tokens * inter);
    RunLinear(layer.fc2, mlp.data(), tokens, h.data());
    for (int64_t i = 0; i < tokens * d; ++i) x[i] += h[i];
  }
  if (drop_cls_) x.erase(x.begin(), x.begin() + d);
  return x;
}

std::vector<float> VisionEncoder::ProjectLocked(const std::vector<float>& features) const {
  const int64_t rows = num_image_tokens_;
  std::vector<float> hidden(rows * output_hidden_size_);
  RunLinear(projector_1_, features.data(), rows, hidden.data());
  RunActivation("gelu", hidden.data(), static_cast<int64_t>(hidden.size()));
  std::vector<float> out(rows * output_hidden_size_);
  RunLinear(projector_2_, hidden.data(), rows, out.data());
  return out;
}

absl::StatusOr<std::vector<float>> VisionEncoder::Features(const std::vector<float>& chw) const {
  DI_RETURN_IF_ERROR(CheckPixels(chw));
  absl::MutexLock lock(&mu_);
  return FeaturesLocked(chw);
}

absl::StatusOr<std::vector<float>> VisionEncoder::EncodePixels(
    const std::vector<float>& chw) const {
  DI_RETURN_IF_ERROR(CheckPixels(chw));
  absl::MutexLock lock(&mu_);
  return ProjectLocked(FeaturesLocked(chw));
}

absl::StatusOr<std::vector<float>> VisionEncoder::EncodeImage(absl::string_view image_bytes) const {
  DI_ASSIGN_OR_RETURN(RgbImage image, DecodeImage(image_bytes, options_.limits));
  const auto [height, width] = PreprocessedSize(image.width, image.height, processor_);
  if (height != tower_.image_size || width != tower_.image_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image of ", image.width, "x", image.height, " preprocesses to ", width, "x", height,
        " pixels, but the vision tower takes ", tower_.image_size, "x", tower_.image_size));
  }
  return EncodePixels(Preprocess(image, processor_));
}

}  // namespace deepinfer::engine::vision
