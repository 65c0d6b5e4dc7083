#include "kernels/linear_cpu.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(LinearCpuTest, MatchesNaiveForEveryWeightTypeWithBias) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  const int64_t m = 5, n = 37, k = 70;
  auto pool = ThreadPool::Create(2);
  for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<float> x(m * k);
    for (float& v : x) v = dist(rng);
    std::vector<uint8_t> w(n * k * DTypeSize(wt)), b(n * DTypeSize(wt));
    for (int64_t i = 0; i < n * k; ++i) StoreFromF32(w.data(), wt, i, dist(rng));
    for (int64_t i = 0; i < n; ++i) StoreFromF32(b.data(), wt, i, dist(rng));
    std::vector<float> y(m * n);
    LinearParams p;
    p.x = x.data();
    p.weight = w.data();
    p.weight_dtype = wt;
    p.bias = b.data();
    p.y = y.data();
    p.m = m;
    p.n = n;
    p.k = k;
    LinearCpu(p, pool.get());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = LoadAsF32(b.data(), wt, j);
        for (int64_t l = 0; l < k; ++l)
          ref += double(x[i * k + l]) * LoadAsF32(w.data(), wt, j * k + l);
        EXPECT_NEAR(y[i * n + j], ref, 1e-4 * (1 + std::fabs(ref))) << DTypeName(wt);
      }
    }
  }
}

TEST(LinearCpuTest, RoundsToActivationTypeAndHonoursRowStride) {
  const std::vector<float> x = {1.0f, 1.0f};
  const std::vector<float> w = {1.0f, 1.0f / 1024};  // 1 + 2^-10 is not a bf16 value
  std::vector<float> y(3, -7.0f);
  LinearParams p;
  p.x = x.data();
  p.weight = w.data();
  p.y = y.data();
  p.m = 1;
  p.n = 1;
  p.k = 2;
  p.ldy = 3;
  p.round_to = DType::kBF16;
  LinearCpu(p, nullptr);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -7.0f);  // untouched beyond n
  p.round_to = DType::kF32;
  LinearCpu(p, nullptr);
  EXPECT_EQ(y[0], 1.0f + 1.0f / 1024);
}

// The optimised paths this CPU runs (each compared with the reference).
std::vector<CpuIsa> OptimisedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512Bf16, CpuIsa::kAmx}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

struct RandomProblem {
  std::vector<float> x;
  std::vector<uint8_t> w, b;
};

RandomProblem MakeProblem(int64_t m, int64_t n, int64_t k, DType wt, DType act, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  RandomProblem r;
  r.x.resize(m * k);
  // Activations hold values of the model's type, as in the engine.
  for (float& v : r.x) v = RoundTo(act, dist(rng));
  r.w.resize(n * k * DTypeSize(wt));
  r.b.resize(n * DTypeSize(wt));
  for (int64_t i = 0; i < n * k; ++i) StoreFromF32(r.w.data(), wt, i, dist(rng));
  for (int64_t i = 0; i < n; ++i) StoreFromF32(r.b.data(), wt, i, dist(rng));
  return r;
}

