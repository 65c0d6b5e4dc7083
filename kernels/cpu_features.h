// Which SIMD code paths the CPU kernels may use on this machine, detected at run time so that one
// binary (built without -march=native) runs everywhere and uses AVX2/FMA or AMX where present.
//
// The levels are ordered: a CPU at one level runs every path of the levels below it. A kernel
// without a path of its own for a level runs its best path below it (IsaAtLeast).
//
// Thread-safety: all functions are thread-safe.
#ifndef DEEPINFER_KERNELS_CPU_FEATURES_H_
#define DEEPINFER_KERNELS_CPU_FEATURES_H_

namespace deepinfer::kernels {

enum class CpuIsa {
  kScalar = 0,  // portable C++ reference paths
  kAvx2 = 1,    // AVX2 + FMA + F16C
  // AVX2 and AVX-512 (F, BW, VL, DQ) with bf16 dot products (AVX512_BF16: VDPBF16PS; Cooper Lake,
  // Sapphire Rapids and later, Zen 4), used for bf16 projections where AMX tiles are not.
  kAvx512Bf16 = 2,
  // The above plus Intel AMX tiles with bf16 dot products (AMX-TILE + AMX-BF16, Sapphire Rapids
  // and later), usable only once the kernel has granted this process the tile state
  // (arch_prctl(ARCH_REQ_XCOMP_PERM), requested by the detection).
  kAmx = 3,
};

// The best ISA both this CPU and this build support. The environment variable DEEPINFER_CPU_ISA
// ("scalar", "avx2", "avx512" or "amx") lowers it, e.g. to benchmark the reference path; it never
// raises it above what the CPU has.
CpuIsa BestCpuIsa();

// True when `isa` can run on this CPU.
bool CpuSupports(CpuIsa isa);

// True when `isa` is `level` or above it (runs `level`'s paths).
inline bool IsaAtLeast(CpuIsa isa, CpuIsa level) {
  return static_cast<int>(isa) >= static_cast<int>(level);
}

const char* CpuIsaName(CpuIsa isa);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CPU_FEATURES_H_
