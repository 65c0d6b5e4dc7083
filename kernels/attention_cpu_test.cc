#include "kernels/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_amx.h"
#include "kernels/attention_avx512.h"

namespace deepinfer::kernels {
namespace {

// Dense reference: K/V as [pos][kv_head][dim].
std::vector<float> Reference(const std::vector<float>& q, const std::vector<float>& k,
                             const std::vector<float>& v, int64_t tokens, int64_t start, int heads,
                             int kv_heads, int dim, int window) {
  std::vector<float> out(tokens * heads * dim, 0.0f);
  const float scale = 1.0f / std::sqrt(float(dim));
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t qp = start + t;
    for (int h = 0; h < heads; ++h) {
      const int kvh = h / (heads / kv_heads);
      std::vector<double> s;
      std::vector<int64_t> pos;
      for (int64_t p = 0; p <= qp; ++p) {
        if (window > 0 && p <= qp - window) continue;
        double d = 0;
        for (int i = 0; i < dim; ++i)
          d += q[(t * heads + h) * dim + i] * k[(p * kv_heads + kvh) * dim + i];
        s.push_back(d * scale);
        pos.push_back(p);
      }
      double mx = -1e30, sum = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (size_t j = 0; j < s.size(); ++j) {
        for (int i = 0; i < dim; ++i) {
          out[(t * heads + h) * dim + i] += s[j] / sum * v[(pos[j] * kv_heads + kvh) * dim + i];
        }
      }
    }
  }
  return out;
}

TEST(PagedAttentionCpuTest, MatchesDenseReferenceThroughAShuffledBlockTable) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  const int heads = 4, kv_heads = 2, dim = 8, block = 4;
  const int64_t start = 9, tokens = 6, total = start + tokens;
  const int64_t blocks_needed = (total + block - 1) / block;
  const std::vector<int32_t> table = {5, 0, 3, 1};  // non-contiguous, out of order
  const int64_t num_blocks = 6;
  const int64_t block_stride = block * kv_heads * dim;
  ASSERT_GE(static_cast<int64_t>(table.size()), blocks_needed);
  std::vector<float> kd(total * kv_heads * dim), vd(total * kv_heads * dim),
      q(tokens * heads * dim);
  for (float& x : kd) x = dist(rng);
  for (float& x : vd) x = dist(rng);
  for (float& x : q) x = dist(rng);
  std::vector<float> kc(num_blocks * block_stride, NAN), vc(num_blocks * block_stride, NAN);
  for (int64_t p = 0; p < total; ++p) {
    for (int64_t i = 0; i < kv_heads * dim; ++i) {
      kc[table[p / block] * block_stride + (p % block) * kv_heads * dim + i] =
          kd[p * kv_heads * dim + i];
      vc[table[p / block] * block_stride + (p % block) * kv_heads * dim + i] =
          vd[p * kv_heads * dim + i];
    }
  }
  auto pool = ThreadPool::Create(2);
  for (int window : {0, 5}) {
    std::vector<float> out(tokens * heads * dim);
    PagedAttentionParams p;
    p.q = q.data();
    p.out = out.data();
    p.num_tokens = tokens;
    p.start_position = start;
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = dim;
    p.k_base = kc.data();
    p.v_base = vc.data();
    p.block_stride = block_stride;
    p.block_size = block;
    p.block_table = table.data();
    p.sliding_window = window;
    p.scale = 1.0f / std::sqrt(float(dim));
    PagedAttentionCpu(p, pool.get());
    const std::vector<float> ref =
        Reference(q, kd, vd, tokens, start, heads, kv_heads, dim, window);
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_FALSE(std::isnan(out[i])) << "read an unwritten slot";
      EXPECT_NEAR(out[i], ref[i], 1e-5) << "window " << window << " element " << i;
    }
  }
}

TEST(PagedAttentionCpuTest, Bf16CacheIsReadAsBf16) {
  // One token attending to itself: output == v exactly (softmax of one score is 1).
  const int dim = 4;
  std::vector<uint16_t> kc(dim), vc(dim);
  const float vals[dim] = {0.5f, -1.25f, 3.0f, 0.0078125f};
  for (int i = 0; i < dim; ++i) {
    kc[i] = F32ToBf16(1.0f);
    vc[i] = F32ToBf16(vals[i]);
  }
  std::vector<float> q(dim, 1.0f), out(dim);
  const int32_t table[1] = {0};
  PagedAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.num_tokens = 1;
  p.num_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = dim;
  p.k_base = kc.data();
  p.v_base = vc.data();
  p.kv_dtype = DType::kBF16;
  p.block_stride = dim;
  p.block_size = 1;
  p.block_table = table;
  p.round_to = DType::kBF16;
  PagedAttentionCpu(p, nullptr);
  for (int i = 0; i < dim; ++i) EXPECT_EQ(out[i], vals[i]);
}

std::vector<CpuIsa> OptimisedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512Bf16, CpuIsa::kAmx}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

