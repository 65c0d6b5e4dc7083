#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/activation_cpu.h"
#include "kernels/attention_cpu.h"
#include "kernels/linear_cpu.h"
#include "kernels/rmsnorm_cpu.h"

namespace deepinfer::engine {
namespace {

using kernels::DType;
using kernels::RoundTo;

absl::StatusOr<DType> ToKernelDType(const TensorView& t, const std::string& where) {
  switch (t.dtype) {
    case StDType::kF32:
      return DType::kF32;
    case StDType::kBF16:
      return DType::kBF16;
    case StDType::kF16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor \"", t.name, "\" has dtype ",
                                                     StDTypeName(t.dtype),
                                                     "; expected F32, BF16 or F16"));
  }
}

// RoPE inverse frequencies, computed in f32 as transformers does.
std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(c.rope.theta), exponent);
  }
  if (c.rope.type == RopeType::kLinear) {
    for (float& f : inv) f = f / static_cast<float>(c.rope.factor);
  } else if (c.rope.type == RopeType::kLlama3) {
    const float factor = static_cast<float>(c.rope.factor);
    const float low = static_cast<float>(c.rope.low_freq_factor);
    const float high = static_cast<float>(c.rope.high_freq_factor);
    const float old_len = static_cast<float>(c.rope.original_max_position_embeddings);
    const float low_wavelen = old_len / low;
    const float high_wavelen = old_len / high;
    for (float& f : inv) {
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      const float smooth = (old_len / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  return inv;
}

}  // namespace

absl::StatusOr<BatchLayout> ValidateBatch(const ModelConfig& c, const KvCacheConfig& kv,
                                          bool all_sliding,
                                          const std::vector<SequenceInput>& batch) {
  BatchLayout layout;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& seq = batch[s];
    const std::string where = absl::StrCat("forward: sequence ", s);
    if (seq.num_tokens <= 0 || seq.tokens == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": num_tokens must be >= 1"));
    }
    if (seq.start_position < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": start_position must be >= 0"));
    }
    const int64_t end = seq.start_position + seq.num_tokens;
    const int64_t needed = (end + kv.block_size - 1) / kv.block_size;
    if (seq.block_table == nullptr || seq.num_blocks < needed) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": block_table has ", seq.num_blocks,
                                                     " blocks, positions up to ", end, " need ",
                                                     needed));
    }
    // Models whose every layer uses a sliding window never read keys older than the window:
    // those blocks may have been released (-1).
    const int64_t first_needed =
        all_sliding ? std::max<int64_t>(0, seq.start_position - c.sliding_window + 1) : 0;
    for (int64_t b = first_needed / kv.block_size; b < needed; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= kv.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": block_table[", b,
                                                       "] = ", seq.block_table[b],
                                                       " is outside [0, ", kv.num_blocks, ")"));
      }
    }
    for (int64_t t = 0; t < seq.num_tokens; ++t) {
      if (seq.tokens[t] < 0 || seq.tokens[t] >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": token[", t, "] = ", seq.tokens[t],
                                                       " is outside [0, ", c.vocab_size, ")"));
      }
    }
    layout.offsets.push_back(layout.total_tokens);
    layout.total_tokens += seq.num_tokens;
    layout.logit_rows += seq.all_logits ? seq.num_tokens : 1;
  }
  return layout;
}

Model::Model(ModelConfig config, std::unique_ptr<Checkpoint> checkpoint, int num_threads)
    : config_(std::move(config)),
      checkpoint_(std::move(checkpoint)),
      pool_(kernels::ThreadPool::Create(num_threads)) {}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const ModelOptions& options) {
  DI_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  DI_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  std::unique_ptr<Model> model(new Model(std::move(config), std::move(ckpt), options.num_threads));
  DI_RETURN_IF_ERROR(model->Init());
  return model;
}

absl::StatusOr<Model::Linear> Model::GetLinear(const std::string& name, int64_t out, int64_t in,
                                               bool bias) const {
  Linear l;
  DI_ASSIGN_OR_RETURN(const TensorView* w, checkpoint_->Get(name + ".weight", {out, in}));
  DI_ASSIGN_OR_RETURN(l.dtype, ToKernelDType(*w, checkpoint_->dir()));
  l.w = w->data;
  l.out = out;
  l.in = in;
  if (bias) {
    DI_ASSIGN_OR_RETURN(const TensorView* b, checkpoint_->Get(name + ".bias", {out}));
    if (b->dtype != w->dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          checkpoint_->dir(), ": tensor \"", b->name, "\" has dtype ", StDTypeName(b->dtype),
          ", expected ", StDTypeName(w->dtype), " like its weight"));
    }
    l.b = b->data;
  }
  return l;
}

