// Which SIMD code paths the CPU kernels may use on this machine, detected at run time so that one
// binary (built without -march=native) runs everywhere and uses AVX2/FMA where present.
//
// Thread-safety: all functions are thread-safe.
#ifndef DEEPINFER_KERNELS_CPU_FEATURES_H_
#define DEEPINFER_KERNELS_CPU_FEATURES_H_

namespace deepinfer::kernels {

enum class CpuIsa {
  kScalar = 0,  // portable C++ reference paths
  kAvx2 = 1,    // AVX2 + FMA + F16C
};

// The best ISA both this CPU and this build support. The environment variable DEEPINFER_CPU_ISA
// ("scalar" or "avx2") lowers it, e.g. to benchmark the reference path; it never raises it above
// what the CPU has.
CpuIsa BestCpuIsa();

// True when `isa` can run on this CPU.
bool CpuSupports(CpuIsa isa);

const char* CpuIsaName(CpuIsa isa);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CPU_FEATURES_H_
