// Runs on every machine (no "gpu" tag). The CUDA op launchers check their parameters before
// touching the device (kInvalidArgument naming the field), and without a GPU they return
// kUnavailable instead of crashing.
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/cuda/decode_attention_cuda.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/embedding_cuda.h"
#include "kernels/cuda/greedy_cuda.h"
#include "kernels/cuda/kv_write_cuda.h"
#include "kernels/cuda/linear_cuda.h"
#include "kernels/cuda/moe_cuda.h"
#include "kernels/cuda/prefill_attention_cuda.h"
#include "kernels/cuda/rope_cuda.h"
#include "kernels/cuda/sample_cuda.h"
#include "kernels/cuda/swiglu_cuda.h"

namespace deepinfer::kernels {
namespace {

void ExpectInvalid(const absl::Status& s, absl::string_view prefix) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StartsWith(s.message(), prefix)) << s << " should start with " << prefix;
}

// Valid parameters: kUnavailable without a device. (With one, the pointers here are host
// memory, so the launch is not attempted.)
void ExpectUnavailableWithoutDevice(const std::function<absl::Status()>& call) {
  if (CudaAvailable().ok()) return;
  const absl::Status s = call();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("no CUDA device"), absl::string_view::npos) << s;
}

TEST(CudaOpsValidationTest, Embedding) {
  std::vector<int32_t> ids(4, 0);
  std::vector<float> w(8 * 16), out(4 * 16);
  EmbeddingParams p;
  p.token_ids = ids.data();
  p.weight = w.data();
  p.out = out.data();
  p.num_tokens = 4;
  p.vocab_size = 8;
  p.hidden = 16;
  p.weight_dtype = DType::kF32;
  p.out_dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return EmbeddingCuda(p, nullptr); });

  EmbeddingParams bad = p;
  bad.hidden = 0;
  ExpectInvalid(EmbeddingCuda(bad, nullptr), "embedding: hidden:");
  bad = p;
  bad.vocab_size = -1;
  ExpectInvalid(EmbeddingCuda(bad, nullptr), "embedding: vocab_size:");
  bad = p;
  bad.token_ids = nullptr;
  ExpectInvalid(EmbeddingCuda(bad, nullptr), "embedding: token_ids:");
  bad = p;
  bad.out_row_stride = 8;
  ExpectInvalid(EmbeddingCuda(bad, nullptr), "embedding: out_row_stride:");
  bad = p;
  bad.num_tokens = -2;
  ExpectInvalid(EmbeddingCuda(bad, nullptr), "embedding: num_tokens:");
}

TEST(CudaOpsValidationTest, Rope) {
  std::vector<float> q(3 * 4 * 8), k(3 * 2 * 8), inv(4);
  std::vector<int32_t> pos(3, 0);
  RopeParams p;
  p.q = q.data();
  p.k = k.data();
  p.positions = pos.data();
  p.inv_freq = inv.data();
  p.num_tokens = 3;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 8;
  p.dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return RopeCuda(p, nullptr); });

  RopeParams bad = p;
  bad.head_dim = 7;
  ExpectInvalid(RopeCuda(bad, nullptr), "rope: head_dim:");
  bad = p;
  bad.num_heads = 0;
  ExpectInvalid(RopeCuda(bad, nullptr), "rope: num_heads:");
  bad = p;
  bad.k = nullptr;
  ExpectInvalid(RopeCuda(bad, nullptr), "rope: k:");
  bad = p;
  bad.inv_freq = nullptr;
  ExpectInvalid(RopeCuda(bad, nullptr), "rope: inv_freq:");
  bad = p;
  bad.q_row_stride = 16;
  ExpectInvalid(RopeCuda(bad, nullptr), "rope: q_row_stride:");
}

TEST(CudaOpsValidationTest, SwiGlu) {
  std::vector<float> g(2 * 8), u(2 * 8), out(2 * 8);
  SwiGluParams p;
  p.gate = g.data();
  p.up = u.data();
  p.out = out.data();
  p.rows = 2;
  p.width = 8;
  p.dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return SwiGluCuda(p, nullptr); });

  SwiGluParams bad = p;
  bad.width = 0;
  ExpectInvalid(SwiGluCuda(bad, nullptr), "swiglu: width:");
  bad = p;
  bad.up = nullptr;
  ExpectInvalid(SwiGluCuda(bad, nullptr), "swiglu: up:");
  bad = p;
  bad.gate_row_stride = 4;
  ExpectInvalid(SwiGluCuda(bad, nullptr), "swiglu: gate_row_stride:");
}