absl::StatusOr<std::vector<float>> Model::GetNorm(const std::string& name, int64_t size) const {
  DI_ASSIGN_OR_RETURN(const TensorView* t, checkpoint_->Get(name, {size}));
  DI_ASSIGN_OR_RETURN(DType dt, ToKernelDType(*t, checkpoint_->dir()));
  std::vector<float> out(size);
  for (int64_t i = 0; i < size; ++i) out[i] = kernels::LoadAsF32(t->data, dt, i);
  return out;
}

absl::Status Model::Init() {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  // Multimodal checkpoints nest the language model (transformers 5 vs. older layouts).
  constexpr std::pair<const char*, const char*> kLayouts[] = {
      {"model.", "lm_head"},
      {"model.language_model.", "lm_head"},
      {"language_model.model.", "language_model.lm_head"},
  };
  for (const auto& [body, head] : kLayouts) {
    if (checkpoint_->Find(absl::StrCat(body, "embed_tokens.weight")) != nullptr) {
      body_prefix_ = body;
      lm_head_name_ = head;
      break;
    }
  }
  DI_ASSIGN_OR_RETURN(embed_, GetLinear(body_prefix_ + "embed_tokens", c.vocab_size, h, false));
  if (c.torch_dtype == "bfloat16") {
    act_dtype_ = DType::kBF16;
  } else if (c.torch_dtype == "float16") {
    act_dtype_ = DType::kF16;
  } else {
    act_dtype_ = DType::kF32;
  }
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    DI_ASSIGN_OR_RETURN(lm_head_, GetLinear(lm_head_name_, c.vocab_size, h, false));
  }
  DI_ASSIGN_OR_RETURN(final_norm_, GetNorm(body_prefix_ + "norm.weight", h));
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    Layer& L = layers_[i];
    const std::string p = absl::StrCat(body_prefix_, "layers.", i, ".");
    DI_ASSIGN_OR_RETURN(L.input_norm, GetNorm(p + "input_layernorm.weight", h));
    DI_ASSIGN_OR_RETURN(L.post_norm, GetNorm(p + "post_attention_layernorm.weight", h));
    DI_ASSIGN_OR_RETURN(L.q, GetLinear(p + "self_attn.q_proj", q_dim, h, c.attention_bias));
    DI_ASSIGN_OR_RETURN(L.k, GetLinear(p + "self_attn.k_proj", kv_dim, h, c.attention_bias));
    DI_ASSIGN_OR_RETURN(L.v, GetLinear(p + "self_attn.v_proj", kv_dim, h, c.attention_bias));
    DI_ASSIGN_OR_RETURN(L.o, GetLinear(p + "self_attn.o_proj", h, q_dim, false));
    if (c.qk_norm) {
      DI_ASSIGN_OR_RETURN(L.q_norm, GetNorm(p + "self_attn.q_norm.weight", c.head_dim));
      DI_ASSIGN_OR_RETURN(L.k_norm, GetNorm(p + "self_attn.k_norm.weight", c.head_dim));
    }
    L.sliding = c.layer_attention[i] == AttentionKind::kSliding;
    L.moe = c.is_moe() && !c.moe.dense_layer[i];
    if (!L.moe) {
      DI_ASSIGN_OR_RETURN(L.mlp.gate,
                          GetLinear(p + "mlp.gate_proj", c.intermediate_size, h, false));
      DI_ASSIGN_OR_RETURN(L.mlp.up, GetLinear(p + "mlp.up_proj", c.intermediate_size, h, false));
      DI_ASSIGN_OR_RETURN(L.mlp.down,
                          GetLinear(p + "mlp.down_proj", h, c.intermediate_size, false));
      continue;
    }
    const int64_t e_inter = c.moe.expert_intermediate_size;
    L.experts.resize(c.moe.num_experts);
    if (c.family == ModelFamily::kMixtral) {
      DI_ASSIGN_OR_RETURN(L.router,
                          GetLinear(p + "block_sparse_moe.gate", c.moe.num_experts, h, false));
      for (int e = 0; e < c.moe.num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "block_sparse_moe.experts.", e, ".");
        DI_ASSIGN_OR_RETURN(L.experts[e].gate, GetLinear(ep + "w1", e_inter, h, false));
        DI_ASSIGN_OR_RETURN(L.experts[e].down, GetLinear(ep + "w2", h, e_inter, false));
        DI_ASSIGN_OR_RETURN(L.experts[e].up, GetLinear(ep + "w3", e_inter, h, false));
      }
    } else {
      DI_ASSIGN_OR_RETURN(L.router, GetLinear(p + "mlp.gate", c.moe.num_experts, h, false));
      for (int e = 0; e < c.moe.num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        DI_ASSIGN_OR_RETURN(L.experts[e].gate, GetLinear(ep + "gate_proj", e_inter, h, false));
        DI_ASSIGN_OR_RETURN(L.experts[e].up, GetLinear(ep + "up_proj", e_inter, h, false));
        DI_ASSIGN_OR_RETURN(L.experts[e].down, GetLinear(ep + "down_proj", h, e_inter, false));
      }
      if (c.moe.shared_expert_intermediate_size > 0) {
        const int64_t s = c.moe.shared_expert_intermediate_size;
        DI_ASSIGN_OR_RETURN(L.shared_expert.gate,
                            GetLinear(p + "mlp.shared_expert.gate_proj", s, h, false));
        DI_ASSIGN_OR_RETURN(L.shared_expert.up,
                            GetLinear(p + "mlp.shared_expert.up_proj", s, h, false));
        DI_ASSIGN_OR_RETURN(L.shared_expert.down,
                            GetLinear(p + "mlp.shared_expert.down_proj", h, s, false));
        DI_ASSIGN_OR_RETURN(L.shared_expert_gate,
                            GetLinear(p + "mlp.shared_expert_gate", 1, h, false));
      }
    }
  }
  inv_freq_ = RopeInvFreq(c);
  all_sliding_ = c.sliding_window > 0;
  for (AttentionKind k : c.layer_attention) all_sliding_ = all_sliding_ && k == AttentionKind::kSliding;
  return absl::OkStatus();
}

