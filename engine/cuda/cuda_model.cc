#include "engine/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/forward_backend.h"
#include "kernels/cuda/decode_attention_cuda.h"
#include "kernels/cuda/embedding_cuda.h"
#include "kernels/cuda/kv_write_cuda.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/cuda/moe_cuda.h"
#include "kernels/cuda/prefill_attention_cuda.h"
#include "kernels/cuda/rmsnorm_cuda.h"
#include "kernels/cuda/rope_cuda.h"
#include "kernels/cuda/swiglu_cuda.h"
#include "kernels/rope.h"

namespace deepinfer::engine {
namespace {

using kernels::DType;
using kernels::DTypeSize;
namespace cuda_raw = kernels::cuda_raw;

constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Host bytes of `count` values of `from` (at `src`), converted to `to`.
std::vector<uint8_t> Convert(const void* src, DType from, int64_t count, DType to) {
  std::vector<uint8_t> out(static_cast<size_t>(count) * DTypeSize(to));
  if (from == to) {
    std::memcpy(out.data(), src, out.size());
    return out;
  }
  for (int64_t i = 0; i < count; ++i) {
    kernels::StoreFromF32(out.data(), to, i, kernels::LoadAsF32(src, from, i));
  }
  return out;
}

absl::Status Check(int cuda_error, const std::string& what) {
  return kernels::CudaStatus(cuda_error, what);
}

// Adds the op's name to a launch error, so a failure says where in the forward pass it was.
absl::Status Op(absl::Status s, const char* op, int layer) {
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("cuda forward: ", op,
                             layer >= 0 ? absl::StrCat(" (layer ", layer, ")") : std::string(),
                             ": ", s.message()));
}

}  // namespace

CudaModel::CudaModel(const ModelConfig& config, DType dtype, const KvCacheConfig& kv,
                     bool all_sliding, const CudaModelOptions& options)
    : config_(config), dtype_(dtype), kv_(kv), all_sliding_(all_sliding), options_(options) {
  block_elements_ = static_cast<int64_t>(kv.block_size) * kv.num_kv_heads * kv.head_dim;
}

CudaModel::~CudaModel() {
  // Errors here have nowhere to go: the process is tearing the model down.
  if (stream_ != nullptr) (void)cuda_raw::StreamSynchronize(stream_);
  for (auto& [bucket, graph] : graphs_) {
    if (graph.exec != nullptr) (void)cuda_raw::GraphExecDestroy(graph.exec);
  }
  if (graph_host_meta_ != nullptr) (void)cuda_raw::HostFree(graph_host_meta_);
  if (graph_host_logits_ != nullptr) (void)cuda_raw::HostFree(graph_host_logits_);
  if (stream_ != nullptr) (void)cuda_raw::StreamDestroy(stream_);
}

namespace {

// What the CUDA path can run, as Create and CreateRandom check it.
absl::Status CheckSupported(const ModelConfig& c, const CudaModelOptions& options, bool any_moe) {
  if (options.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda model: num_blocks must be > 0, got ", options.num_blocks));
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda model: block_size must be > 0, got ", options.block_size));
  }
  if (options.graph_max_batch < 0 ||
      (options.graph_max_batch > 0 && options.graph_max_blocks_per_seq <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda model: graph_max_batch must be >= 0 (got ", options.graph_max_batch,
                     ") and, when > 0, graph_max_blocks_per_seq > 0 (got ",
                     options.graph_max_blocks_per_seq, ")"));
  }
  if (c.head_dim % 32 != 0 || c.head_dim < 32 || c.head_dim > kernels::kDecodeAttentionMaxHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("cuda model: head_dim ", c.head_dim,
                     " is not supported by the CUDA attention kernels (a multiple of 32 in [32, ",
                     kernels::kDecodeAttentionMaxHeadDim, "]); run it with --device=cpu"));
  }
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0 ||
      c.num_heads / c.num_kv_heads > kernels::kDecodeAttentionMaxGroup) {
    return absl::UnimplementedError(absl::StrCat(
        "cuda model: ", c.num_heads, " query heads over ", c.num_kv_heads,
        " KV heads: the CUDA decode attention takes at most ", kernels::kDecodeAttentionMaxGroup,
        " query heads per KV head; run it with --device=cpu"));
  }
  if (any_moe && (c.moe.num_experts > kernels::kMoeMaxExperts ||
                  c.moe.experts_per_token > kernels::kMoeMaxTopK ||
                  c.moe.experts_per_token > c.moe.num_experts)) {
    return absl::UnimplementedError(absl::StrCat(
        "cuda model: ", c.moe.num_experts, " experts, ", c.moe.experts_per_token,
        " per token: the CUDA routing takes at most ", kernels::kMoeMaxExperts, " experts and ",
        kernels::kMoeMaxTopK, " per token; run it with --device=cpu"));
  }
  if (absl::Status device = kernels::CudaAvailable(); !device.ok()) return device;
  return kernels::CublasLtAvailable();
}

