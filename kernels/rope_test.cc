#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(RopeTest, DefaultInvFreq) {
  std::vector<float> inv(4);
  RopeInvFreq(RopeScaling{}, 8, inv.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(inv[i], std::pow(10000.0f, -2.0f * i / 8.0f));
}

TEST(RopeTest, LinearDividesByFactor) {
  std::vector<float> plain(64), linear(64);
  RopeScaling s;
  RopeInvFreq(s, 128, plain.data());
  s.type = RopeScalingType::kLinear;
  s.factor = 4.0;
  RopeInvFreq(s, 128, linear.data());
  for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(linear[i], plain[i] / 4.0f);
}

TEST(RopeTest, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  RopeScaling s;
  s.theta = 500000.0;
  std::vector<float> plain(64), scaled(64);
  RopeInvFreq(s, 128, plain.data());
  s.type = RopeScalingType::kLlama3;
  s.factor = 8.0;
  s.original_max_position_embeddings = 8192;
  RopeInvFreq(s, 128, scaled.data());
  int high = 0, low = 0, medium = 0;
  for (int i = 0; i < 64; ++i) {
    const float wavelen = 2.0f * static_cast<float>(M_PI) / plain[i];
    if (wavelen < 8192.0f / 4.0f) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i]) << i;
      ++high;
    } else if (wavelen > 8192.0f) {
      EXPECT_FLOAT_EQ(scaled[i], plain[i] / 8.0f) << i;
      ++low;
    } else {
      EXPECT_LT(scaled[i], plain[i]) << i;
      EXPECT_GT(scaled[i], plain[i] / 8.0f) << i;
      ++medium;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

TEST(RopeTest, RotatesPairsAndPositionZeroIsIdentity) {
  std::vector<float> inv(2);
  RopeInvFreq(RopeScaling{}, 4, inv.data());
  // Two tokens, one head of 4: position 0 leaves it alone; position 3 rotates (x0, x2) by
  // 3 * inv[0] = 3 rad and (x1, x3) by 3 * inv[1].
  std::vector<float> x = {1, 2, 3, 4, 1, 2, 3, 4};
  const int64_t positions[] = {0, 3};
  ApplyRopeCpu(x.data(), 2, 4, 1, 4, positions, inv.data(), DType::kF32);
  EXPECT_FLOAT_EQ(x[0], 1);
  EXPECT_FLOAT_EQ(x[3], 4);
  const float a0 = 3.0f * inv[0], a1 = 3.0f * inv[1];
  EXPECT_NEAR(x[4], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[6], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[5], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(x[7], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
}

}  // namespace
}  // namespace deepinfer::kernels