TEST(CudaOpsValidationTest, KvWrite) {
  std::vector<float> k(2 * 16), v(2 * 16), kc(4 * 16 * 16), vc(4 * 16 * 16);
  std::vector<int32_t> pos = {0, 1}, seq = {0, 0}, table = {2};
  KvWriteParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.positions = pos.data();
  p.token_seq = seq.data();
  p.block_tables = table.data();
  p.num_tokens = 2;
  p.num_seqs = 1;
  p.max_blocks_per_seq = 1;
  p.num_kv_heads = 2;
  p.head_dim = 8;
  p.block_size = 16;
  p.num_blocks = 4;
  p.block_stride = 16 * 16;
  p.src_dtype = p.cache_dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return KvWriteCuda(p, nullptr); });

  KvWriteParams bad = p;
  bad.block_stride = 100;
  ExpectInvalid(KvWriteCuda(bad, nullptr), "kv_write: block_stride:");
  bad = p;
  bad.block_tables = nullptr;
  ExpectInvalid(KvWriteCuda(bad, nullptr), "kv_write: block_tables:");
  bad = p;
  bad.block_size = 0;
  ExpectInvalid(KvWriteCuda(bad, nullptr), "kv_write: block_size:");
  bad = p;
  bad.num_seqs = 0;
  ExpectInvalid(KvWriteCuda(bad, nullptr), "kv_write: num_seqs:");
}

TEST(CudaOpsValidationTest, DecodeAttention) {
  std::vector<float> q(2 * 8 * 64), out(2 * 8 * 64), kc(64 * 16 * 2 * 64), vc(kc.size());
  std::vector<int32_t> tables(2 * 32, 0), ctx = {300, 5};
  DecodeAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.k_cache = kc.data();
  p.v_cache = vc.data();
  p.block_tables = tables.data();
  p.context_lens = ctx.data();
  p.num_seqs = 2;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 16;
  p.num_blocks = 64;
  p.max_blocks_per_seq = 32;
  p.block_stride = 16 * 2 * 64;
  p.max_context_len = 300;
  p.scale = 0.125f;
  p.dtype = DType::kF32;
  // 300 keys: two partitions, so a workspace is required.
  EXPECT_EQ(DecodeAttentionMaxSplits(p), 2);
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(p), size_t{2} * 8 * 2 * 66 * 4);
  ExpectInvalid(DecodeAttentionCuda(p, nullptr), "decode_attention: workspace_bytes:");
  std::vector<uint8_t> ws(DecodeAttentionWorkspaceBytes(p));
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  ExpectUnavailableWithoutDevice([&] { return DecodeAttentionCuda(p, nullptr); });
  // A window of one partition needs none.
  DecodeAttentionParams windowed = p;
  windowed.sliding_window = 64;
  EXPECT_EQ(DecodeAttentionWorkspaceBytes(windowed), 0u);

  DecodeAttentionParams bad = p;
  bad.num_heads = 7;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: num_heads:");
  bad = p;
  bad.num_heads = 34;
  bad.num_kv_heads = 2;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: num_heads:");
  bad = p;
  bad.head_dim = 80;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: head_dim:");
  bad = p;
  bad.max_blocks_per_seq = 18;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: max_blocks_per_seq:");
  bad = p;
  bad.block_stride = 1;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: block_stride:");
  bad = p;
  bad.sliding_window = -1;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: sliding_window:");
  bad = p;
  bad.context_lens = nullptr;
  ExpectInvalid(DecodeAttentionCuda(bad, nullptr), "decode_attention: context_lens:");
}

