// Dense projection on the CPU: y[m, n] = x[m, k] · W[n, k]^T (+ bias[n]), the layout of
// PyTorch's nn.Linear weights as stored in checkpoints. Activations are f32 buffers; weights stay
// in their stored precision (f32, bf16, f16) and are widened on the fly; accumulation is f32.
// The result is rounded to `round_to` (the model's activation dtype), which reproduces what a
// bf16/f16 framework stores after the same matmul.
//
// Paths: LinearCpu picks the best one for this CPU (see kernels/cpu_features.h). With AMX, bf16
// weights run on tiles (kernels/linear_amx.h: activations that are not bf16 values are split into
// bf16 parts, nothing is lost) and other weight types on the AVX2 path. The AVX2 path
// blocks 2 rows of x against 4 rows of W, widening 16 weights per step; every output element is
// accumulated in the same order whatever m, the tile or the thread split, so a row's result does
// not depend on which batch it was computed in. Results differ from the scalar reference only by
// f32 summation order.
//
// Thread-safety: thread-compatible; parallelises internally on `pool` (may be null).
#ifndef DEEPINFER_KERNELS_LINEAR_CPU_H_
#define DEEPINFER_KERNELS_LINEAR_CPU_H_

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace deepinfer::kernels {

struct LinearParams {
  const float* x = nullptr;      // [m, k], row stride k
  const void* weight = nullptr;  // [n, k], weight_dtype
  DType weight_dtype = DType::kF32;
  const void* bias = nullptr;  // [n], weight_dtype, optional
  float* y = nullptr;          // [m, n], row stride ldy (>= n; 0 means n)
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t ldy = 0;
  DType round_to = DType::kF32;
};

// Best path for this CPU.
void LinearCpu(const LinearParams& p, ThreadPool* pool);

// Several independent projections (e.g. Q, K and V of one input) in one parallel region, which
// saves the per-call hand-off to the pool. Each entry is computed exactly as LinearCpu would.
void LinearCpuMulti(const LinearParams* params, int count, ThreadPool* pool);

// A specific path (must be supported by this CPU: CpuSupports(isa)); for tests and benchmarks.
void LinearCpuWithIsa(const LinearParams& p, ThreadPool* pool, CpuIsa isa);

// LinearCpuMulti on a specific path.
void LinearMultiWithIsa(const LinearParams* params, int count, ThreadPool* pool, CpuIsa isa);

// The portable reference path, the baseline the optimised paths are tested against.
void LinearCpuReference(const LinearParams& p, ThreadPool* pool);

// Activation rows the path for weights of `weight_dtype` on `isa` multiplies in one pass over
// the weights: 16 on AMX tiles and 4 on AVX-512 BF16 (bf16 weights), 2 on AVX2, 1 on the
// reference path. A call's time then rises in steps: one row past a multiple of this starts a
// pass of its own (demo model's projections, AVX-512 BF16, two threads: 4 -> 5 rows +280 us, 5 ->
// 6 +30 us). For cost models (the speculative step-cost profile, engine/llm_engine.h).
int LinearRowsPerPass(DType weight_dtype, CpuIsa isa);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_LINEAR_CPU_H_
