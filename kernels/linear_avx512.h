// The AVX-512 BF16 path of LinearCpu (kernels/linear_cpu.h) for bf16 weights, on CPUs that have
// VDPBF16PS (Cooper Lake, Sapphire Rapids and later, Zen 4) but whose tiles are unavailable (no
// AMX, or a hypervisor that does not expose it).
//
// Why a path of its own: the AVX2 path widens every bf16 weight to f32 and multiplies it by at
// most two activation rows per pass, with two dependent FMAs per accumulator and step, so a
// verification step of T tokens costs about ceil(T / 2) decode steps (demo model, one core: the
// projections of T = 3 cost 1.7x those of T = 2). Here a 512-bit load of weights is 32 bf16 that
// VDPBF16PS multiplies by up to four activation rows as they are, 32 multiply-adds an instruction,
// so small T cost little more than one row: the memory-bound regime speculative decoding is built
// for.
//
// Layout. Weights are read in place ([n, k] row-major; the last k block by masked loads, nothing
// repacked). Activations are packed per call as bf16 rows padded with zeros to a multiple of 32.
// Each output element is one 16-lane accumulator over k in order, reduced by the same tree
// whatever the other rows and columns of its tile: its value depends neither on m, nor on the
// other rows, nor on the thread split (RowsAreBatchInvariant), which greedy verification relies on
// (a draft's logits must equal those of the plain decode step).
//
// Precision. As the AMX path: products of bf16 are exact in f32; activations that are bf16 values
// (a bf16 model's) are used as they are, otherwise each is split into three bf16 parts (all 24
// significant bits) accumulated one after another, and a bf16 row gives bit-identical results
// whether or not its call needed the split. VDPBF16PS treats denormal inputs as zero and flushes
// denormal results, which the tolerances of the other paths cover.
//
// May only be used after CpuSupports(CpuIsa::kAvx512Bf16). Thread-safety: thread-compatible;
// parallelises internally on `pool` (may be null).
#ifndef DEEPINFER_KERNELS_LINEAR_AVX512_H_
#define DEEPINFER_KERNELS_LINEAR_AVX512_H_

#include "kernels/linear_cpu.h"
#include "kernels/thread_pool.h"

namespace deepinfer::kernels {

// Activation rows a tile multiplies per pass over the weights.
inline constexpr int kAvx512RowsPerPass = 4;

// Runs params[0..count) (every weight_dtype kBF16) on the AVX-512 BF16 path in one parallel
// region.
void LinearMultiAvx512Bf16(const LinearParams* params, int count, ThreadPool* pool);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_LINEAR_AVX512_H_
