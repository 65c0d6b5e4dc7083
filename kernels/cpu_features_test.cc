#include "kernels/cpu_features.h"

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(CpuFeaturesTest, LevelsAreOrdered) {
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
  EXPECT_TRUE(IsaAtLeast(CpuIsa::kAmx, CpuIsa::kAvx2));
  EXPECT_FALSE(IsaAtLeast(CpuIsa::kAvx2, CpuIsa::kAmx));
  if (CpuSupports(CpuIsa::kAmx)) EXPECT_TRUE(CpuSupports(CpuIsa::kAvx2));
  EXPECT_TRUE(CpuSupports(BestCpuIsa()));
  EXPECT_STREQ(CpuIsaName(CpuIsa::kAmx), "amx");
}

#if defined(__x86_64__) && defined(__linux__)
// On a CPU with AMX the detection must also have obtained the tile state from the kernel (without
// it the first tile instruction faults), so the tile paths run.
TEST(CpuFeaturesTest, AmxHardwareIsUsed) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) {
    GTEST_SKIP() << "no AMX on this CPU";
  }
  EXPECT_TRUE(CpuSupports(CpuIsa::kAmx));
}
#endif

}  // namespace
}  // namespace deepinfer::kernels
