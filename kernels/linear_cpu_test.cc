#include "kernels/linear_cpu.h"

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
        for (int64_t l = 0; l < k; ++l) ref += double(x[i * k + l]) * LoadAsF32(w.data(), wt, j * k + l);
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

}  // namespace
}  // namespace deepinfer::kernels
