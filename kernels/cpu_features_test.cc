#include "kernels/cpu_features.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(CpuFeaturesTest, LevelsAreOrdered) {
  EXPECT_TRUE(CpuSupports(CpuIsa::kScalar));
  EXPECT_TRUE(IsaAtLeast(CpuIsa::kAmx, CpuIsa::kAvx2));
  EXPECT_FALSE(IsaAtLeast(CpuIsa::kAvx2, CpuIsa::kAmx));
  EXPECT_TRUE(IsaAtLeast(CpuIsa::kAmx, CpuIsa::kAvx512Bf16));
  EXPECT_TRUE(IsaAtLeast(CpuIsa::kAvx512Bf16, CpuIsa::kAvx2));
  EXPECT_FALSE(IsaAtLeast(CpuIsa::kAvx2, CpuIsa::kAvx512Bf16));
  if (CpuSupports(CpuIsa::kAmx)) EXPECT_TRUE(CpuSupports(CpuIsa::kAvx512Bf16));
  if (CpuSupports(CpuIsa::kAvx512Bf16)) EXPECT_TRUE(CpuSupports(CpuIsa::kAvx2));
  EXPECT_TRUE(CpuSupports(BestCpuIsa()));
  EXPECT_STREQ(CpuIsaName(CpuIsa::kAmx), "amx");
  EXPECT_STREQ(CpuIsaName(CpuIsa::kAvx512Bf16), "avx512");
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

// Likewise VDPBF16PS: a CPU that has it (with the AVX-512 subsets its path uses) runs that path.
TEST(CpuFeaturesTest, Avx512Bf16HardwareIsUsed) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq")) {
    GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  }
  EXPECT_TRUE(CpuSupports(CpuIsa::kAvx512Bf16));
  EXPECT_TRUE(IsaAtLeast(BestCpuIsa(), CpuIsa::kAvx512Bf16) || std::getenv("DEEPINFER_CPU_ISA"));
}
#endif

}  // namespace
}  // namespace deepinfer::kernels
