// The transformer forward pass on the CPU over a ragged batch with a paged KV cache.
//
// A batch holds several sequences; each contributes some new tokens (a prefill chunk, or one
// decode token, or several speculative tokens) at positions [start_position, start_position + n)
// and a block table covering every position up to the last new one. The pass writes the new
// tokens' K/V into their blocks and returns logits for the last new token of each sequence (or
// for every new token when asked).
//
// Numerics: weights stay in their stored precision and are widened on the fly (by the best CPU
// kernels for this machine, see kernels/cpu_features.h); accumulation is f32; activations are
// rounded to the model's dtype (config torch_dtype) at the same points as Hugging Face
// transformers' eager implementation, so f32 checkpoints match it to ~1e-5 and bf16 checkpoints to
// bf16 rounding noise.
//
// Checkpoints: the language model's tensors under "model." + "lm_head." (causal LMs),
// "model.language_model." + "lm_head." (transformers 5 multimodal checkpoints) or
// "language_model.model." + "language_model.lm_head." (older LLaVA-style checkpoints); other
// tensors (a vision tower, a projector) are ignored.
//
// Thread-safety: Forward() may be called by one thread at a time (it uses the model's pool);
// the model is otherwise immutable. Not copyable or movable (owns the checkpoint mapping).
#ifndef DEEPINFER_ENGINE_MODEL_H_
#define DEEPINFER_ENGINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "kernels/dtype.h"
#include "kernels/linear_cpu.h"
#include "kernels/thread_pool.h"

namespace deepinfer::engine {

struct ModelOptions {
  // Threads for the forward pass; <= 0: all cores.
  int num_threads = 0;
};

struct SequenceInput {
  const int32_t* tokens = nullptr;  // new tokens
  int64_t num_tokens = 0;           // >= 1
  int64_t start_position = 0;       // tokens of this sequence already in the KV cache
  const int32_t* block_table = nullptr;
  int64_t num_blocks = 0;   // entries in block_table; must cover start_position + num_tokens
  bool all_logits = false;  // logits for every new token instead of only the last
  // Optional input-embedding overrides (multimodal prompts): null, or num_tokens entries where
  // entry t is null (new token t is embedded from embed_tokens as usual) or points at
  // hidden_size floats used as its input embedding instead (e.g. an image's projected
  // embedding for a placeholder token). They are rounded to the activation dtype like looked-up
  // embeddings. tokens[t] is still validated. Not owned; read during Forward only.
  const float* const* embedding_override = nullptr;
};

// The rows of a validated ragged batch: sequence s's new tokens are rows [offsets[s],
// offsets[s] + num_tokens) of the activations; `logit_rows` rows of logits come back.
struct BatchLayout {
  std::vector<int64_t> offsets;
  int64_t total_tokens = 0;
  int64_t logit_rows = 0;
};

// Checks a batch against a model and a cache geometry as Model::Forward does (every backend
// calls it): kInvalidArgument naming the sequence and field for non-positive token counts,
// negative start positions, block tables too short or naming blocks outside the cache (blocks
// before the window of an all-sliding model may be -1), token ids outside the vocabulary.
absl::StatusOr<BatchLayout> ValidateBatch(const ModelConfig& config, const KvCacheConfig& kv,
                                          bool all_layers_sliding,
                                          const std::vector<SequenceInput>& batch);

class Model {
 public:
  // Loads config.json + safetensors from a Hugging Face model directory. Errors name the file
  // and the problem (missing/mis-shaped tensor, unsupported dtype, bad config).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const ModelOptions& options = {});

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  const ModelConfig& config() const { return config_; }
  // The activation dtype (bf16, f16 or f32) and the KV-cache dtype this model wants.
  kernels::DType activation_dtype() const { return act_dtype_; }

  // True when every layer attends through a sliding window: KV older than the window is never
  // read again, so its blocks can be released (block tables may then hold -1 before the window).
  bool all_layers_sliding() const { return all_sliding_; }

  // A cache geometry for this model.
  KvCacheConfig MakeKvCacheConfig(int num_blocks, int block_size) const;