// Every optimised path against the reference path: KV types, activation rounding, GQA groups,
// sliding windows, spans with and without a tail of 8, paged through a shuffled block table.
TEST(PagedAttentionCpuTest, OptimisedPathsMatchTheReference) {
  const std::vector<CpuIsa> isas = OptimisedIsas();
  auto pool = ThreadPool::Create(2);
  struct Case {
    int heads, kv_heads, dim, window;
    int64_t start, tokens;
  };
  // The AMX path (bf16 KV and activations, head_dim a multiple of 32) takes 16 / group tokens a
  // task and keys in groups of 16 and blocks of 32: groups of 3 (the demo model), 16 and 32 (too
  // many for one tile: the AVX2 path), windows that start inside a group, several tasks.
  const Case cases[] = {{4, 2, 8, 0, 9, 6},     {8, 2, 64, 0, 0, 37},  {8, 2, 64, 0, 70, 1},
                        {2, 2, 16, 5, 3, 20},   {4, 1, 32, 0, 100, 3}, {6, 2, 64, 0, 47, 9},
                        {6, 2, 64, 64, 300, 7}, {6, 2, 64, 20, 33, 1}, {16, 1, 64, 0, 15, 2},
                        {32, 1, 32, 0, 5, 3},   {4, 2, 128, 9, 61, 4}};
  for (CpuIsa isa : isas) {
    for (DType kv : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType act : {DType::kF32, DType::kBF16}) {
        for (const Case& c : cases) {
          std::mt19937 rng(5);
          std::normal_distribution<float> dist;
          const int block = 16;
          const int64_t total = c.start + c.tokens;
          const int64_t nblocks = (total + block - 1) / block;
          std::vector<int32_t> table(nblocks);
          for (int64_t b = 0; b < nblocks; ++b) table[b] = static_cast<int32_t>(nblocks - 1 - b);
          const int64_t stride = static_cast<int64_t>(block) * c.kv_heads * c.dim;
          std::vector<uint8_t> kc(nblocks * stride * DTypeSize(kv)), vc(kc.size());
          for (int64_t i = 0; i < nblocks * stride; ++i) {
            StoreFromF32(kc.data(), kv, i, dist(rng));
            StoreFromF32(vc.data(), kv, i, dist(rng));
          }
          // Slots no query may attend to hold NaN: past the last token (not written yet in a
          // real cache) and before the first token's window (blocks that may have been freed).
          const int64_t first_key = c.window > 0 ? std::max<int64_t>(0, c.start - c.window + 1) : 0;
          for (int64_t pos = 0; pos < nblocks * block; ++pos) {
            if (pos >= first_key && pos < total) continue;
            const int64_t slot = table[pos / block] * stride + (pos % block) * c.kv_heads * c.dim;
            for (int64_t e = 0; e < c.kv_heads * c.dim; ++e) {
              StoreFromF32(kc.data(), kv, slot + e, std::nanf(""));
              StoreFromF32(vc.data(), kv, slot + e, std::nanf(""));
            }
          }
          std::vector<float> q(c.tokens * c.heads * c.dim);
          for (float& x : q) x = RoundTo(act, dist(rng));
          std::vector<float> want(q.size()), got(q.size());
          PagedAttentionParams p;
          p.q = q.data();
          p.num_tokens = c.tokens;
          p.start_position = c.start;
          p.num_heads = c.heads;
          p.num_kv_heads = c.kv_heads;
          p.head_dim = c.dim;
          p.k_base = kc.data();
          p.v_base = vc.data();
          p.kv_dtype = kv;
          p.block_stride = stride;
          p.block_size = block;
          p.block_table = table.data();
          p.sliding_window = c.window;
          p.scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
          p.round_to = act;
          p.out = want.data();
          PagedAttentionCpuReference(p, nullptr);
          p.out = got.data();
          PagedAttentionCpuWithIsa(p, pool.get(), isa);
          // Summation order and exp's last ulp; in bf16 a score or probability may round the
          // other way, which moves an output by about one bf16 ulp of the values.
          const float tol = act == DType::kBF16 ? 0.03f : 2e-5f;
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i])))
                << CpuIsaName(isa) << " kv " << DTypeName(kv) << " act " << DTypeName(act)
                << " dim " << c.dim << " tokens " << c.tokens << " at " << i;
          }
        }
      }
    }
  }
}

// Attention over a bf16 cache with bf16 activations, the engine's case for a bf16 model; the
// caller sets q, out and the tokens.
PagedAttentionParams Bf16Params(int heads, int kv_heads, int dim, int block, int64_t stride,
                                const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                                const int32_t* table) {
  PagedAttentionParams p;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = dim;
  p.k_base = k.data();
  p.v_base = v.data();
  p.kv_dtype = DType::kBF16;
  p.block_stride = stride;
  p.block_size = block;
  p.block_table = table;
  p.scale = 0.125f;
  p.round_to = DType::kBF16;
  return p;
}