DType ActivationDType(const ModelConfig& c) {
  if (c.torch_dtype == "bfloat16") return DType::kBF16;
  if (c.torch_dtype == "float16") return DType::kF16;
  return DType::kF32;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const Model& host,
                                                             const CudaModelOptions& options) {
  bool any_moe = false;
  for (const Model::Layer& L : host.layers()) any_moe = any_moe || L.moe;
  DI_RETURN_IF_ERROR(CheckSupported(host.config(), options, any_moe));
  const KvCacheConfig kv = host.MakeKvCacheConfig(options.num_blocks, options.block_size);
  std::unique_ptr<CudaModel> model(new CudaModel(host.config(), host.activation_dtype(), kv,
                                                 host.all_layers_sliding(), options));
  DI_RETURN_IF_ERROR(model->Upload(&host, 0));
  return model;
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::CreateRandom(const ModelConfig& config,
                                                                   const CudaModelOptions& options,
                                                                   uint64_t seed) {
  DI_RETURN_IF_ERROR(CheckSupported(config, options, config.is_moe()));
  KvCacheConfig kv;
  kv.num_layers = config.num_layers;
  kv.num_kv_heads = config.num_kv_heads;
  kv.head_dim = config.head_dim;
  kv.block_size = options.block_size;
  kv.num_blocks = options.num_blocks;
  kv.dtype = ActivationDType(config);
  bool all_sliding = config.sliding_window > 0;
  for (AttentionKind k : config.layer_attention) {
    all_sliding = all_sliding && k == AttentionKind::kSliding;
  }
  std::unique_ptr<CudaModel> model(new CudaModel(config, kv.dtype, kv, all_sliding, options));
  DI_RETURN_IF_ERROR(model->Upload(nullptr, seed));
  return model;
}

absl::Status CudaModel::Reserve(std::unique_ptr<kernels::DeviceBuffer>* buffer, size_t bytes,
                                const char* what) {
  if (*buffer != nullptr && (*buffer)->size() >= bytes) return absl::OkStatus();
  buffer->reset();
  absl::StatusOr<std::unique_ptr<kernels::DeviceBuffer>> b =
      kernels::DeviceBuffer::Allocate(std::max<size_t>(bytes, kAlign));
  if (!b.ok()) {
    return absl::Status(
        b.status().code() == absl::StatusCode::kUnavailable ? absl::StatusCode::kUnavailable
                                                            : absl::StatusCode::kResourceExhausted,
        absl::StrCat("cuda model: ", what, " (", bytes, " bytes): ", b.status().message()));
  }
  *buffer = *std::move(b);
  return absl::OkStatus();
}

absl::Status CudaModel::Upload(const Model* host, uint64_t seed) {
  const ModelConfig& c = config_;
  DI_RETURN_IF_ERROR(Check(cuda_raw::StreamCreate(&stream_), "create stream"));
  const size_t es = DTypeSize(dtype_);
  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  // Every tensor's place in one allocation, from the config's shapes; its values from the host
  // model (converted to the activation dtype) or, without one, synthetic: norms 1, the rest
  // uniform in +-0.02 (benchmarks).
  struct Pending {
    const void* src;  // null: synthetic
    DType src_dtype;
    int64_t count;
    size_t offset;
    bool norm;
  };
  std::vector<Pending> pending;
  size_t total = 0;
  auto place = [&](const void* src, DType src_dtype, int64_t count, bool norm) {
    const size_t offset = total;
    pending.push_back({src, src_dtype, count, offset, norm});
    total += AlignUp(static_cast<size_t>(count) * es);
    return offset;
  };
  struct LinearAt {
    size_t w = 0, b = 0;
    bool has_b = false;
    int64_t out = 0, in = 0;
  };
  auto place_linear = [&](const Model::Linear* l, int64_t out, int64_t in, bool bias) {
    LinearAt at;
    at.w = place(l != nullptr ? l->w : nullptr, l != nullptr ? l->dtype : dtype_, out * in, false);
    if (bias) {
      at.b = place(l != nullptr ? l->b : nullptr, l != nullptr ? l->dtype : dtype_, out, false);
      at.has_b = true;
    }
    at.out = out;
    at.in = in;
    return at;
  };
  auto place_norm = [&](const std::vector<float>* w, int64_t size) {
    return place(w != nullptr ? w->data() : nullptr, DType::kF32, size, true);
  };
  const LinearAt embed =
      place_linear(host != nullptr ? &host->embed() : nullptr, c.vocab_size, h, false);
  const bool tied = host != nullptr ? host->lm_head().w == host->embed().w : c.tie_word_embeddings;
  const LinearAt lm_head =
      tied ? embed
           : place_linear(host != nullptr ? &host->lm_head() : nullptr, c.vocab_size, h, false);
  const size_t final_norm = place_norm(host != nullptr ? &host->final_norm() : nullptr, h);
  struct MlpAt {
    LinearAt gate, up, down;
  };
  auto place_mlp = [&](const Model::Mlp* m, int64_t inter) {
    MlpAt at;
    at.gate = place_linear(m != nullptr ? &m->gate : nullptr, inter, h, false);
    at.up = place_linear(m != nullptr ? &m->up : nullptr, inter, h, false);
    at.down = place_linear(m != nullptr ? &m->down : nullptr, h, inter, false);
    return at;
  };
  struct LayerAt {
    size_t input_norm, post_norm, q_norm = 0, k_norm = 0;
    LinearAt q, k, v, o;
    MlpAt mlp;
    bool moe = false;
    LinearAt router;
    std::vector<MlpAt> experts;
    bool has_shared = false;
    MlpAt shared;
    LinearAt shared_gate;
  };
  std::vector<LayerAt> layer_at;
  for (int i = 0; i < c.num_layers; ++i) {
    const Model::Layer* L = host != nullptr ? &host->layers()[i] : nullptr;
    LayerAt at;
    at.input_norm = place_norm(L != nullptr ? &L->input_norm : nullptr, h);
    at.post_norm = place_norm(L != nullptr ? &L->post_norm : nullptr, h);
    if (c.qk_norm) {
      at.q_norm = place_norm(L != nullptr ? &L->q_norm : nullptr, c.head_dim);
      at.k_norm = place_norm(L != nullptr ? &L->k_norm : nullptr, c.head_dim);
    }
    at.q = place_linear(L != nullptr ? &L->q : nullptr, q_dim, h, c.attention_bias);
    at.k = place_linear(L != nullptr ? &L->k : nullptr, kv_dim, h, c.attention_bias);
    at.v = place_linear(L != nullptr ? &L->v : nullptr, kv_dim, h, c.attention_bias);
    at.o = place_linear(L != nullptr ? &L->o : nullptr, h, q_dim, false);
    at.moe = L != nullptr ? L->moe
                          : c.is_moe() && !(static_cast<size_t>(i) < c.moe.dense_layer.size() &&
                                            c.moe.dense_layer[i]);
    if (!at.moe) {
      at.mlp = place_mlp(L != nullptr ? &L->mlp : nullptr, c.intermediate_size);
    } else {
      const int64_t experts = c.moe.num_experts;
      at.router = place_linear(L != nullptr ? &L->router : nullptr, experts, h, false);
      for (int64_t e = 0; e < experts; ++e) {
        at.experts.push_back(
            place_mlp(L != nullptr ? &L->experts[e] : nullptr, c.moe.expert_intermediate_size));
      }
      at.has_shared = c.moe.shared_expert_intermediate_size > 0;
      if (at.has_shared) {
        at.shared = place_mlp(L != nullptr ? &L->shared_expert : nullptr,
                              c.moe.shared_expert_intermediate_size);
        at.shared_gate = place_linear(L != nullptr ? &L->shared_expert_gate : nullptr, 1, h, false);
      }
    }
    has_moe_ = has_moe_ || at.moe;
    layer_at.push_back(at);
  }
  DI_RETURN_IF_ERROR(Reserve(&weights_, total, "weights"));
  weight_bytes_ = total;
  char* base = static_cast<char*>(weights_->data());
  uint64_t stream_id = 0;
  for (const Pending& p : pending) {
    ++stream_id;
    if (p.src != nullptr) {
      const std::vector<uint8_t> bytes = Convert(p.src, p.src_dtype, p.count, dtype_);
      DI_RETURN_IF_ERROR(
          Check(cuda_raw::MemcpyHostToDevice(base + p.offset, bytes.data(), bytes.size()),
                "upload weights"));
    } else {
      const float lo = p.norm ? 1.0f : -0.02f;
      const float hi = p.norm ? 1.0f : 0.02f;
      DI_RETURN_IF_ERROR(
          Check(cuda_raw::LaunchFillUniform(base + p.offset, dtype_, p.count,
                                            seed * 0x100000001B3ull + stream_id, lo, hi, nullptr),
                "fill synthetic weights"));
    }
  }
  auto linear = [&](const LinearAt& at) {
    DeviceLinear l;
    l.w = base + at.w;
    l.b = at.has_b ? base + at.b : nullptr;
    l.out = at.out;
    l.in = at.in;
    return l;
  };
  embed_ = linear(embed);
  lm_head_ = linear(lm_head);
  final_norm_ = base + final_norm;
  layers_.clear();
  for (int i = 0; i < c.num_layers; ++i) {
    const LayerAt& at = layer_at[i];
    DeviceLayer L;
    L.input_norm = base + at.input_norm;
    L.post_norm = base + at.post_norm;
    if (c.qk_norm) {
      L.q_norm = base + at.q_norm;
      L.k_norm = base + at.k_norm;
    }
    L.q = linear(at.q);
    L.k = linear(at.k);
    L.v = linear(at.v);
    L.o = linear(at.o);
    auto mlp = [&](const MlpAt& m) {
      DeviceMlp d;
      d.gate = linear(m.gate);
      d.up = linear(m.up);
      d.down = linear(m.down);
      return d;
    };
    L.moe = at.moe;
    if (!at.moe) {
      L.mlp = mlp(at.mlp);
    } else {
      L.router = linear(at.router);
      for (const MlpAt& e : at.experts) L.experts.push_back(mlp(e));
      L.has_shared = at.has_shared;
      if (at.has_shared) {
        L.shared = mlp(at.shared);
        L.shared_gate = linear(at.shared_gate);
      }
    }
    L.sliding = c.layer_attention.size() > static_cast<size_t>(i) &&
                c.layer_attention[i] == AttentionKind::kSliding;
    layers_.push_back(L);
  }
  // RoPE frequencies (the host model's, or from the config's scaling), the KV pools (zeroed),
  // cuBLASLt's workspace.
  std::vector<float> inv(c.head_dim / 2);
  if (host != nullptr) {
    inv = host->rope_inv_freq();
  } else {
    kernels::RopeScaling scaling;
    scaling.theta = c.rope.theta;
    scaling.type = c.rope.type == RopeType::kLinear   ? kernels::RopeScalingType::kLinear
                   : c.rope.type == RopeType::kLlama3 ? kernels::RopeScalingType::kLlama3
                                                      : kernels::RopeScalingType::kDefault;
    scaling.factor = c.rope.factor;
    scaling.low_freq_factor = c.rope.low_freq_factor;
    scaling.high_freq_factor = c.rope.high_freq_factor;
    scaling.original_max_position_embeddings = c.rope.original_max_position_embeddings;
    kernels::RopeInvFreq(scaling, c.head_dim, inv.data());
  }
  DI_RETURN_IF_ERROR(Reserve(&inv_freq_, inv.size() * sizeof(float), "rope frequencies"));
  DI_RETURN_IF_ERROR(inv_freq_->CopyFromHost(inv.data(), inv.size() * sizeof(float)));
  kv_bytes_ = static_cast<size_t>(2) * c.num_layers * kv_.num_blocks * block_elements_ * es;
  DI_RETURN_IF_ERROR(Reserve(&kv_pools_, kv_bytes_, "KV pools"));
  DI_RETURN_IF_ERROR(Check(cuda_raw::Memset(kv_pools_->data(), 0, kv_bytes_), "zero KV pools"));
  DI_RETURN_IF_ERROR(
      Reserve(&linear_workspace_, kernels::kLinearCudaWorkspaceBytes, "cuBLASLt workspace"));
  return Check(cuda_raw::DeviceSynchronize(), "upload weights");
}

void* CudaModel::KvPool(int layer, bool value) const {
  const size_t pool = static_cast<size_t>(kv_.num_blocks) * block_elements_ * DTypeSize(dtype_);
  return static_cast<char*>(kv_pools_->data()) +
         (2 * static_cast<size_t>(layer) + (value ? 1 : 0)) * pool;
}

absl::Status CudaModel::ReadBlock(int layer, bool value, int block, void* dst) const {
  if (layer < 0 || layer >= config_.num_layers || block < 0 || block >= kv_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda model: block ", block, " of layer ", layer, " is outside the KV pools"));
  }
  const size_t bytes = static_cast<size_t>(block_elements_) * DTypeSize(dtype_);
  const char* src = static_cast<const char*>(KvPool(layer, value)) + block * bytes;
  DI_RETURN_IF_ERROR(Check(cuda_raw::MemcpyAsync(dst, src, bytes, 2, stream_), "read KV block"));
  return Check(cuda_raw::StreamSynchronize(stream_), "read KV block");
}

absl::Status CudaModel::WriteBlock(int layer, bool value, int block, const void* src) {
  if (layer < 0 || layer >= config_.num_layers || block < 0 || block >= kv_.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda model: block ", block, " of layer ", layer, " is outside the KV pools"));
  }
  const size_t bytes = static_cast<size_t>(block_elements_) * DTypeSize(dtype_);
  char* dst = static_cast<char*>(KvPool(layer, value)) + block * bytes;
  DI_RETURN_IF_ERROR(Check(cuda_raw::MemcpyAsync(dst, src, bytes, 1, stream_), "write KV block"));
  return Check(cuda_raw::StreamSynchronize(stream_), "write KV block");
}

absl::Status CudaModel::CopyBlocks(bool to_device, const KvCache& host,
                                   absl::Span<const int32_t> blocks) {
  // The host cache is the engine's (engine/forward_backend.h).
  DI_RETURN_IF_ERROR(CheckSameKvGeometry(kv_, host.config(), "cuda model"));
  for (int32_t b : blocks) {
    if (b >= kv_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda model: block ", b, " is outside the ", kv_.num_blocks, " KV blocks"));
    }
  }
  const size_t bytes = static_cast<size_t>(block_elements_) * DTypeSize(dtype_);
  for (int layer = 0; layer < kv_.num_layers; ++layer) {
    for (bool value : {false, true}) {
      char* dev = static_cast<char*>(KvPool(layer, value));
      char* hst = static_cast<char*>(value ? host.v_layer(layer) : host.k_layer(layer));
      for (size_t i = 0; i < blocks.size();) {
        if (blocks[i] < 0) {
          ++i;
          continue;
        }
        size_t j = i + 1;  // a run of consecutive ids is one copy
        while (j < blocks.size() && blocks[j] == blocks[j - 1] + 1) ++j;
        const size_t offset = static_cast<size_t>(blocks[i]) * bytes;
        const size_t n = (j - i) * bytes;
        DI_RETURN_IF_ERROR(Check(
            to_device ? cuda_raw::MemcpyAsync(dev + offset, hst + offset, n, 1, stream_)
                      : cuda_raw::MemcpyAsync(hst + offset, dev + offset, n, 2, stream_),
            to_device ? "upload KV blocks" : "download KV blocks"));
        i = j;
      }
    }
  }
  return Check(cuda_raw::StreamSynchronize(stream_),
               to_device ? "upload KV blocks" : "download KV blocks");
}

absl::Status CudaModel::UploadBlocks(const KvCache& host, absl::Span<const int32_t> blocks) {
  return CopyBlocks(/*to_device=*/true, host, blocks);
}

absl::Status CudaModel::DownloadBlocks(absl::Span<const int32_t> blocks, KvCache* host) {
  return CopyBlocks(/*to_device=*/false, *host, blocks);
}

absl::Status CudaModel::Linear(const DeviceLinear& l, const void* x, int64_t m, void* y) const {
  kernels::LinearCudaParams p;
  p.x = x;
  p.weight = l.w;
  p.bias = l.b;
  p.y = y;
  p.m = m;
  p.n = l.out;
  p.k = l.in;
  p.dtype = dtype_;
  p.workspace = linear_workspace_->data();
  p.workspace_bytes = linear_workspace_->size();
  return kernels::LinearCuda(p, stream_);
}

absl::Status CudaModel::Mlp(const DeviceMlp& mlp, const void* x, int64_t m, void* out,
                            void* scratch) const {
  const int64_t inter = mlp.gate.out;
  void* gate = scratch;
  void* up = static_cast<char*>(scratch) + m * inter * DTypeSize(dtype_);
  DI_RETURN_IF_ERROR(Linear(mlp.gate, x, m, gate));
  DI_RETURN_IF_ERROR(Linear(mlp.up, x, m, up));
  kernels::SwiGluParams p;
  p.gate = gate;
  p.up = up;
  p.out = gate;
  p.rows = m;
  p.width = inter;
  p.dtype = dtype_;
  DI_RETURN_IF_ERROR(kernels::SwiGluCuda(p, stream_));
  return Linear(mlp.down, gate, m, out);
}

absl::Status CudaModel::Moe(const DeviceLayer& L, const void* normed, int64_t total, void* out,
                            int layer) {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int experts = c.moe.num_experts;
  const int k = c.moe.experts_per_token;
  const int64_t assignments = total * k;
  const size_t es = DTypeSize(dtype_);
  const int64_t widest =
      std::max<int64_t>(c.moe.expert_intermediate_size, c.moe.shared_expert_intermediate_size);
  // Scratch: router logits, the gathered rows and the experts' outputs (assignments x hidden),
  // an MLP's gate and up (at most `total` rows each), the shared expert's output and gate.
  size_t offset = 0;
  auto carve = [&](size_t bytes) {
    const size_t at = offset;
    offset += AlignUp(bytes);
    return at;
  };
  const size_t a_router = carve(total * experts * es);
  const size_t a_ids = carve(assignments * sizeof(int32_t));
  const size_t a_weights = carve(assignments * sizeof(float));
  const size_t a_in = carve(assignments * h * es), a_out = carve(assignments * h * es);
  const size_t a_mlp = carve(2 * total * widest * es);
  const size_t a_shared = carve(total * h * es), a_gate = carve(total * es);
  DI_RETURN_IF_ERROR(Reserve(&moe_scratch_, offset, "moe scratch"));
  char* base = static_cast<char*>(moe_scratch_->data());
  int32_t* d_ids = reinterpret_cast<int32_t*>(base + a_ids);
  float* d_weights = reinterpret_cast<float*>(base + a_weights);
  DI_RETURN_IF_ERROR(Op(Linear(L.router, normed, total, base + a_router), "moe router", layer));
  {
    kernels::MoeRouteParams p;
    p.logits = base + a_router;
    p.expert_ids = d_ids;
    p.weights = d_weights;
    p.rows = total;
    p.num_experts = experts;
    p.top_k = k;
    p.normalize = c.moe.normalize_top_k;
    p.dtype = dtype_;
    DI_RETURN_IF_ERROR(Op(kernels::MoeRouteCuda(p, stream_), "moe route", layer));
  }
  // Group the assignments by expert (tokens in order within each, as the CPU model), and list
  // each token's rows of the grouped output in ascending expert order for the combine.
  std::vector<int32_t> ids(assignments);
  std::vector<float> weights(assignments);
  // On the model's stream (the routing kernel's; the legacy default stream would not wait for
  // it), then waited for.
  DI_RETURN_IF_ERROR(
      Check(cuda_raw::MemcpyAsync(ids.data(), d_ids, assignments * sizeof(int32_t), 2, stream_),
            "download moe routing"));
  DI_RETURN_IF_ERROR(Check(
      cuda_raw::MemcpyAsync(weights.data(), d_weights, assignments * sizeof(float), 2, stream_),
      "download moe routing"));
  DI_RETURN_IF_ERROR(Check(cuda_raw::StreamSynchronize(stream_), "moe routing"));
  std::vector<int64_t> count(experts + 1, 0);
  for (int32_t e : ids) {
    if (e < 0 || e >= experts) {
      return absl::InternalError(absl::StrCat("cuda forward: moe route (layer ", layer,
                                              "): expert id ", e, " out of range"));
    }
    ++count[e + 1];
  }
  std::vector<int64_t> first(experts + 1, 0);
  for (int e = 0; e < experts; ++e) first[e + 1] = first[e] + count[e + 1];
  // Host tables, one upload: gather rows [assignments], token rows [total, k], weights [total, k].
  std::vector<int32_t> table(assignments + 2 * assignments);
  int32_t* gather = table.data();
  int32_t* token_rows = gather + assignments;
  float* token_weights = reinterpret_cast<float*>(token_rows + assignments);
  // One pass in token order: each expert's rows come out in token order (as the CPU model
  // runs them), and each token lists its rows in ascending expert order (the combine's order).
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  std::vector<std::pair<int32_t, float>> mine(k);
  for (int64_t t = 0; t < total; ++t) {
    for (int j = 0; j < k; ++j) mine[j] = {ids[t * k + j], weights[t * k + j]};
    std::sort(mine.begin(), mine.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int j = 0; j < k; ++j) {
      const int64_t row = next[mine[j].first]++;
      gather[row] = static_cast<int32_t>(t);
      token_rows[t * k + j] = static_cast<int32_t>(row);
      token_weights[t * k + j] = mine[j].second;
    }
  }
  DI_RETURN_IF_ERROR(Reserve(&moe_meta_, table.size() * sizeof(int32_t), "moe tables"));
  DI_RETURN_IF_ERROR(Check(cuda_raw::MemcpyAsync(moe_meta_->data(), table.data(),
                                                 table.size() * sizeof(int32_t), 1, stream_),
                           "upload moe tables"));
  const int32_t* d_table = static_cast<const int32_t*>(moe_meta_->data());
  {
    kernels::EmbeddingParams p;  // gather: row i of the grouped input = normed[gather[i]]
    p.token_ids = d_table;
    p.weight = normed;
    p.out = base + a_in;
    p.num_tokens = assignments;
    p.vocab_size = total;
    p.hidden = h;
    p.weight_dtype = dtype_;
    p.out_dtype = dtype_;
    DI_RETURN_IF_ERROR(Op(kernels::EmbeddingCuda(p, stream_), "moe gather", layer));
  }
  for (int e = 0; e < experts; ++e) {
    const int64_t n = count[e + 1];
    if (n == 0) continue;
    const size_t row = static_cast<size_t>(first[e]) * h * es;
    DI_RETURN_IF_ERROR(Op(Mlp(L.experts[e], base + a_in + row, n, base + a_out + row, base + a_mlp),
                          "moe expert", layer));
  }
  {
    kernels::MoeCombineParams p;
    p.expert_out = base + a_out;
    p.token_rows = d_table + assignments;
    p.token_weights = reinterpret_cast<const float*>(d_table + 2 * assignments);
    p.out = out;
    p.rows = total;
    p.top_k = k;
    p.hidden = h;
    p.assignments = assignments;
    p.dtype = dtype_;
    DI_RETURN_IF_ERROR(Op(kernels::MoeCombineCuda(p, stream_), "moe combine", layer));
  }
  if (!L.has_shared) return absl::OkStatus();
  DI_RETURN_IF_ERROR(
      Op(Mlp(L.shared, normed, total, base + a_shared, base + a_mlp), "moe shared expert", layer));
  DI_RETURN_IF_ERROR(
      Op(Linear(L.shared_gate, normed, total, base + a_gate), "moe shared gate", layer));
  kernels::MoeSharedParams p;
  p.out = out;
  p.shared = base + a_shared;
  p.gate_logits = base + a_gate;
  p.rows = total;
  p.hidden = h;
  p.dtype = dtype_;
  return Op(kernels::MoeSharedCuda(p, stream_), "moe shared add", layer);
}

namespace {

// Offsets of the int32 metadata of a step with `total` tokens, `seqs` sequences, `max_blocks`
// block-table entries each and `rows` logit rows.
struct MetaLayout {
  int64_t ids, pos, seq, tables, qstart, start, ctx, rows, count;
};

MetaLayout LayMeta(int64_t total, int seqs, int max_blocks, int64_t rows) {
  MetaLayout m;
  m.ids = 0;
  m.pos = m.ids + total;
  m.seq = m.pos + total;
  m.tables = m.seq + total;
  m.qstart = m.tables + static_cast<int64_t>(seqs) * max_blocks;
  m.start = m.qstart + seqs + 1;
  m.ctx = m.start + seqs;
  m.rows = m.ctx + seqs;
  m.count = m.rows + rows;
  return m;
}

}  // namespace

CudaModel::Activations CudaModel::LayActivations(char* base, int64_t total, int64_t rows,
                                                 size_t* bytes) const {
  const ModelConfig& c = config_;
  const size_t es = DTypeSize(dtype_);
  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  size_t offset = 0;
  auto carve = [&](int64_t elements) {
    void* at = base == nullptr ? nullptr : base + offset;
    offset += AlignUp(static_cast<size_t>(elements) * es);
    return at;
  };
  Activations a;
  a.x = carve(total * h);
  a.normed = carve(total * h);
  a.tmp = carve(total * h);
  a.q = carve(total * q_dim);
  a.attn = carve(total * q_dim);
  a.k = carve(total * kv_dim);
  a.v = carve(total * kv_dim);
  a.mlp = carve(2 * total * c.intermediate_size);
  a.selected = carve(rows * h);
  a.logits = carve(rows * c.vocab_size);
  if (bytes != nullptr) *bytes = offset;
  return a;
}

size_t CudaModel::ActivationBytes(int64_t total, int64_t rows) const {
  size_t bytes = 0;
  LayActivations(nullptr, total, rows, &bytes);
  return bytes;
}

void* CudaModel::DeviceLogits(const StepPlan& plan) const {
  return LayActivations(plan.act, plan.total, plan.rows, nullptr).logits;
}

void CudaModel::WidenLogits(const void* src, int64_t n, std::vector<float>* logits) const {
  float* dst = logits->data();
  if (dtype_ == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const uint16_t* half = static_cast<const uint16_t*>(src);
  if (dtype_ == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::Bf16ToF32(half[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::F16ToF32(half[i]);
  }
}

void CudaModel::FillMeta(const std::vector<SequenceInput>& batch, const BatchLayout& layout,
                         const StepPlan& plan, int32_t* m) const {
  const MetaLayout o = LayMeta(plan.total, plan.num_seqs, plan.max_blocks, plan.rows);
  std::fill(m, m + o.count, -1);
  int64_t r = 0;
  const int n = static_cast<int>(batch.size());
  for (int s = 0; s < n; ++s) {
    const SequenceInput& seq = batch[s];
    const int64_t off = layout.offsets[s];
    for (int64_t t = 0; t < seq.num_tokens; ++t) {
      m[o.ids + off + t] = seq.tokens[t];
      m[o.pos + off + t] = static_cast<int32_t>(seq.start_position + t);
      m[o.seq + off + t] = s;
    }
    std::copy(seq.block_table, seq.block_table + seq.num_blocks,
              m + o.tables + static_cast<int64_t>(s) * plan.max_blocks);
    m[o.qstart + s] = static_cast<int32_t>(off);
    m[o.start + s] = static_cast<int32_t>(seq.start_position);
    m[o.ctx + s] = static_cast<int32_t>(seq.start_position + seq.num_tokens);
    const int64_t first = seq.all_logits ? 0 : seq.num_tokens - 1;
    for (int64_t t = first; t < seq.num_tokens; ++t) {
      m[o.rows + r++] = static_cast<int32_t>(off + t);
    }
  }
  // Padding sequences of a captured bucket: one token each at position -1 (RoPE and the KV
  // write skip it), no blocks, an empty context (zero attention output), its own logit row.
  for (int s = n; s < plan.num_seqs; ++s) {
    const int64_t off = layout.total_tokens + (s - n);
    m[o.ids + off] = 0;
    m[o.seq + off] = s;
    m[o.qstart + s] = static_cast<int32_t>(off);
    m[o.start + s] = 0;
    m[o.ctx + s] = 0;
    m[o.rows + r++] = static_cast<int32_t>(off);
  }
  m[o.qstart + plan.num_seqs] = static_cast<int32_t>(plan.total);
}

absl::Status CudaModel::Forward(const std::vector<SequenceInput>& batch,
                                std::vector<float>* logits) {
  const ModelConfig& c = config_;
  DI_ASSIGN_OR_RETURN(const BatchLayout layout, ValidateBatch(c, kv_, all_sliding_, batch));
  const int num_seqs = static_cast<int>(batch.size());
  logits->resize(static_cast<size_t>(layout.logit_rows) * c.vocab_size);
  if (num_seqs == 0) return absl::OkStatus();
  StepPlan plan;
  plan.total = layout.total_tokens;
  plan.rows = layout.logit_rows;
  plan.num_seqs = num_seqs;
  plan.all_decode = true;
  bool overrides = false;
  for (const SequenceInput& seq : batch) {
    plan.max_blocks = std::max(plan.max_blocks, static_cast<int>(seq.num_blocks));
    plan.max_query = std::max(plan.max_query, static_cast<int>(seq.num_tokens));
    plan.max_context =
        std::max(plan.max_context, static_cast<int>(seq.start_position + seq.num_tokens));
    plan.all_decode = plan.all_decode && seq.num_tokens == 1 && !seq.all_logits;
    overrides = overrides || seq.embedding_override != nullptr;
  }
  if (plan.all_decode && !overrides && !has_moe_ && options_.graph_max_batch > 0 &&
      num_seqs <= options_.graph_max_batch &&
      plan.max_blocks <= options_.graph_max_blocks_per_seq) {
    return ForwardGraph(batch, layout, logits);
  }
  const MetaLayout o = LayMeta(plan.total, plan.num_seqs, plan.max_blocks, plan.rows);
  host_meta_.resize(o.count);
  FillMeta(batch, layout, plan, host_meta_.data());
  DI_RETURN_IF_ERROR(Reserve(&meta_, o.count * sizeof(int32_t), "batch metadata"));
  DI_RETURN_IF_ERROR(Check(cuda_raw::MemcpyAsync(meta_->data(), host_meta_.data(),
                                                 o.count * sizeof(int32_t), 1, stream_),
                           "upload batch metadata"));
  DI_RETURN_IF_ERROR(Reserve(&activations_, ActivationBytes(plan.total, plan.rows), "activations"));
  plan.meta = static_cast<const int32_t*>(meta_->data());
  plan.act = static_cast<char*>(activations_->data());
  DI_RETURN_IF_ERROR(Enqueue(plan, &batch, layout.offsets));
  return DownloadLogits(plan, logits);
}

absl::Status CudaModel::DownloadLogits(const StepPlan& plan, std::vector<float>* logits) {
  const int64_t n = plan.rows * config_.vocab_size;
  const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype_);
  host_logits_bytes_.resize(bytes);
  void* host = host_logits_bytes_.data();
  DI_RETURN_IF_ERROR(
      Check(cuda_raw::MemcpyAsync(host, DeviceLogits(plan), bytes, 2, stream_), "download logits"));
  DI_RETURN_IF_ERROR(Check(cuda_raw::StreamSynchronize(stream_), "forward"));
  WidenLogits(host, n, logits);
  return absl::OkStatus();
}

absl::Status CudaModel::ForwardGraph(const std::vector<SequenceInput>& batch,
                                     const BatchLayout& layout, std::vector<float>* logits) {
  const int n = static_cast<int>(batch.size());
  int bucket = 1;
  while (bucket < n) bucket *= 2;
  bucket = std::min(bucket, GraphMaxBucket());
  StepPlan plan;
  plan.total = bucket;
  plan.rows = bucket;
  plan.num_seqs = bucket;
  plan.max_blocks = options_.graph_max_blocks_per_seq;
  plan.max_query = 1;
  plan.max_context = options_.graph_max_blocks_per_seq * kv_.block_size;
  plan.all_decode = true;
  const MetaLayout o = LayMeta(plan.total, plan.num_seqs, plan.max_blocks, plan.rows);
  DI_RETURN_IF_ERROR(PrepareGraphs());
  plan.meta = static_cast<const int32_t*>(graph_meta_->data());
  plan.act = static_cast<char*>(graph_activations_->data());
  Graph& g = graphs_[bucket];
  if (g.exec == nullptr) {
    // Capture on first use, after one eager run of the same step (lazy cuBLASLt set-up and
    // algorithm choices happen outside the capture; so does every allocation).
    FillMeta(batch, layout, plan, graph_host_meta_);
    DI_RETURN_IF_ERROR(Check(cuda_raw::MemcpyAsync(graph_meta_->data(), graph_host_meta_,
                                                   o.count * sizeof(int32_t), 1, stream_),
                             "upload batch metadata"));
    DI_RETURN_IF_ERROR(Enqueue(plan, nullptr, {}));
    DI_RETURN_IF_ERROR(Check(cuda_raw::StreamSynchronize(stream_), "graph warm-up"));
    DI_RETURN_IF_ERROR(Check(cuda_raw::StreamBeginCapture(stream_), "begin graph capture"));
    absl::Status captured = Check(cuda_raw::MemcpyAsync(graph_meta_->data(), graph_host_meta_,
                                                        o.count * sizeof(int32_t), 1, stream_),
                                  "capture metadata upload");
    if (captured.ok()) captured = Enqueue(plan, nullptr, {});
    if (captured.ok()) {
      captured = Check(
          cuda_raw::MemcpyAsync(
              graph_host_logits_, DeviceLogits(plan),
              static_cast<size_t>(plan.rows) * config_.vocab_size * DTypeSize(dtype_), 2, stream_),
          "capture logits download");
    }
    void* exec = nullptr;
    const absl::Status ended =
        Check(cuda_raw::StreamEndCaptureInstantiate(stream_, &exec), "end graph capture");
    DI_RETURN_IF_ERROR(captured);
    DI_RETURN_IF_ERROR(ended);
    g.exec = exec;
  }
  FillMeta(batch, layout, plan, graph_host_meta_);
  DI_RETURN_IF_ERROR(Check(cuda_raw::GraphLaunch(g.exec, stream_), "graph launch"));
  ++graph_steps_;
  DI_RETURN_IF_ERROR(Check(cuda_raw::StreamSynchronize(stream_), "graph step"));
  WidenLogits(graph_host_logits_, static_cast<int64_t>(n) * config_.vocab_size, logits);
  return absl::OkStatus();
}

int CudaModel::GraphMaxBucket() const {
  int bucket = 1;
  while (bucket < options_.graph_max_batch) bucket *= 2;
  return bucket;
}

absl::Status CudaModel::PrepareGraphs() {
  if (graph_activations_ != nullptr) return absl::OkStatus();
  const int max_bucket = GraphMaxBucket();
  const MetaLayout o =
      LayMeta(max_bucket, max_bucket, options_.graph_max_blocks_per_seq, max_bucket);
  DI_RETURN_IF_ERROR(Reserve(&graph_meta_, o.count * sizeof(int32_t), "graph metadata"));
  DI_RETURN_IF_ERROR(
      Reserve(&graph_activations_, ActivationBytes(max_bucket, max_bucket), "graph activations"));
  void* meta = nullptr;
  DI_RETURN_IF_ERROR(
      Check(cuda_raw::HostAlloc(&meta, o.count * sizeof(int32_t)), "pinned metadata"));
  graph_host_meta_ = static_cast<int32_t*>(meta);
  void* out = nullptr;
  DI_RETURN_IF_ERROR(Check(cuda_raw::HostAlloc(&out, static_cast<size_t>(max_bucket) *
                                                         config_.vocab_size * DTypeSize(dtype_)),
                           "pinned logits"));
  graph_host_logits_ = out;
  // The decode attention's split-K scratch for the largest bucket at the longest context.
  kernels::DecodeAttentionParams p;
  p.num_seqs = max_bucket;
  p.num_heads = config_.num_heads;
  p.head_dim = config_.head_dim;
  p.max_context_len = options_.graph_max_blocks_per_seq * kv_.block_size;
  const size_t need = kernels::DecodeAttentionWorkspaceBytes(p);
  if (need > 0) DI_RETURN_IF_ERROR(Reserve(&attention_workspace_, need, "attention workspace"));
  return absl::OkStatus();
}

absl::Status CudaModel::Enqueue(const StepPlan& plan, const std::vector<SequenceInput>* overrides,
                                const std::vector<int64_t>& override_offsets) {
  const ModelConfig& c = config_;
  const int64_t total = plan.total;
  const int64_t rows = plan.rows;
  const int num_seqs = plan.num_seqs;
  const int max_blocks = plan.max_blocks;
  const int max_query = plan.max_query;
  const int max_context = plan.max_context;
  const bool all_decode = plan.all_decode;
  const int64_t h = c.hidden_size;
  const int64_t hd = c.head_dim;
  const size_t es = DTypeSize(dtype_);
  const MetaLayout mo = LayMeta(total, num_seqs, max_blocks, rows);
  const int32_t* meta = plan.meta;
  const Activations act = LayActivations(plan.act, total, rows, nullptr);
  void* x = act.x;
  void* normed = act.normed;
  void* tmp = act.tmp;
  void* q = act.q;
  void* attn = act.attn;
  void* k = act.k;
  void* v = act.v;
  void* gate = act.mlp;
  void* selected = act.selected;
  void* out = act.logits;

  {
    kernels::EmbeddingParams p;
    p.token_ids = meta + mo.ids;
    p.weight = embed_.w;
    p.out = x;
    p.num_tokens = total;
    p.vocab_size = c.vocab_size;
    p.hidden = h;
    p.weight_dtype = dtype_;
    p.out_dtype = dtype_;
    DI_RETURN_IF_ERROR(Op(kernels::EmbeddingCuda(p, stream_), "embedding", -1));
  }
  // Input-embedding overrides (multimodal prompts; eager steps only) replace their rows.
  std::vector<uint8_t> row_bytes;
  for (size_t s = 0; overrides != nullptr && s < overrides->size(); ++s) {
    const SequenceInput& seq = (*overrides)[s];
    if (seq.embedding_override == nullptr) continue;
    for (int64_t t = 0; t < seq.num_tokens; ++t) {
      const float* row = seq.embedding_override[t];
      if (row == nullptr) continue;
      row_bytes = Convert(row, DType::kF32, h, dtype_);
      char* dst = static_cast<char*>(x) + (override_offsets[s] + t) * h * es;
      DI_RETURN_IF_ERROR(
          Check(cuda_raw::MemcpyAsync(dst, row_bytes.data(), row_bytes.size(), 1, stream_),
                "upload embedding override"));
    }
  }

  auto rms_norm = [&](const void* w, const void* input, void* residual, int64_t n, int64_t width,
                      void* output) {
    kernels::RmsNormParams p;
    p.input = input;
    p.weight = w;
    p.output = output;
    p.residual = residual;
    p.residual_out = residual;
    p.rows = n;
    p.hidden = width;
    p.eps = c.rms_norm_eps;
    p.dtype = dtype_;
    p.round_to = DType::kF32;
    return kernels::RmsNormCuda(p, stream_);
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  bool residual_pending = false;  // tmp holds the last block's output, not yet added to x
  for (int li = 0; li < c.num_layers; ++li) {
    const DeviceLayer& L = layers_[li];
    DI_RETURN_IF_ERROR(Op(residual_pending ? rms_norm(L.input_norm, tmp, x, total, h, normed)
                                           : rms_norm(L.input_norm, x, nullptr, total, h, normed),
                          "input norm", li));
    DI_RETURN_IF_ERROR(Op(Linear(L.q, normed, total, q), "q projection", li));
    DI_RETURN_IF_ERROR(Op(Linear(L.k, normed, total, k), "k projection", li));
    DI_RETURN_IF_ERROR(Op(Linear(L.v, normed, total, v), "v projection", li));
    if (c.qk_norm) {
      DI_RETURN_IF_ERROR(
          Op(rms_norm(L.q_norm, q, nullptr, total * c.num_heads, hd, q), "q norm", li));
      DI_RETURN_IF_ERROR(
          Op(rms_norm(L.k_norm, k, nullptr, total * c.num_kv_heads, hd, k), "k norm", li));
    }
    {
      kernels::RopeParams p;
      p.q = q;
      p.k = k;
      p.positions = meta + mo.pos;
      p.inv_freq = static_cast<const float*>(inv_freq_->data());
      p.num_tokens = total;
      p.num_heads = c.num_heads;
      p.num_kv_heads = c.num_kv_heads;
      p.head_dim = c.head_dim;
      p.dtype = dtype_;
      DI_RETURN_IF_ERROR(Op(kernels::RopeCuda(p, stream_), "rope", li));
    }
    {
      kernels::KvWriteParams p;
      p.k = k;
      p.v = v;
      p.k_cache = KvPool(li, false);
      p.v_cache = KvPool(li, true);
      p.positions = meta + mo.pos;
      p.token_seq = meta + mo.seq;
      p.block_tables = meta + mo.tables;
      p.num_tokens = total;
      p.num_seqs = num_seqs;
      p.max_blocks_per_seq = max_blocks;
      p.num_kv_heads = c.num_kv_heads;
      p.head_dim = c.head_dim;
      p.block_size = kv_.block_size;
      p.num_blocks = kv_.num_blocks;
      p.block_stride = block_elements_;
      p.src_dtype = dtype_;
      p.cache_dtype = dtype_;
      DI_RETURN_IF_ERROR(Op(kernels::KvWriteCuda(p, stream_), "kv write", li));
    }
    // The fields both attention kernels share: this layer's pools, the batch's block tables.
    auto paged = [&](auto& p) {
      p.q = q;
      p.out = attn;
      p.k_cache = KvPool(li, false);
      p.v_cache = KvPool(li, true);
      p.block_tables = meta + mo.tables;
      p.num_seqs = num_seqs;
      p.num_heads = c.num_heads;
      p.num_kv_heads = c.num_kv_heads;
      p.head_dim = c.head_dim;
      p.block_size = kv_.block_size;
      p.num_blocks = kv_.num_blocks;
      p.max_blocks_per_seq = max_blocks;
      p.block_stride = block_elements_;
      p.sliding_window = L.sliding ? c.sliding_window : 0;
      p.scale = scale;
      p.dtype = dtype_;
    };
    if (all_decode) {
      kernels::DecodeAttentionParams p;
      paged(p);
      p.context_lens = meta + mo.ctx;
      p.max_context_len = max_context;
      const size_t need = kernels::DecodeAttentionWorkspaceBytes(p);
      if (need > 0) {
        // A no-op when captured: the graph's workspace was reserved before the capture.
        DI_RETURN_IF_ERROR(Reserve(&attention_workspace_, need, "attention workspace"));
        p.workspace = attention_workspace_->data();
        p.workspace_bytes = attention_workspace_->size();
      }
      DI_RETURN_IF_ERROR(Op(kernels::DecodeAttentionCuda(p, stream_), "decode attention", li));
    } else {
      kernels::PrefillAttentionParams p;
      paged(p);
      p.query_starts = meta + mo.qstart;
      p.start_positions = meta + mo.start;
      p.max_query_len = max_query;
      DI_RETURN_IF_ERROR(Op(kernels::PrefillAttentionCuda(p, stream_), "prefill attention", li));
    }
    DI_RETURN_IF_ERROR(Op(Linear(L.o, attn, total, tmp), "o projection", li));
    DI_RETURN_IF_ERROR(Op(rms_norm(L.post_norm, tmp, x, total, h, normed), "post norm", li));
    if (L.moe) {
      DI_RETURN_IF_ERROR(Moe(L, normed, total, tmp, li));
    } else {
      DI_RETURN_IF_ERROR(Op(Mlp(L.mlp, normed, total, tmp, gate), "mlp", li));
    }
    residual_pending = true;
  }
  // Final residual add and norm (every row: cheap next to the LM head), then the rows that want
  // logits gathered (the embedding gather over the normed rows) and the LM head on them.
  DI_RETURN_IF_ERROR(Op(residual_pending ? rms_norm(final_norm_, tmp, x, total, h, normed)
                                         : rms_norm(final_norm_, x, nullptr, total, h, normed),
                        "final norm", -1));
  {
    kernels::EmbeddingParams p;
    p.token_ids = meta + mo.rows;
    p.weight = normed;
    p.out = selected;
    p.num_tokens = rows;
    p.vocab_size = total;
    p.hidden = h;
    p.weight_dtype = dtype_;
    p.out_dtype = dtype_;
    DI_RETURN_IF_ERROR(Op(kernels::EmbeddingCuda(p, stream_), "gather logit rows", -1));
  }
  DI_RETURN_IF_ERROR(Op(Linear(lm_head_, selected, rows, out), "lm head", -1));
  return absl::OkStatus();
}

}  // namespace deepinfer::engine