KvCacheConfig Model::MakeKvCacheConfig(int num_blocks, int block_size) const {
  KvCacheConfig kv;
  kv.num_layers = config_.num_layers;
  kv.num_kv_heads = config_.num_kv_heads;
  kv.head_dim = config_.head_dim;
  kv.block_size = block_size;
  kv.num_blocks = num_blocks;
  kv.dtype = act_dtype_;
  return kv;
}

kernels::LinearParams Model::LinearFor(const Linear& l, const float* x, int64_t m,
                                       float* y) const {
  kernels::LinearParams p;
  p.x = x;
  p.weight = l.w;
  p.weight_dtype = l.dtype;
  p.bias = l.b;
  p.y = y;
  p.m = m;
  p.n = l.out;
  p.k = l.in;
  p.round_to = act_dtype_;
  return p;
}

void Model::RunLinear(const Linear& l, const float* x, int64_t m, float* y) const {
  kernels::LinearCpu(LinearFor(l, x, m, y), pool_.get());
}

void Model::RmsNorm(const std::vector<float>& w, const float* x, int64_t rows, int64_t width,
                    float* y) const {
  kernels::RmsNormParams p;
  p.input = x;
  p.weight = w.data();
  p.output = y;
  p.rows = rows;
  p.hidden = width;
  p.eps = config_.rms_norm_eps;
  p.dtype = DType::kF32;
  p.round_to = act_dtype_;
  pool_->ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    kernels::RmsNormParams part = p;
    part.input = x + begin * width;
    part.output = y + begin * width;
    part.rows = end - begin;
    // Parameters are built here from a validated config; the kernel cannot fail on them.
    (void)kernels::RmsNormCpu(part);
  });
}

void Model::AddRmsNorm(const std::vector<float>& w, const float* branch, float* x, int64_t rows,
                       int64_t width, float* y) const {
  kernels::RmsNormParams p;
  p.weight = w.data();
  p.hidden = width;
  p.eps = config_.rms_norm_eps;
  p.dtype = DType::kF32;
  p.round_to = act_dtype_;
  pool_->ParallelFor(rows, 16, [&](int64_t begin, int64_t end) {
    kernels::RmsNormParams part = p;
    part.input = branch + begin * width;
    part.residual = x + begin * width;
    part.residual_out = x + begin * width;
    part.output = y + begin * width;
    part.rows = end - begin;
    (void)kernels::RmsNormCpu(part);
  });
}

