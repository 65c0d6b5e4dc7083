// The transformer forward pass on one NVIDIA GPU, with the contract of engine/model.h's Model
// (a ragged batch of sequences, each with new tokens at [start_position, start_position + n) and
// a block table; the new tokens' K/V are written into their paged blocks; logits for the last new
// token of each sequence, or for every new token when asked), so the engine can run either.
//
// Built from a loaded host Model (the parsed checkpoint, engine/model.h): every weight is copied
// to device memory once, converted to the model's activation dtype (bf16, f16 or f32; exact for
// checkpoints stored in it), and the KV pools (KvCacheConfig geometry, the host cache's layout:
// per layer a K and a V pool of num_blocks blocks of block_size x num_kv_heads x head_dim) are
// allocated on the device next to them. The host model is not needed afterwards.
//
// A step: one upload of the batch's ids, positions and block tables; per layer RMSNorm (fused
// with the residual add), Q/K/V projections (cuBLASLt, kernels/cuda/linear_cuda.h), optional
// Q/K norms, RoPE, the KV write, paged attention (the split-K decode kernel when every sequence
// brings one token, the tiled prefill kernel otherwise), the output projection, SwiGLU MLP; the
// final norm over the rows that want logits, the LM head, one download. Activations stay in the
// activation dtype on the device, the points where the CPU model rounds to it, so logits agree
// with the CPU model's up to summation order (engine/cuda/cuda_model_test.cc states the
// tolerances).
//
// Mixture-of-experts layers (Mixtral, Qwen-MoE with its shared expert) route on the device,
// group the assignments by expert on the host (one small download per layer) and run each
// expert's MLP over its gathered rows (kernels/cuda/moe_cuda.h).
//
// Not supported (Create says so, naming the reason): head_dim not a multiple of 32 in [32, 256]
// or more than 16 query heads per KV head (the attention kernels' limits), more than 512 experts
// or 32 per token.
//
// Thread-safety: Forward() may be called by one thread at a time (it owns the scratch buffers
// and the stream's order); everything else is immutable after Create. Neither copyable nor
// movable.
#ifndef DEEPINFER_ENGINE_CUDA_CUDA_MODEL_H_
#define DEEPINFER_ENGINE_CUDA_CUDA_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "kernels/cuda/device.h"
#include "kernels/dtype.h"

namespace deepinfer::engine {

struct CudaModelOptions {
  int num_blocks = 0;   // KV blocks on the device, > 0
  int block_size = 16;  // tokens per block, > 0
  // Decode steps (every sequence brings one token, no logits beyond the last, no embedding
  // overrides, no MoE layers) of up to graph_max_batch sequences whose block tables have at most
  // graph_max_blocks_per_seq entries run as CUDA graphs: one per power-of-two batch bucket,
  // captured on first use and replayed (padding sequences compute nothing that is kept). The
  // decode attention's grid is sized for graph_max_blocks_per_seq x block_size keys. 0: never.
  int graph_max_batch = 0;
  int graph_max_blocks_per_seq = 0;  // > 0 when graph_max_batch > 0
};

class CudaModel {
 public:
  // kUnavailable without a usable device or without cuBLASLt (the reason); kUnimplemented for what the
  // CUDA path cannot run yet (see above); kInvalidArgument for bad options; kResourceExhausted
  // when device memory runs out (naming what was being allocated).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const Model& host,
                                                           const CudaModelOptions& options);
  // A model of `config`'s shapes with synthetic weights made on the device (norms 1, the rest
  // uniform in +-0.02, a function of `seed`): for benchmarks of checkpoints nobody has on disk
  // (engine/cuda/cuda_model_bench.cc: Llama-3-8B shapes). Errors as Create.
  static absl::StatusOr<std::unique_ptr<CudaModel>> CreateRandom(const ModelConfig& config,
                                                                 const CudaModelOptions& options,
                                                                 uint64_t seed);

  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;
  ~CudaModel();

