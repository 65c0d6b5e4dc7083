#include "kernels/softmax_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

double SumExpDouble(const std::vector<float>& x, float shift) {
  double sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - static_cast<double>(shift));
  return sum;
}

// Every path against max_element and a double-precision sum, on rows of logits of every length
// class (below one vector, tails of 8 and 32, a vocabulary), spreads from flat to peaked, and
// entries far below the max (exp underflows to 0).
TEST(SoftmaxCpuTest, EveryPathMatchesTheDoubleReference) {
  std::mt19937 rng(7);
  for (int64_t n : {1, 3, 8, 13, 32, 45, 100, 4096, 4099, 32000}) {
    for (float sd : {0.1f, 3.0f, 30.0f}) {
      std::normal_distribution<float> dist(1.5f, sd);
      std::vector<float> x(n);
      for (float& v : x) v = dist(rng);
      if (n > 4) x[n / 2] = -1e4f;
      const float want_max = *std::max_element(x.begin(), x.end());
      const double want = SumExpDouble(x, want_max);
      for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAmx}) {
        if (!CpuSupports(isa)) continue;
        SCOPED_TRACE(::testing::Message() << CpuIsaName(isa) << " n " << n << " sd " << sd);
        EXPECT_EQ(RowMaxCpuWithIsa(x.data(), n, isa), want_max);
        const double got = SumExpCpuWithIsa(x.data(), n, want_max, isa);
        EXPECT_NEAR(got, want, 2e-6 * want);
        EXPECT_GE(got, 1.0 - 1e-6);  // the max's own term
        // A shift other than the max (the sampler's temperature-free normaliser uses the max,
        // but nothing requires it).
        EXPECT_NEAR(SumExpCpuWithIsa(x.data(), n, want_max + 2.0f, isa), want * std::exp(-2.0),
                    2e-6 * want);
      }
      EXPECT_EQ(RowMaxCpu(x.data(), n), want_max);
    }
  }
  EXPECT_EQ(SumExpCpu(nullptr, 0, 0.0f), 0.0);
}

// The max found at any position, including the last entry of a tail and the first of a row.
TEST(SoftmaxCpuTest, FindsTheMaxAnywhere) {
  for (int64_t n : {1, 9, 40, 4096}) {
    for (int64_t at = 0; at < n; at += std::max<int64_t>(1, n / 7)) {
      for (int64_t where : {at, n - 1}) {
        std::vector<float> x(n, -5.0f);
        x[where] = 2.5f;
        for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
          if (!CpuSupports(isa)) continue;
          EXPECT_EQ(RowMaxCpuWithIsa(x.data(), n, isa), 2.5f) << n << " " << where;
        }
      }
    }
  }
}

// The arg-max is std::max_element's on every row: ties (the first wins), NaN entries (skipped
// after the first entry, kept as the first), all -inf, tails.
TEST(SoftmaxCpuTest, ArgMaxIsMaxElements) {
  std::mt19937 rng(11);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 2, 7, 8, 9, 31, 64, 4096, 4101}) {
    for (int trial = 0; trial < 40; ++trial) {
      // Few distinct values make ties common.
      std::uniform_int_distribution<int> value(-3, 3);
      std::vector<float> x(n);
      for (float& v : x) v = static_cast<float>(value(rng));
      std::uniform_int_distribution<int64_t> at(0, n - 1);
      if (trial % 4 == 1) x[at(rng)] = nan;
      if (trial % 4 == 2) x[0] = nan;
      if (trial % 8 == 3) std::fill(x.begin(), x.end(), -inf);
      if (trial % 8 == 7) x[at(rng)] = inf;
      const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
      for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
        if (!CpuSupports(isa)) continue;
        ASSERT_EQ(ArgMaxCpuWithIsa(x.data(), n, isa), want)
            << CpuIsaName(isa) << " n " << n << " trial " << trial;
      }
      ASSERT_EQ(ArgMaxCpu(x.data(), n), want);
    }
  }
}

}  // namespace
}  // namespace deepinfer::kernels
