#include "kernels/activation_cpu.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

// Every optimised path against the reference path, including extreme inputs where exp
// overflows or underflows, and lengths with a tail of 8.
TEST(SwiGluCpuTest, OptimisedPathsMatchTheReference) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  auto pool = ThreadPool::Create(2);
  for (int64_t count : {1, 7, 8, 100, 20003}) {
    std::vector<float> gate(count), up(count);
    for (int64_t i = 0; i < count; ++i) {
      gate[i] = dist(rng);
      up[i] = dist(rng);
    }
    gate[0] = count > 1 ? 100.0f : -100.0f;
    if (count > 2) gate[1] = -100.0f;
    for (DType rt : {DType::kF32, DType::kBF16, DType::kF16}) {
      std::vector<float> want(count), got(count);
      SwiGluCpuWithIsa(gate.data(), up.data(), want.data(), count, rt, nullptr, CpuIsa::kScalar);
      if (!CpuSupports(CpuIsa::kAvx2)) continue;
      SwiGluCpuWithIsa(gate.data(), up.data(), got.data(), count, rt, pool.get(), CpuIsa::kAvx2);
      const float ulp = rt == DType::kF32 ? 4e-7f : (rt == DType::kBF16 ? 8e-3f : 1e-3f);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_NEAR(got[i], want[i], 2 * ulp * std::fabs(want[i]) + 1e-30f)
            << DTypeName(rt) << " gate " << gate[i] << " up " << up[i];
      }
    }
  }
}

TEST(SwiGluCpuTest, MatchesTheFormula) {
  const float gate[] = {0.0f, 1.0f, -2.0f};
  const float up[] = {3.0f, 2.0f, 0.5f};
  float out[3];
  SwiGluCpu(gate, up, out, 3, DType::kF32, nullptr);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(out[i], gate[i] / (1 + std::exp(-gate[i])) * up[i], 1e-6f);
  }
}

}  // namespace
}  // namespace deepinfer::kernels
