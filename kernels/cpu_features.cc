#include "kernels/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace deepinfer::kernels {
namespace {

#if defined(__x86_64__) && defined(__linux__)
// Linux keeps the AMX tile data (XFEATURE 18) off until a process asks for it; the first tile
// instruction without it faults. Granted once per process, for all its threads.
bool RequestAmxTileState() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

CpuIsa Detect() {
  CpuIsa best = CpuIsa::kScalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    best = CpuIsa::kAvx2;
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (avx512 && __builtin_cpu_supports("avx512bf16")) best = CpuIsa::kAvx512Bf16;
#if defined(__linux__)
    // The tile path's packing and rounding use AVX-512, which every AMX CPU has (and AVX512_BF16:
    // every AMX CPU so far has it, and the levels are ordered).
    if (best == CpuIsa::kAvx512Bf16 && __builtin_cpu_supports("amx-tile") &&
        __builtin_cpu_supports("amx-bf16") && RequestAmxTileState()) {
      best = CpuIsa::kAmx;
    }
#endif
  }
#endif
  return best;
}

}  // namespace

bool CpuSupports(CpuIsa isa) {
  static const CpuIsa hardware = Detect();
  return static_cast<int>(isa) <= static_cast<int>(hardware);
}

CpuIsa BestCpuIsa() {
  static const CpuIsa chosen = [] {
    CpuIsa isa = CpuSupports(CpuIsa::kAmx)          ? CpuIsa::kAmx
                 : CpuSupports(CpuIsa::kAvx512Bf16) ? CpuIsa::kAvx512Bf16
                 : CpuSupports(CpuIsa::kAvx2)       ? CpuIsa::kAvx2
                                                    : CpuIsa::kScalar;
    const char* env = std::getenv("DEEPINFER_CPU_ISA");
    if (env != nullptr) {
      if (std::strcmp(env, "scalar") == 0) isa = CpuIsa::kScalar;
      if (std::strcmp(env, "avx2") == 0 && IsaAtLeast(isa, CpuIsa::kAvx2)) isa = CpuIsa::kAvx2;
      if (std::strcmp(env, "avx512") == 0 && IsaAtLeast(isa, CpuIsa::kAvx512Bf16)) {
        isa = CpuIsa::kAvx512Bf16;
      }
    }
    return isa;
  }();
  return chosen;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512Bf16:
      return "avx512";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "unknown";
}

}  // namespace deepinfer::kernels