// The batched entry computes every sequence exactly as a single call does.
TEST(PagedAttentionCpuTest, BatchMatchesSingleCalls) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist;
  const int heads = 8, kv_heads = 2, dim = 64, block = 16;
  const int64_t starts[3] = {0, 40, 17}, tokens[3] = {20, 1, 3};
  const int64_t blocks_per_seq = 4;
  const int64_t stride = static_cast<int64_t>(block) * kv_heads * dim;
  std::vector<uint16_t> kc(3 * blocks_per_seq * stride), vc(kc.size());
  for (auto& x : kc) x = F32ToBf16(dist(rng));
  for (auto& x : vc) x = F32ToBf16(dist(rng));
  std::vector<std::vector<int32_t>> tables(3);
  std::vector<std::vector<float>> qs(3), want(3), got(3);
  std::vector<PagedAttentionParams> ps(3);
  for (int s = 0; s < 3; ++s) {
    for (int b = 0; b < blocks_per_seq; ++b) tables[s].push_back(s * blocks_per_seq + b);
    qs[s].resize(tokens[s] * heads * dim);
    for (float& x : qs[s]) x = RoundTo(DType::kBF16, dist(rng));
    want[s].resize(qs[s].size());
    got[s].resize(qs[s].size());
    PagedAttentionParams& p = ps[s];
    p = Bf16Params(heads, kv_heads, dim, block, stride, kc, vc, tables[s].data());
    p.q = qs[s].data();
    p.num_tokens = tokens[s];
    p.start_position = starts[s];
    p.out = want[s].data();
    PagedAttentionCpu(p, nullptr);
    p.out = got[s].data();
  }
  auto pool = ThreadPool::Create(2);
  PagedAttentionBatchCpu(ps.data(), 3, pool.get());
  for (int s = 0; s < 3; ++s) EXPECT_EQ(got[s], want[s]) << "sequence " << s;
}

// A token's output does not depend on the other tokens of its call: verifying several draft
// tokens in one call gives each exactly what decoding it alone gives (speculative decoding's
// greedy output relies on this), with and without a sliding window, on every path. On tiles, with
// the demo model's group of 3: 2 tokens (6 rows: the softmax by row, as one token's 3), 6 tokens
// (one task: a 5-token tile by key and a 1-token tile by row) and 23 (a task of four 5-token tiles
// and one of a 3-token tile: 9 rows, by key).
TEST(PagedAttentionCpuTest, TokensAreInvariantToTheirCall) {
  const int heads = 6, kv_heads = 2, dim = 64, block = 16;
  const int64_t start = 90, max_tokens = 23, total = start + max_tokens;
  const int64_t nblocks = (total + block - 1) / block;
  const int64_t stride = static_cast<int64_t>(block) * kv_heads * dim;
  std::mt19937 rng(21);
  std::normal_distribution<float> dist;
  std::vector<uint16_t> kc(nblocks * stride), vc(kc.size());
  for (auto& x : kc) x = F32ToBf16(dist(rng));
  for (auto& x : vc) x = F32ToBf16(dist(rng));
  std::vector<int32_t> table(nblocks);
  for (int64_t b = 0; b < nblocks; ++b) table[b] = static_cast<int32_t>((b * 3) % nblocks);
  std::vector<float> q(max_tokens * heads * dim);
  for (float& x : q) x = RoundTo(DType::kBF16, dist(rng));
  auto pool = ThreadPool::Create(2);
  for (CpuIsa isa : OptimisedIsas()) {
    for (const auto& [window, tokens] :
         {std::pair<int, int64_t>{0, 23}, {40, 23}, {0, 6}, {40, 2}}) {
      PagedAttentionParams p =
          Bf16Params(heads, kv_heads, dim, block, stride, kc, vc, table.data());
      p.sliding_window = window;
      std::vector<float> all(tokens * heads * dim);
      p.q = q.data();
      p.out = all.data();
      p.num_tokens = tokens;
      p.start_position = start;
      // The demo model's shape: the AMX and AVX-512 paths take it.
      if (isa == CpuIsa::kAmx) {
        ASSERT_TRUE(AttentionAmxSupports(p));
      } else if (isa == CpuIsa::kAvx512Bf16) {
        ASSERT_TRUE(AttentionAvx512Supports(p));
      }
      PagedAttentionCpuWithIsa(p, pool.get(), isa);
      for (int64_t t = 0; t < tokens; ++t) {
        std::vector<float> one(heads * dim);
        PagedAttentionParams single = p;
        single.q = q.data() + t * heads * dim;
        single.out = one.data();
        single.num_tokens = 1;
        single.start_position = start + t;
        PagedAttentionCpuWithIsa(single, nullptr, isa);
        for (int64_t i = 0; i < heads * dim; ++i) {
          ASSERT_EQ(one[i], all[t * heads * dim + i])
              << CpuIsaName(isa) << " window " << window << " tokens " << tokens << " token " << t
              << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::kernels
