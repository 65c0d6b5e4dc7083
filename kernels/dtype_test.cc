#include "kernels/dtype.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(DTypeTest, Bf16KnownValues) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(F32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd mantissa) and 1.015625: rounds up to even.
  EXPECT_EQ(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);              // largest finite
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);              // rounds to inf
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(std::nanf("")))));
}

TEST(DTypeTest, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00) continue;  // inf / NaN
    EXPECT_EQ(F32ToF16(F16ToF32(bits)), bits) << std::hex << h;
  }
}

TEST(DTypeTest, Bf16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7f80) == 0x7f80) continue;
    EXPECT_EQ(F32ToBf16(Bf16ToF32(bits)), bits) << std::hex << h;
  }
}

TEST(DTypeTest, LoadStoreAndRound) {
  uint16_t buf[2];
  StoreFromF32(buf, DType::kBF16, 1, 3.14159f);
  EXPECT_EQ(LoadAsF32(buf, DType::kBF16, 1), RoundTo(DType::kBF16, 3.14159f));
  EXPECT_EQ(RoundTo(DType::kBF16, 3.14159f), 3.140625f);
  EXPECT_EQ(RoundTo(DType::kF16, 3.14159f), 3.140625f);
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
}

}  // namespace
}  // namespace deepinfer::kernels