void Model::EnsureRopeTable(int64_t positions) {
  if (positions <= rope_positions_) return;
  // Grow geometrically so a long generation does not rebuild the table every step.
  const int64_t target = std::max<int64_t>(positions, std::max<int64_t>(256, 2 * rope_positions_));
  const int64_t half = config_.head_dim / 2;
  rope_cos_.resize(target * half);
  rope_sin_.resize(target * half);
  for (int64_t pos = rope_positions_; pos < target; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      // In f32 then rounded to the activation dtype, as transformers computes and casts them.
      const float angle = static_cast<float>(pos) * inv_freq_[i];
      rope_cos_[pos * half + i] = RoundTo(act_dtype_, std::cos(angle));
      rope_sin_[pos * half + i] = RoundTo(act_dtype_, std::sin(angle));
    }
  }
  rope_positions_ = target;
}

void Model::RunMlp(const Mlp& mlp, const float* x, int64_t m, int64_t inter, float* out,
                   std::vector<float>* scratch) const {
  if (static_cast<int64_t>(scratch->size()) < 2 * m * inter) scratch->resize(2 * m * inter);
  float* gate = scratch->data();
  float* up = gate + m * inter;
  // Gate and up read the same input: one parallel region for both.
  const kernels::LinearParams ps[2] = {LinearFor(mlp.gate, x, m, gate),
                                       LinearFor(mlp.up, x, m, up)};
  kernels::LinearCpuMulti(ps, 2, pool_.get());
  kernels::SwiGluCpu(gate, up, gate, m * inter, act_dtype_, pool_.get());
  RunLinear(mlp.down, gate, m, out);
}

void Model::RunMoe(const Layer& L, const float* x, int64_t m, float* out) const {
  const ModelConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int experts = c.moe.num_experts;
  const int top_k = c.moe.experts_per_token;
  std::vector<float> router(m * experts);
  RunLinear(L.router, x, m, router.data());
  // Route: softmax in f32, top-k, optional renormalisation, weights in the activation dtype.
  std::vector<std::vector<std::pair<int64_t, float>>> assigned(experts);  // (token, weight)
  for (int64_t t = 0; t < m; ++t) {
    const float* logits = router.data() + t * experts;
    const float mx = *std::max_element(logits, logits + experts);
    std::vector<float> probs(experts);
    float sum = 0.0f;
    for (int e = 0; e < experts; ++e) {
      probs[e] = std::exp(logits[e] - mx);
      sum += probs[e];
    }
    for (float& p : probs) p /= sum;
    std::vector<int> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });
    float top_sum = 0.0f;
    for (int k = 0; k < top_k; ++k) top_sum += probs[order[k]];
    for (int k = 0; k < top_k; ++k) {
      float w = probs[order[k]];
      if (c.moe.normalize_top_k) w /= top_sum;
      assigned[order[k]].emplace_back(t, RoundTo(act_dtype_, w));
    }
  }
  std::fill(out, out + m * h, 0.0f);
  std::vector<float> xin, eout, scratch;
  for (int e = 0; e < experts; ++e) {
    const auto& rows = assigned[e];
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    xin.resize(n * h);
    for (int64_t r = 0; r < n; ++r) {
      std::copy(x + rows[r].first * h, x + (rows[r].first + 1) * h, xin.data() + r * h);
    }
    eout.resize(n * h);
    RunMlp(L.experts[e], xin.data(), n, c.moe.expert_intermediate_size, eout.data(), &scratch);
    for (int64_t r = 0; r < n; ++r) {
      float* dst = out + rows[r].first * h;
      const float w = rows[r].second;
      for (int64_t i = 0; i < h; ++i) {
        dst[i] = RoundTo(act_dtype_, dst[i] + RoundTo(act_dtype_, eout[r * h + i] * w));
      }
    }
  }
  if (c.moe.shared_expert_intermediate_size > 0) {
    std::vector<float> shared(m * h), gate(m);
    RunMlp(L.shared_expert, x, m, c.moe.shared_expert_intermediate_size, shared.data(), &scratch);
    RunLinear(L.shared_expert_gate, x, m, gate.data());
    for (int64_t t = 0; t < m; ++t) {
      const float g = RoundTo(act_dtype_, 1.0f / (1.0f + std::exp(-gate[t])));
      for (int64_t i = 0; i < h; ++i) {
        out[t * h + i] =
            RoundTo(act_dtype_, out[t * h + i] + RoundTo(act_dtype_, g * shared[t * h + i]));
      }
    }
  }
}