  // Runs the batch. `logits` is resized to rows x vocab_size, rows in batch order (one per
  // sequence, or num_tokens for sequences with all_logits). kInvalidArgument (naming the
  // sequence and field) for token ids out of range, block tables too short or naming blocks
  // outside the cache, or a cache of another geometry.
  //
  // `on_layer_kv` (may be empty) is called with layer index L, in layer order, as soon as layer
  // L's K/V of every new token of the batch is stored in `cache` (before layer L's attention and
  // everything after it run), so a caller can start moving that layer's KV while the rest of the
  // pass computes. It runs on the thread calling Forward, must not block, and must not touch the
  // model; it is not called when the batch fails validation.
  absl::Status Forward(const std::vector<SequenceInput>& batch, KvCache* cache,
                       std::vector<float>* logits,
                       const std::function<void(int layer)>& on_layer_kv = nullptr);

  // The parsed checkpoint, for other backends (engine/cuda/cuda_model.h uploads it). Tensors
  // point into the checkpoint's mapping, in their stored dtype; norms are widened to f32.
  struct Linear {
    const void* w = nullptr;
    const void* b = nullptr;
    kernels::DType dtype = kernels::DType::kF32;
    int64_t out = 0;
    int64_t in = 0;
  };
  struct Mlp {
    Linear gate, up, down;
  };
  struct Layer {
    std::vector<float> input_norm, post_norm, q_norm, k_norm;
    Linear q, k, v, o;
    Mlp mlp;                    // dense layers
    Linear router;              // MoE: [experts, hidden]
    std::vector<Mlp> experts;   // MoE
    Mlp shared_expert;          // Qwen2-MoE
    Linear shared_expert_gate;  // Qwen2-MoE: [1, hidden]
    bool moe = false;
    bool sliding = false;
  };
  const Linear& embed() const { return embed_; }
  const Linear& lm_head() const { return lm_head_; }  // embed() when tied
  const std::vector<float>& final_norm() const { return final_norm_; }
  const std::vector<Layer>& layers() const { return layers_; }
  // RoPE inverse frequencies (head_dim / 2, f32, scaling applied).
  const std::vector<float>& rope_inv_freq() const { return inv_freq_; }

 private:
  Model(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint, int num_threads);
  absl::Status Init();
  absl::StatusOr<Linear> GetLinear(const std::string& name, int64_t out, int64_t in,
                                   bool bias) const;
  absl::StatusOr<std::vector<float>> GetNorm(const std::string& name, int64_t size) const;
  // Kernel parameters for y[m, out] = x[m, in] · l^T, rounded to the activation dtype.
  kernels::LinearParams LinearFor(const Linear& l, const float* x, int64_t m, float* y) const;
  void RunLinear(const Linear& l, const float* x, int64_t m, float* y) const;
  void RunMlp(const Mlp& mlp, const float* x, int64_t m, int64_t inter, float* out,
              std::vector<float>* scratch) const;
  void RunMoe(const Layer& layer, const float* x, int64_t m, float* out) const;
  void RmsNorm(const std::vector<float>& w, const float* x, int64_t rows, int64_t width,
               float* y) const;
  // y = RmsNorm(x := round(x + branch)), also updating x (the fused residual add).
  void AddRmsNorm(const std::vector<float>& w, const float* branch, float* x, int64_t rows,
                  int64_t width, float* y) const;
  // Grows the cos/sin tables to cover positions [0, positions).
  void EnsureRopeTable(int64_t positions);

  const ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  // Where the language model's tensors are: "model." / "lm_head" for causal LMs (see Load).
  std::string body_prefix_ = "model.";
  std::string lm_head_name_ = "lm_head";
  std::unique_ptr<kernels::ThreadPool> pool_;
  kernels::DType act_dtype_ = kernels::DType::kF32;
  Linear embed_;
  Linear lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // RoPE, head_dim / 2
  bool all_sliding_ = false;
  // cos/sin of position * inv_freq, rounded to the activation dtype: [position][head_dim / 2].
  // Grown by Forward (which runs on one thread at a time).
  std::vector<float> rope_cos_, rope_sin_;
  int64_t rope_positions_ = 0;
  // Activation buffers reused across Forward calls (grown, never shrunk).
  struct Workspace {
    std::vector<float> x, normed, q, k, v, attn, tmp, mlp, selected;
    std::vector<int64_t> positions, offsets, kv_slots;
  };
  Workspace ws_;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_MODEL_H_
