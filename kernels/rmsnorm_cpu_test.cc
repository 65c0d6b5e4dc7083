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

}  // namespace
}  // namespace deepinfer::kernels