absl::Status Model::Forward(const std::vector<SequenceInput>& batch, KvCache* cache,
                            std::vector<float>* logits,
                            const std::function<void(int layer)>& on_layer_kv) {
  const ModelConfig& c = config_;
  const KvCacheConfig& kv = cache->config();
  if (kv.num_layers != c.num_layers || kv.num_kv_heads != c.num_kv_heads ||
      kv.head_dim != c.head_dim || kv.dtype != act_dtype_) {
    return absl::InvalidArgumentError("forward: kv cache geometry does not match the model");
  }
  DI_ASSIGN_OR_RETURN(const BatchLayout layout, ValidateBatch(c, kv, all_sliding_, batch));
  const std::vector<int64_t>& offsets = layout.offsets;
  const int64_t total = layout.total_tokens;
  const int64_t out_rows = layout.logit_rows;
  const int64_t h = c.hidden_size;
  const int64_t hd = c.head_dim;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * hd;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * hd;

  Workspace& ws = ws_;
  auto ensure = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  ensure(ws.x, total * h);
  ensure(ws.normed, total * h);
  ensure(ws.q, total * q_dim);
  ensure(ws.k, total * kv_dim);
  ensure(ws.v, total * kv_dim);
  ensure(ws.attn, total * q_dim);
  ensure(ws.tmp, total * h);
  float* x = ws.x.data();
  float* normed = ws.normed.data();
  float* q = ws.q.data();
  float* k = ws.k.data();
  float* v = ws.v.data();
  float* attn = ws.attn.data();
  float* tmp = ws.tmp.data();
  ws.positions.resize(total);
  int64_t max_position = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    for (int64_t t = 0; t < batch[s].num_tokens; ++t) {
      ws.positions[offsets[s] + t] = batch[s].start_position + t;
      const int64_t token = batch[s].tokens[t];
      float* dst = x + (offsets[s] + t) * h;
      const float* row =
          batch[s].embedding_override != nullptr ? batch[s].embedding_override[t] : nullptr;
      if (row != nullptr) {
        for (int64_t i = 0; i < h; ++i) dst[i] = RoundTo(act_dtype_, row[i]);
      } else {
        for (int64_t i = 0; i < h; ++i)
          dst[i] = kernels::LoadAsF32(embed_.w, embed_.dtype, token * h + i);
      }
    }
    max_position = std::max(max_position, batch[s].start_position + batch[s].num_tokens);
  }
  EnsureRopeTable(max_position);
  // Where each new token's K/V goes in the cache (the same slot in every layer).
  ws.kv_slots.resize(total);
  for (size_t s = 0; s < batch.size(); ++s) {
    for (int64_t t = 0; t < batch[s].num_tokens; ++t) {
      const int64_t pos = batch[s].start_position + t;
      ws.kv_slots[offsets[s] + t] =
          static_cast<int64_t>(batch[s].block_table[pos / kv.block_size]) *
              cache->block_elements() +
          (pos % kv.block_size) * kv_dim;
    }
  }
  const int64_t* kv_slots = ws.kv_slots.data();
  const int64_t half = hd / 2;
  const int64_t* positions = ws.positions.data();
  // Rotates the first `heads` vectors of every token (q, then k) in one parallel region.
  auto apply_rope = [&](float* qbase, int q_heads, float* kbase, int k_heads) {
    pool_->ParallelFor(total, 32, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* cs = rope_cos_.data() + positions[t] * half;
        const float* sn = rope_sin_.data() + positions[t] * half;
        for (int which = 0; which < 2; ++which) {
          const int heads = which == 0 ? q_heads : k_heads;
          float* base = which == 0 ? qbase : kbase;
          for (int hh = 0; hh < heads; ++hh) {
            float* vec = base + (t * heads + hh) * hd;
            for (int64_t i = 0; i < half; ++i) {
              const float a = vec[i], b = vec[i + half];
              vec[i] = RoundTo(act_dtype_,
                               RoundTo(act_dtype_, a * cs[i]) - RoundTo(act_dtype_, b * sn[i]));
              vec[i + half] = RoundTo(
                  act_dtype_, RoundTo(act_dtype_, b * cs[i]) + RoundTo(act_dtype_, a * sn[i]));
            }
          }
        }
      }
    });
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  std::vector<kernels::PagedAttentionParams> attn_params;
  // tmp holds the previous block's output until the next norm folds it into x.
  bool residual_pending = false;
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& L = layers_[li];
    if (residual_pending) {
      AddRmsNorm(L.input_norm, tmp, x, total, h, normed);
    } else {
      RmsNorm(L.input_norm, x, total, h, normed);
    }
    {
      const kernels::LinearParams ps[3] = {LinearFor(L.q, normed, total, q),
                                           LinearFor(L.k, normed, total, k),
                                           LinearFor(L.v, normed, total, v)};
      kernels::LinearCpuMulti(ps, 3, pool_.get());
    }
    if (c.qk_norm) {
      RmsNorm(L.q_norm, q, total * c.num_heads, hd, q);
      RmsNorm(L.k_norm, k, total * c.num_kv_heads, hd, k);
    }
    apply_rope(q, c.num_heads, k, c.num_kv_heads);
    // Store K/V of the new tokens into their blocks.
    void* k_layer = cache->k_layer(li);
    void* v_layer = cache->v_layer(li);
    pool_->ParallelFor(total, 64, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t elem = kv_slots[row];
        for (int64_t i = 0; i < kv_dim; ++i) {
          kernels::StoreFromF32(k_layer, kv.dtype, elem + i, k[row * kv_dim + i]);
          kernels::StoreFromF32(v_layer, kv.dtype, elem + i, v[row * kv_dim + i]);
        }
      }
    });
    if (on_layer_kv) on_layer_kv(li);
    attn_params.resize(batch.size());
    for (size_t s = 0; s < batch.size(); ++s) {
      const SequenceInput& seq = batch[s];
      kernels::PagedAttentionParams& ap = attn_params[s];
      ap.q = q + offsets[s] * q_dim;
      ap.out = attn + offsets[s] * q_dim;
      ap.num_tokens = seq.num_tokens;
      ap.start_position = seq.start_position;
      ap.num_heads = c.num_heads;
      ap.num_kv_heads = c.num_kv_heads;
      ap.head_dim = c.head_dim;
      ap.k_base = k_layer;
      ap.v_base = v_layer;
      ap.kv_dtype = kv.dtype;
      ap.block_stride = cache->block_elements();
      ap.block_size = kv.block_size;
      ap.block_table = seq.block_table;
      ap.sliding_window = L.sliding ? c.sliding_window : 0;
      ap.scale = scale;
      ap.round_to = act_dtype_;
    }
    kernels::PagedAttentionBatchCpu(attn_params.data(), static_cast<int>(attn_params.size()),
                                    pool_.get());
    RunLinear(L.o, attn, total, tmp);
    AddRmsNorm(L.post_norm, tmp, x, total, h, normed);
    if (L.moe) {
      RunMoe(L, normed, total, tmp);
    } else {
      RunMlp(L.mlp, normed, total, c.intermediate_size, tmp, &ws.mlp);
    }
    residual_pending = true;
  }
  // Final residual add, norm and LM head on the rows that want logits.
  ensure(ws.selected, out_rows * h);
  float* selected = ws.selected.data();
  int64_t r = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const int64_t first = batch[s].all_logits ? 0 : batch[s].num_tokens - 1;
    for (int64_t t = first; t < batch[s].num_tokens; ++t, ++r) {
      const int64_t row = offsets[s] + t;
      for (int64_t i = 0; i < h; ++i) {
        selected[r * h + i] = residual_pending
                                  ? RoundTo(act_dtype_, x[row * h + i] + tmp[row * h + i])
                                  : x[row * h + i];
      }
    }
  }
  RmsNorm(final_norm_, selected, out_rows, h, selected);
  logits->resize(out_rows * static_cast<int64_t>(c.vocab_size));
  RunLinear(lm_head_, selected, out_rows, logits->data());
  return absl::OkStatus();
}

}  // namespace deepinfer::engine
