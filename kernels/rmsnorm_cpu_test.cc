#include "kernels/rmsnorm_cpu.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(RmsNormCpuTest, HandComputedF32) {
  // x = [3, 4]: mean(x^2) = 12.5, rms = sqrt(12.5 + eps).
  const std::vector<float> x = {3.0f, 4.0f};
  const std::vector<float> w = {1.0f, 2.0f};
  std::vector<float> y(2);
  RmsNormParams p;
  p.input = x.data();
  p.weight = w.data();
  p.output = y.data();
  p.rows = 1;
  p.hidden = 2;
  p.eps = 1e-5f;
  p.dtype = DType::kF32;
  ASSERT_TRUE(RmsNormCpu(p).ok());
  const float rms = std::sqrt(12.5f + 1e-5f);
  EXPECT_FLOAT_EQ(y[0], 3.0f / rms);
  EXPECT_FLOAT_EQ(y[1], 2.0f * 4.0f / rms);
}

TEST(RmsNormCpuTest, Bf16FollowsLlamaRoundingOrder) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t rows = 3, hidden = 67;
  std::vector<uint16_t> x(rows * hidden), w(hidden), y(rows * hidden);
  for (auto& v : x) v = F32ToBf16(dist(rng));
  for (auto& v : w) v = F32ToBf16(1.0f + 0.1f * dist(rng));
  RmsNormParams p;
  p.input = x.data();
  p.weight = w.data();
  p.output = y.data();
  p.rows = rows;
  p.hidden = hidden;
  p.eps = 1e-6f;
  p.dtype = DType::kBF16;
  ASSERT_TRUE(RmsNormCpu(p).ok());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < hidden; ++i) {
      const double v = Bf16ToF32(x[r * hidden + i]);
      ss += v * v;
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / hidden) + 1e-6f);
    for (int64_t i = 0; i < hidden; ++i) {
      const float normalized = RoundTo(DType::kBF16, Bf16ToF32(x[r * hidden + i]) * inv);
      const uint16_t expected = F32ToBf16(Bf16ToF32(w[i]) * normalized);
      EXPECT_EQ(y[r * hidden + i], expected) << r << "," << i;
    }
  }
}

TEST(RmsNormCpuTest, FusedResidualEqualsAddThenNorm) {
  const int64_t rows = 2, hidden = 5;
  std::vector<float> x = {1, 2, 3, 4, 5, -1, -2, -3, -4, -5};
  std::vector<float> res = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 1, 1, 1, 1, 1};
  std::vector<float> w(hidden, 1.5f);
  std::vector<float> fused(rows * hidden), res_out(rows * hidden);
  RmsNormParams p;
  p.input = x.data();
  p.weight = w.data();
  p.output = fused.data();
  p.residual = res.data();
  p.residual_out = res_out.data();
  p.rows = rows;
  p.hidden = hidden;
  p.dtype = DType::kF32;
  ASSERT_TRUE(RmsNormCpu(p).ok());

  std::vector<float> sum(rows * hidden), plain(rows * hidden);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + res[i];
  RmsNormParams q = p;
  q.input = sum.data();
  q.output = plain.data();
  q.residual = nullptr;
  q.residual_out = nullptr;
  ASSERT_TRUE(RmsNormCpu(q).ok());
  EXPECT_EQ(res_out, sum);
  EXPECT_EQ(fused, plain);
}

TEST(RmsNormCpuTest, InPlaceAndGemmaOffset) {
  std::vector<float> x = {1, -1, 1, -1};  // rms = 1
  std::vector<float> w = {0, 1, 2, 3};
  RmsNormParams p;
  p.input = x.data();
  p.output = x.data();
  p.weight = w.data();
  p.rows = 1;
  p.hidden = 4;
  p.eps = 1e-12f;
  p.weight_offset = 1.0f;
  p.dtype = DType::kF32;
  ASSERT_TRUE(RmsNormCpu(p).ok());
  EXPECT_FLOAT_EQ(x[0], 1.0f);
  EXPECT_FLOAT_EQ(x[1], -2.0f);
  EXPECT_FLOAT_EQ(x[2], 3.0f);
  EXPECT_FLOAT_EQ(x[3], -4.0f);
}

TEST(RmsNormCpuTest, RejectsBadParamsNamingTheField) {
  float x = 1, w = 1, y = 0;
  RmsNormParams p;
  p.input = &x;
  p.weight = &w;
  p.output = &y;
  p.rows = 1;
  p.hidden = 0;
  p.dtype = DType::kF32;
  absl::Status s = RmsNormCpu(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hidden"), absl::string_view::npos);
  p.hidden = 1;
  p.eps = 0;
  EXPECT_NE(RmsNormCpu(p).message().find("eps"), absl::string_view::npos);
  p.eps = 1e-6f;
  p.residual = &x;
  EXPECT_NE(RmsNormCpu(p).message().find("residual"), absl::string_view::npos);
  p.residual = nullptr;
  p.weight = nullptr;
  EXPECT_NE(RmsNormCpu(p).message().find("weight"), absl::string_view::npos);
}

// Every optimised path against the reference path: rounding types, fused residual (in place),
// Gemma's offset, widths with several vectors.
TEST(RmsNormCpuTest, OptimisedPathsMatchTheReference) {
  if (!CpuSupports(CpuIsa::kAvx2)) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(4);
  std::normal_distribution<float> dist;
  const int64_t rows = 5;
  for (int64_t hidden : {8, 64, 512}) {
    for (DType rt : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool residual : {false, true}) {
        for (float offset : {0.0f, 1.0f}) {
          std::vector<float> x(rows * hidden), res(rows * hidden), w(hidden);
          for (float& v : x) v = RoundTo(rt, dist(rng));
          for (float& v : res) v = RoundTo(rt, dist(rng));
          for (float& v : w) v = RoundTo(rt, dist(rng));
          std::vector<float> y_ref(x.size()), y_opt(x.size()), res_ref = res, res_opt = res;
          RmsNormParams p;
          p.input = x.data();
          p.weight = w.data();
          p.rows = rows;
          p.hidden = hidden;
          p.eps = 1e-5f;
          p.weight_offset = offset;
          p.dtype = DType::kF32;
          p.round_to = rt;
          p.output = y_ref.data();
          if (residual) p.residual = p.residual_out = res_ref.data();
          ASSERT_TRUE(RmsNormCpuWithIsa(p, CpuIsa::kScalar).ok());
          p.output = y_opt.data();
          if (residual) p.residual = p.residual_out = res_opt.data();
          ASSERT_TRUE(RmsNormCpuWithIsa(p, CpuIsa::kAvx2).ok());
          EXPECT_EQ(res_opt, res_ref);
          const float ulp = rt == DType::kF32 ? 2e-7f : (rt == DType::kBF16 ? 8e-3f : 1e-3f);
          for (size_t i = 0; i < y_ref.size(); ++i) {
            ASSERT_NEAR(y_opt[i], y_ref[i], ulp * std::fabs(y_ref[i]) + 1e-30f)
                << DTypeName(rt) << " hidden " << hidden << " residual " << residual;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace deepinfer::kernels