TEST(CudaOpsValidationTest, Linear) {
  std::vector<uint16_t> x(3 * 40), w(24 * 32), y(3 * 24);
  LinearCudaParams p;
  p.x = x.data();
  p.weight = w.data();
  p.y = y.data();
  p.m = 3;
  p.n = 24;
  p.k = 32;
  p.ldx = 40;
  p.dtype = DType::kBF16;
  ExpectUnavailableWithoutDevice([&] { return LinearCuda(p, nullptr); });

  LinearCudaParams bad = p;
  bad.m = -1;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: m:");
  bad = p;
  bad.n = 0;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: n:");
  bad = p;
  bad.k = 0;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: k:");
  bad = p;
  bad.ldx = 31;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: ldx:");
  bad = p;
  bad.ldy = 23;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: ldy:");
  bad = p;
  bad.weight = nullptr;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: weight:");
  bad = p;
  bad.y = nullptr;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: y:");
  bad = p;
  bad.workspace_bytes = 1024;
  ExpectInvalid(LinearCuda(bad, nullptr), "linear: workspace:");
  // No rows: nothing to read, so null pointers are fine.
  LinearCudaParams empty = p;
  empty.m = 0;
  empty.x = nullptr;
  empty.y = nullptr;
  empty.weight = nullptr;
  ExpectUnavailableWithoutDevice([&] { return LinearCuda(empty, nullptr); });
}

TEST(CudaOpsValidationTest, PrefillAttention) {
  std::vector<float> q(5 * 8 * 64), out(q.size()), kv(4 * 16 * 2 * 64);
  std::vector<int32_t> tables = {0, 1, 2, 3}, starts = {0, 5}, positions = {20};
  PrefillAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.k_cache = kv.data();
  p.v_cache = kv.data();
  p.block_tables = tables.data();
  p.query_starts = starts.data();
  p.start_positions = positions.data();
  p.num_seqs = 1;
  p.num_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 64;
  p.block_size = 16;
  p.num_blocks = 4;
  p.max_blocks_per_seq = 4;
  p.block_stride = 16 * 2 * 64;
  p.max_query_len = 5;
  p.scale = 0.125f;
  p.dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return PrefillAttentionCuda(p, nullptr); });

  PrefillAttentionParams bad = p;
  bad.num_heads = 7;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: num_heads:");
  bad = p;
  bad.head_dim = 80;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: head_dim:");
  bad = p;
  bad.head_dim = 512;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: head_dim:");
  bad = p;
  bad.block_stride = 1;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: block_stride:");
  bad = p;
  bad.max_blocks_per_seq = 0;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: max_blocks_per_seq:");
  bad = p;
  bad.max_query_len = -1;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: max_query_len:");
  bad = p;
  bad.sliding_window = -2;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: sliding_window:");
  bad = p;
  bad.query_starts = nullptr;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: query_starts:");
  bad = p;
  bad.start_positions = nullptr;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: start_positions:");
  bad = p;
  bad.num_seqs = 70000;
  ExpectInvalid(PrefillAttentionCuda(bad, nullptr), "prefill_attention: num_seqs:");
}

TEST(CudaOpsValidationTest, Greedy) {
  std::vector<float> logits(2 * 10), lps(2), top_lps(2 * 3);
  std::vector<int32_t> tokens(2), top_tokens(2 * 3);
  GreedyParams p;
  p.logits = logits.data();
  p.rows = 2;
  p.vocab = 10;
  p.tokens = tokens.data();
  p.logprobs = lps.data();
  p.top_n = 3;
  p.top_tokens = top_tokens.data();
  p.top_logprobs = top_lps.data();
  ExpectUnavailableWithoutDevice([&] { return GreedyCuda(p, nullptr); });

  GreedyParams bad = p;
  bad.vocab = 0;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: vocab:");
  bad = p;
  bad.rows = -1;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: rows:");
  bad = p;
  bad.row_stride = 9;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: row_stride:");
  bad = p;
  bad.top_n = 21;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: top_n:");
  bad = p;
  bad.tokens = nullptr;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: tokens:");
  bad = p;
  bad.top_tokens = nullptr;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: top_tokens:");
  bad = p;
  bad.top_logprobs = nullptr;
  ExpectInvalid(GreedyCuda(bad, nullptr), "greedy: top_logprobs:");
  // Without top_n the top arrays are not needed, nor logprobs at all.
  GreedyParams lean = p;
  lean.top_n = 0;
  lean.top_tokens = nullptr;
  lean.top_logprobs = nullptr;
  lean.logprobs = nullptr;
  ExpectUnavailableWithoutDevice([&] { return GreedyCuda(lean, nullptr); });
}

