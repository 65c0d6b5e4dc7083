// A model's architecture as config.json describes it, checked and normalised once so the rest of
// the engine never reads JSON. Families: Llama (incl. Llama-3 RoPE scaling), Qwen2, Qwen3 (q/k
// norm), Mistral / any sliding-window or per-layer `layer_types` config, Mixtral, Qwen2-MoE and
// Qwen3-MoE. Multimodal LLaVA-style configs ("*ForConditionalGeneration" with a `text_config`,
// e.g. model_type "llava") describe their language model in `text_config`; the vision tower is
// not part of this config (engine/vision reads it).
#ifndef DEEPINFER_ENGINE_MODEL_CONFIG_H_
#define DEEPINFER_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace deepinfer::engine {

enum class ModelFamily { kLlama, kQwen2, kQwen3, kMistral, kMixtral, kQwen2Moe, kQwen3Moe };

const char* ModelFamilyName(ModelFamily f);

enum class RopeType { kDefault, kLinear, kLlama3 };

struct RopeConfig {
  double theta = 10000.0;
  RopeType type = RopeType::kDefault;
  double factor = 1.0;
  // Llama-3 scaling.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

enum class AttentionKind { kFull, kSliding };

struct MoeConfig {
  int num_experts = 0;          // 0: dense model
  int experts_per_token = 0;    // top-k
  int expert_intermediate_size = 0;
  bool normalize_top_k = true;  // renormalise the top-k routing weights to sum to 1
  // Qwen2-MoE: one always-on shared expert, scaled by sigmoid(shared_expert_gate(x)).
  int shared_expert_intermediate_size = 0;
  // Layers whose MLP is dense instead of MoE (Qwen-MoE mlp_only_layers / decoder_sparse_step).
  std::vector<bool> dense_layer;
};

struct ModelConfig {
  // config "architectures"[0] (the outer one, e.g. "LlavaForConditionalGeneration", for a
  // multimodal config; `family` is then its language model's).
  std::string architecture;
  ModelFamily family = ModelFamily::kLlama;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int64_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry biases (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k before RoPE (Qwen3)
  int sliding_window = 0;       // tokens; 0 = none
  std::vector<AttentionKind> layer_attention;  // one per layer
  MoeConfig moe;
  // "bfloat16", "float16", "float32": the dtype the checkpoint is meant to run in.
  std::string torch_dtype = "float32";
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  // The placeholder token whose input embeddings a prompt's image embeddings replace (config
  // image_token_index / image_token_id of a multimodal config, in [0, vocab_size)); -1 when the
  // model takes no images.
  int image_token_id = -1;

  bool is_moe() const { return moe.num_experts > 0; }
  bool HasSlidingLayers() const;
};

// Parses and validates config.json. A multimodal config (one with a `text_config` object) is
// parsed from its text_config, with dtype, eos/bos ids and tie_word_embeddings inherited from the
// outer config when text_config lacks them and the architecture taken from text_config's
// "architectures" or "model_type" (llama, qwen2, qwen3, mistral, mixtral, qwen2_moe, qwen3_moe);
// its errors are labelled "<file>: text_config: ...". `file_name` labels errors: every field out of range gives
// kInvalidArgument "<file>: <field>: expected ..., got ...". An architecture the engine does not
// implement gives kInvalidArgument naming it and the supported ones.
absl::StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& config,
                                             absl::string_view file_name);

// Reads <dir>/config.json (and eos/bos ids from generation_config.json when present).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_MODEL_CONFIG_H_
