// Paged-attention benchmark (not a test): a decode batch's attention for one layer, the shapes
// of decode and verification steps (1 token per sequence, or the known token and its drafts),
// each ISA path in the same run. Each figure is the median of --reps timings of --iters calls,
// in microseconds per sequence (one layer), on one thread.
//
//   bazel run -c opt //kernels:attention_bench -- --batch 32 --context 1024 --tokens 1,2,5
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "kernels/attention_cpu.h"
#include "kernels/cpu_features.h"
#include "kernels/dtype.h"

ABSL_FLAG(int, batch, 32, "Sequences per call.");
ABSL_FLAG(int, context, 1024, "Tokens already cached per sequence.");
ABSL_FLAG(std::string, tokens, "1,2,5", "Comma-separated new tokens per sequence.");
ABSL_FLAG(int, heads, 6, "Query heads (default: the demo model's).");
ABSL_FLAG(int, kv_heads, 2, "KV heads.");
ABSL_FLAG(int, head_dim, 64, "Head dimension.");
ABSL_FLAG(int, iters, 20, "Calls per timing.");
ABSL_FLAG(int, reps, 5, "Timings per figure (the median is printed).");

namespace {

using deepinfer::kernels::CpuIsa;
using deepinfer::kernels::DType;
using deepinfer::kernels::PagedAttentionParams;

struct Batch {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> table;  // per sequence, blocks_per_seq entries
  std::vector<float> q, out;
  std::vector<PagedAttentionParams> params;
};

// Every sequence's cache in its own shuffled blocks (as a long-running node's pool), bf16 K/V,
// bf16-valued queries: the layout a bf16 model's decode node attends over.
Batch MakeBatch(int batch, int64_t context, int64_t tokens, int heads, int kv_heads, int dim) {
  const int block = 16;
  const int64_t total = context + tokens;
  const int64_t per_seq = (total + block - 1) / block;
  const int64_t nblocks = per_seq * batch;
  const int64_t stride = static_cast<int64_t>(block) * kv_heads * dim;
  Batch b;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  b.k.resize(nblocks * stride);
  b.v.resize(nblocks * stride);
  for (auto& x : b.k) x = deepinfer::kernels::F32ToBf16(dist(rng));
  for (auto& x : b.v) x = deepinfer::kernels::F32ToBf16(dist(rng));
  b.table.resize(nblocks);
  for (int64_t i = 0; i < nblocks; ++i) b.table[i] = static_cast<int32_t>(i);
  if (getenv("NOSHUF") == nullptr) std::shuffle(b.table.begin(), b.table.end(), rng);
  b.q.resize(static_cast<size_t>(batch) * tokens * heads * dim);
  for (float& x : b.q) x = deepinfer::kernels::RoundTo(DType::kBF16, dist(rng));
  b.out.resize(b.q.size());
  for (int s = 0; s < batch; ++s) {
    PagedAttentionParams p;
    p.q = b.q.data() + static_cast<int64_t>(s) * tokens * heads * dim;
    p.out = b.out.data() + static_cast<int64_t>(s) * tokens * heads * dim;
    p.num_tokens = tokens;
    p.start_position = context;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = dim;
    p.k_base = b.k.data();
    p.v_base = b.v.data();
    p.kv_dtype = DType::kBF16;
    p.block_stride = stride;
    p.block_size = block;
    p.block_table = b.table.data() + s * per_seq;
    p.scale = 1.0f / std::sqrt(static_cast<float>(dim));
    p.round_to = DType::kBF16;
    b.params.push_back(p);
  }
  return b;
}

// Median microseconds per sequence of one batch call on `isa`.
double Time(const Batch& b, CpuIsa isa) {
  const int iters = absl::GetFlag(FLAGS_iters);
  std::vector<double> us;
  for (int r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      for (const PagedAttentionParams& p : b.params) {
        deepinfer::kernels::PagedAttentionCpuWithIsa(p, nullptr, isa);
      }
    }
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters /
                 static_cast<double>(b.params.size()));
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int context = absl::GetFlag(FLAGS_context);
  const int heads = absl::GetFlag(FLAGS_heads), kv_heads = absl::GetFlag(FLAGS_kv_heads);
  const int dim = absl::GetFlag(FLAGS_head_dim);
  std::vector<int> tokens;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(t, &n) || n < 1) {
      std::fprintf(stderr, "--tokens: expected positive integers, got \"%s\"\n",
                   std::string(t).c_str());
      return 2;
    }
    tokens.push_back(n);
  }
  if (batch < 1 || context < 0 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || dim < 8 ||
      absl::GetFlag(FLAGS_iters) < 1 || absl::GetFlag(FLAGS_reps) < 1) {
    std::fprintf(stderr,
                 "--batch, --iters, --reps >= 1, --context >= 0, --heads a multiple of "
                 "--kv_heads, --head_dim >= 8\n");
    return 2;
  }
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512Bf16, CpuIsa::kAmx}) {
    if (deepinfer::kernels::CpuSupports(isa)) isas.push_back(isa);
  }
  std::printf("batch %d  context %d  heads %d/%d  head_dim %d  (us per sequence, one layer)\n",
              batch, context, heads, kv_heads, dim);
  std::printf("%7s", "tokens");
  for (CpuIsa isa : isas) std::printf("  %10s", deepinfer::kernels::CpuIsaName(isa));
  std::printf("\n");
  for (int t : tokens) {
    const Batch b = MakeBatch(batch, context, t, heads, kv_heads, dim);
    std::printf("%7d", t);
    for (CpuIsa isa : isas) std::printf("  %10.2f", Time(b, isa));
    std::printf("\n");
  }
  return 0;
}
