#include "kernels/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace deepinfer::kernels {
namespace {

CpuIsa Detect() {
  CpuIsa best = CpuIsa::kScalar;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    best = CpuIsa::kAvx2;
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
    CpuIsa isa = CpuSupports(CpuIsa::kAvx2) ? CpuIsa::kAvx2 : CpuIsa::kScalar;
    const char* env = std::getenv("DEEPINFER_CPU_ISA");
    if (env != nullptr && std::strcmp(env, "scalar") == 0) isa = CpuIsa::kScalar;
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
  }
  return "unknown";
}

}  // namespace deepinfer::kernels