TEST(CudaOpsValidationTest, Sample) {
  std::vector<float> logits(2 * 10), t(2), top_p(2), min_p(2), lps(2);
  std::vector<int32_t> top_k(2), tokens(2);
  std::vector<double> u(2);
  std::vector<uint8_t> ws(1 << 20);
  SampleParams p;
  p.logits = logits.data();
  p.rows = 2;
  p.vocab = 10;
  p.temperature = t.data();
  p.top_k = top_k.data();
  p.top_p = top_p.data();
  p.min_p = min_p.data();
  p.uniform = u.data();
  p.tokens = tokens.data();
  p.logprobs = lps.data();
  p.workspace = ws.data();
  p.workspace_bytes = ws.size();
  ExpectUnavailableWithoutDevice([&] { return SampleCuda(p, nullptr); });
  if (!CudaAvailable().ok()) {
    EXPECT_EQ(SampleWorkspaceBytes(2, 10).status().code(), absl::StatusCode::kUnavailable);
  }
  ExpectInvalid(SampleWorkspaceBytes(-1, 10).status(), "sample: rows:");
  ExpectInvalid(SampleWorkspaceBytes(65536, 10).status(), "sample: rows:");
  ExpectInvalid(SampleWorkspaceBytes(60000, 1 << 16).status(), "sample: rows:");
  ExpectInvalid(SampleWorkspaceBytes(2, 0).status(), "sample: vocab:");

  SampleParams bad = p;
  bad.vocab = 0;
  ExpectInvalid(SampleCuda(bad, nullptr), "sample: vocab:");
  bad = p;
  bad.row_stride = 5;
  ExpectInvalid(SampleCuda(bad, nullptr), "sample: row_stride:");
  bad = p;
  bad.temperature = nullptr;
  ExpectInvalid(SampleCuda(bad, nullptr), "sample: temperature:");
  bad = p;
  bad.uniform = nullptr;
  ExpectInvalid(SampleCuda(bad, nullptr), "sample: uniform:");
  bad = p;
  bad.top_k = nullptr;
  ExpectInvalid(SampleCuda(bad, nullptr), "sample: top_k:");
  bad = p;
  bad.workspace = nullptr;
  ExpectInvalid(SampleCuda(bad, nullptr), "sample: workspace:");
}

TEST(CudaOpsValidationTest, Moe) {
  std::vector<float> logits(3 * 8), weights(3 * 2), out(3 * 16), eout(6 * 16), gate(3);
  std::vector<int32_t> ids(3 * 2), rows(3 * 2);
  MoeRouteParams r;
  r.logits = logits.data();
  r.expert_ids = ids.data();
  r.weights = weights.data();
  r.rows = 3;
  r.num_experts = 8;
  r.top_k = 2;
  r.dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return MoeRouteCuda(r, nullptr); });
  MoeRouteParams bad_r = r;
  bad_r.num_experts = kMoeMaxExperts + 1;
  ExpectInvalid(MoeRouteCuda(bad_r, nullptr), "moe route: num_experts:");
  bad_r = r;
  bad_r.top_k = 9;
  ExpectInvalid(MoeRouteCuda(bad_r, nullptr), "moe route: top_k:");
  bad_r = r;
  bad_r.weights = nullptr;
  ExpectInvalid(MoeRouteCuda(bad_r, nullptr), "moe route: weights:");

  MoeCombineParams c;
  c.expert_out = eout.data();
  c.token_rows = rows.data();
  c.token_weights = weights.data();
  c.out = out.data();
  c.rows = 3;
  c.top_k = 2;
  c.hidden = 16;
  c.assignments = 6;
  c.dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return MoeCombineCuda(c, nullptr); });
  MoeCombineParams bad_c = c;
  bad_c.hidden = 0;
  ExpectInvalid(MoeCombineCuda(bad_c, nullptr), "moe combine: hidden:");
  bad_c = c;
  bad_c.token_rows = nullptr;
  ExpectInvalid(MoeCombineCuda(bad_c, nullptr), "moe combine: token_rows:");

  MoeSharedParams sh;
  sh.out = out.data();
  sh.shared = out.data();
  sh.gate_logits = gate.data();
  sh.rows = 3;
  sh.hidden = 16;
  sh.dtype = DType::kF32;
  ExpectUnavailableWithoutDevice([&] { return MoeSharedCuda(sh, nullptr); });
  MoeSharedParams bad_s = sh;
  bad_s.gate_logits = nullptr;
  ExpectInvalid(MoeSharedCuda(bad_s, nullptr), "moe shared: gate_logits:");
}

}  // namespace
}  // namespace deepinfer::kernels