  const ModelConfig& config() const { return config_; }
  kernels::DType activation_dtype() const { return dtype_; }
  const KvCacheConfig& kv_config() const { return kv_; }
  bool all_layers_sliding() const { return all_sliding_; }
  size_t weight_bytes() const { return weight_bytes_; }
  size_t kv_bytes() const { return kv_bytes_; }
  // Steps replayed from a captured graph, and graphs captured (for tests and logs).
  int64_t graph_steps() const { return graph_steps_; }
  int graphs_captured() const { return static_cast<int>(graphs_.size()); }

  // As Model::Forward, with the cache on the device: `logits` is resized to rows x vocab_size
  // (f32 holding activation-dtype values). Batch errors as ValidateBatch (engine/model.h);
  // kInternal naming the op when a launch or a copy fails.
  absl::Status Forward(const std::vector<SequenceInput>& batch, std::vector<float>* logits);

  // Copies blocks of one layer's K or V pool to or from host memory (block_elements elements of
  // the activation dtype per block, in order): for tests, and for moving KV between the device
  // and host tiers.
  absl::Status ReadBlock(int layer, bool value, int block, void* dst) const;
  absl::Status WriteBlock(int layer, bool value, int block, const void* src);
  // Every layer's K and V of `blocks` (negative ids skipped) between the device pools and a host
  // cache of the same geometry (kv_config(); kInvalidArgument naming the field otherwise): one
  // copy per run of consecutive ids per pool, all queued on the model's stream, one wait.
  absl::Status UploadBlocks(const KvCache& host, absl::Span<const int32_t> blocks);
  absl::Status DownloadBlocks(absl::Span<const int32_t> blocks, KvCache* host);

 private:
  // A weight in device memory (an offset into weights_) and its shape.
  struct DeviceLinear {
    const void* w = nullptr;
    const void* b = nullptr;  // null: no bias
    int64_t out = 0;
    int64_t in = 0;
  };
  struct DeviceMlp {
    DeviceLinear gate, up, down;
  };
  struct DeviceLayer {
    const void* input_norm = nullptr;
    const void* post_norm = nullptr;
    const void* q_norm = nullptr;  // null without Q/K norms
    const void* k_norm = nullptr;
    DeviceLinear q, k, v, o;
    DeviceMlp mlp;  // dense layers
    bool sliding = false;
    // Mixture-of-experts layers: the router, the experts, Qwen2-MoE's shared expert and its gate.
    bool moe = false;
    DeviceLinear router;
    std::vector<DeviceMlp> experts;
    bool has_shared = false;
    DeviceMlp shared;
    DeviceLinear shared_gate;
  };

  // One step's shape and where its inputs and activations live on the device.
  struct StepPlan {
    int64_t total = 0;  // tokens
    int64_t rows = 0;   // logit rows
    int num_seqs = 0;
    int max_blocks = 1;
    int max_query = 1;
    int max_context = 1;
    bool all_decode = false;
    const int32_t* meta = nullptr;  // int32 metadata (LayMeta in the .cc)
    char* act = nullptr;            // activations (LayActivations)
  };
  struct Graph {
    void* exec = nullptr;  // cudaGraphExec_t
  };