// Every optimised path against the reference path, over shapes that exercise every tail (k not a
// multiple of 16, n not a multiple of 4 or 16, odd m) and the engine's real shapes.
TEST(LinearCpuTest, OptimisedPathsMatchTheReference) {
  auto pool = ThreadPool::Create(2);
  const std::vector<CpuIsa> isas = OptimisedIsas();
  struct Shape {
    int64_t m, n, k;
  };
  // The AMX path's tiles are 16 x 16 outputs over 32 k, 4 sharing an activation tile: m, n and k
  // on both sides of 16 and 32 and of 64 outputs.
  const Shape shapes[] = {{1, 1, 1},     {1, 5, 15},     {2, 7, 16},    {3, 33, 47},  {5, 64, 64},
                          {1, 128, 512}, {7, 130, 1408}, {32, 96, 512}, {16, 16, 32}, {17, 65, 33},
                          {15, 80, 96},  {40, 200, 31},  {33, 48, 384}};
  for (CpuIsa isa : isas) {
    for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType act : {DType::kF32, DType::kBF16}) {
        for (const Shape& s : shapes) {
          for (bool bias : {false, true}) {
            RandomProblem r = MakeProblem(s.m, s.n, s.k, wt, act, 7);
            const int64_t ldy = s.n + 3;
            std::vector<float> want(s.m * ldy, -5.0f), got(s.m * ldy, -5.0f);
            LinearParams p;
            p.x = r.x.data();
            p.weight = r.w.data();
            p.weight_dtype = wt;
            p.bias = bias ? r.b.data() : nullptr;
            p.m = s.m;
            p.n = s.n;
            p.k = s.k;
            p.ldy = ldy;
            p.round_to = act;
            p.y = want.data();
            LinearCpuReference(p, nullptr);
            p.y = got.data();
            LinearCpuWithIsa(p, pool.get(), isa);
            // Only the f32 summation order differs: a few f32 ulps of the magnitude, plus one
            // activation-type ulp when the rounding lands on the other side of a tie.
            const float act_ulp = act == DType::kBF16 ? 1.0f / 128 : 0.0f;
            for (int64_t i = 0; i < s.m; ++i) {
              for (int64_t j = 0; j < ldy; ++j) {
                const float w = want[i * ldy + j], g = got[i * ldy + j];
                if (j >= s.n) {
                  ASSERT_EQ(g, -5.0f) << "wrote past n";
                  continue;
                }
                const float scale = std::sqrt(static_cast<float>(s.k)) + std::fabs(w);
                ASSERT_NEAR(g, w, 1e-5f * scale + act_ulp * std::fabs(w))
                    << CpuIsaName(isa) << " " << DTypeName(wt) << " act " << DTypeName(act)
                    << " m=" << s.m << " n=" << s.n << " k=" << s.k << " at " << i << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

// A row's result does not depend on the batch it is computed in (chunked prefill, batched decode
// and speculative verification rely on this): bit-identical whatever m, whatever the other rows
// (bf16 values or not) and whatever the thread split, on every path.
TEST(LinearCpuTest, RowsAreBatchInvariant) {
  const int64_t m = 37, n = 70, k = 200;
  std::vector<CpuIsa> isas = OptimisedIsas();
  isas.push_back(CpuIsa::kScalar);
  for (CpuIsa isa : isas) {
    for (bool f32_row : {false, true}) {
      RandomProblem r = MakeProblem(m, n, k, DType::kBF16, DType::kBF16, 11);
      // One row of values that are not bf16 values, which the AMX path splits into parts.
      if (f32_row) {
        for (int64_t l = 0; l < k; ++l) r.x[20 * k + l] *= 1.0f + 1.0f / 1024;
      }
      auto pool = ThreadPool::Create(2);
      LinearParams p;
      p.x = r.x.data();
      p.weight = r.w.data();
      p.weight_dtype = DType::kBF16;
      p.m = m;
      p.n = n;
      p.k = k;
      std::vector<float> all(m * n);
      p.y = all.data();
      LinearCpuWithIsa(p, pool.get(), isa);
      for (int64_t i = 0; i < m; ++i) {
        std::vector<float> one(n);
        LinearParams q = p;
        q.x = r.x.data() + i * k;
        q.m = 1;
        q.y = one.data();
        LinearCpuWithIsa(q, nullptr, isa);
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(one[j], all[i * n + j]) << CpuIsaName(isa) << " " << i << "," << j;
        }
      }
    }
  }
}

TEST(LinearCpuTest, MultiRunsEachProjectionLikeASingleCall) {
  const int64_t m = 3, k = 96;
  auto pool = ThreadPool::Create(2);
  RandomProblem a = MakeProblem(m, 50, k, DType::kBF16, DType::kBF16, 1);
  RandomProblem b = MakeProblem(m, 17, k, DType::kBF16, DType::kBF16, 2);
  std::vector<float> ya(m * 50), yb(m * 17), wa(m * 50), wb(m * 17);
  LinearParams ps[2];
  ps[0].x = a.x.data();
  ps[0].weight = a.w.data();
  ps[0].weight_dtype = DType::kBF16;
  ps[0].m = m;
  ps[0].n = 50;
  ps[0].k = k;
  ps[0].y = ya.data();
  ps[0].round_to = DType::kBF16;
  ps[1] = ps[0];
  ps[1].x = b.x.data();
  ps[1].weight = b.w.data();
  ps[1].bias = b.b.data();
  ps[1].n = 17;
  ps[1].y = yb.data();
  LinearCpuMulti(ps, 2, pool.get());
  LinearParams single = ps[0];
  single.y = wa.data();
  LinearCpu(single, nullptr);
  single = ps[1];
  single.y = wb.data();
  LinearCpu(single, nullptr);
  EXPECT_EQ(ya, wa);
  EXPECT_EQ(yb, wb);
}

#if defined(__x86_64__)
// What a cost model is told of each path's passes over the weights (the rows its tiles take).
TEST(LinearCpuTest, RowsPerPassFollowThePath) {
  EXPECT_EQ(LinearRowsPerPass(DType::kBF16, CpuIsa::kScalar), 1);
  EXPECT_EQ(LinearRowsPerPass(DType::kBF16, CpuIsa::kAvx2), 2);
  EXPECT_EQ(LinearRowsPerPass(DType::kBF16, CpuIsa::kAvx512Bf16), 4);
  EXPECT_EQ(LinearRowsPerPass(DType::kBF16, CpuIsa::kAmx), 16);
  // Other weights take the AVX2 path on every x86 ISA.
  EXPECT_EQ(LinearRowsPerPass(DType::kF32, CpuIsa::kAvx512Bf16), 2);
  EXPECT_EQ(LinearRowsPerPass(DType::kF16, CpuIsa::kAmx), 2);
}
#endif

}  // namespace
}  // namespace deepinfer::kernels