  CudaModel(const ModelConfig& config, kernels::DType dtype, const KvCacheConfig& kv,
            bool all_sliding, const CudaModelOptions& options);
  // A step's activations in one device buffer at `base` (null: only sizes them): x (the
  // residual stream), normed, tmp [total, hidden]; q, attn [total, q heads x head_dim]; k, v
  // [total, kv heads x head_dim]; the dense MLP's gate and up [2 x total, intermediate];
  // selected [rows, hidden]; logits [rows, vocab].
  struct Activations {
    void *x, *normed, *tmp, *q, *attn, *k, *v, *mlp, *selected, *logits;
  };
  Activations LayActivations(char* base, int64_t total, int64_t rows, size_t* bytes) const;
  size_t ActivationBytes(int64_t total, int64_t rows) const;
  void* DeviceLogits(const StepPlan& plan) const;
  // n logits of the activation dtype (host memory) into `logits` as f32.
  void WidenLogits(const void* src, int64_t n, std::vector<float>* logits) const;
  // The batch's int32 metadata for `plan` (padded to plan.num_seqs sequences) into `meta`.
  void FillMeta(const std::vector<SequenceInput>& batch, const BatchLayout& layout,
                const StepPlan& plan, int32_t* meta) const;
  // Every kernel of a step on stream_ (also what a graph captures). `overrides` (eager steps
  // only): the batch whose embedding overrides replace rows, at `override_offsets`.
  absl::Status Enqueue(const StepPlan& plan, const std::vector<SequenceInput>* overrides,
                       const std::vector<int64_t>& override_offsets);
  absl::Status DownloadLogits(const StepPlan& plan, std::vector<float>* logits);
  absl::Status ForwardGraph(const std::vector<SequenceInput>& batch, const BatchLayout& layout,
                            std::vector<float>* logits);
  int GraphMaxBucket() const;
  // The graphs' fixed buffers (device metadata and activations, pinned host staging, the
  // attention workspace at its largest), made once before the first capture.
  absl::Status PrepareGraphs();
  // Lays out and fills every weight: from `host`, or synthetic (CreateRandom) when null.
  absl::Status Upload(const Model* host, uint64_t seed);
  void* KvPool(int layer, bool value) const;
  // UploadBlocks (to_device) and DownloadBlocks.
  absl::Status CopyBlocks(bool to_device, const KvCache& host, absl::Span<const int32_t> blocks);
  // Grows `buffer` to at least `bytes` (contents are not kept).
  static absl::Status Reserve(std::unique_ptr<kernels::DeviceBuffer>* buffer, size_t bytes,
                              const char* what);
  absl::Status Linear(const DeviceLinear& l, const void* x, int64_t m, void* y) const;
  // out[m, hidden] = down(silu(gate(x)) * up(x)); `scratch` holds 2 x m x the MLP's width.
  absl::Status Mlp(const DeviceMlp& mlp, const void* x, int64_t m, void* out, void* scratch) const;
  // A mixture-of-experts block over `total` rows of `normed` into `out` (engine/model.cc RunMoe's
  // numerics): routing on the device, the assignments grouped by expert on the host (one small
  // download), each expert's MLP over its gathered rows, the weighted combine on the device.
  absl::Status Moe(const DeviceLayer& L, const void* normed, int64_t total, void* out, int layer);

  const ModelConfig config_;
  const kernels::DType dtype_;
  const KvCacheConfig kv_;
  const bool all_sliding_;
  int64_t block_elements_ = 0;
  size_t weight_bytes_ = 0;
  size_t kv_bytes_ = 0;

  std::unique_ptr<kernels::DeviceBuffer> weights_;  // every weight, 256-byte aligned
  std::unique_ptr<kernels::DeviceBuffer> kv_pools_;
  std::unique_ptr<kernels::DeviceBuffer> inv_freq_;  // f32 [head_dim / 2]
  std::unique_ptr<kernels::DeviceBuffer> linear_workspace_;
  DeviceLinear embed_, lm_head_;
  const void* final_norm_ = nullptr;
  std::vector<DeviceLayer> layers_;

  // Per-step scratch, grown as batches need (never shrunk).
  std::unique_ptr<kernels::DeviceBuffer> meta_;         // int32 ids, positions, tables, ...
  std::unique_ptr<kernels::DeviceBuffer> activations_;  // x, normed, q, k, v, attn, tmp, mlp
  std::unique_ptr<kernels::DeviceBuffer> attention_workspace_;
  std::unique_ptr<kernels::DeviceBuffer> moe_scratch_;  // MoE layers' buffers
  std::unique_ptr<kernels::DeviceBuffer> moe_meta_;     // their routing tables
  std::vector<int32_t> host_meta_;
  std::vector<uint8_t> host_logits_bytes_;

  const CudaModelOptions options_;
  bool has_moe_ = false;
  void* stream_ = nullptr;       // cudaStream_t: every launch and copy of the model
  std::map<int, Graph> graphs_;  // by batch bucket
  std::unique_ptr<kernels::DeviceBuffer> graph_meta_;
  std::unique_ptr<kernels::DeviceBuffer> graph_activations_;
  int32_t* graph_host_meta_ = nullptr;  // pinned
  void* graph_host_logits_ = nullptr;   // pinned
  int64_t graph_steps_ = 0;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_CUDA_CUDA_MODEL_H_
