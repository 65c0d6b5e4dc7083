// Reductions of a row of logits on the CPU: the log-softmax normaliser (max_i x_i and sum_i
// exp(x_i - shift)) and the arg-max. The serving path needs them for every token it samples or
// verifies (the token, its logprob) and for every token a draft model proposes (its
// confidence), over the whole vocabulary each time: the
// scalar loop of double-precision exp took ~25 us per 4096-entry row on the development machine,
// about a tenth of a 32-sequence decode step's time per token. The AVX2 path evaluates exp in
// float lanes (avx2::Exp) and sums them in a fixed order: within ~1e-6 (relative) of the double
// reference, and the same result on every call for the same row.
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_KERNELS_SOFTMAX_CPU_H_
#define DEEPINFER_KERNELS_SOFTMAX_CPU_H_

#include <cstdint>

#include "kernels/cpu_features.h"

namespace deepinfer::kernels {

// max_i x[i] over n >= 1 values, NaN entries skipped (-inf if all are NaN): the value
// std::max_element finds in rows without NaN.
float RowMaxCpu(const float* x, int64_t n);
// The index std::max_element returns over n >= 1 values (the first of equal maxima; NaN entries
// after the first skipped, a NaN first entry kept): greedy sampling.
int64_t ArgMaxCpu(const float* x, int64_t n);
// sum_i exp(x[i] - shift) over n >= 0 values (0 for none).
double SumExpCpu(const float* x, int64_t n, float shift);

// The same on a given ISA's path (tests, benchmarks); below kAvx2: the scalar reference (exp in
// double).
float RowMaxCpuWithIsa(const float* x, int64_t n, CpuIsa isa);
int64_t ArgMaxCpuWithIsa(const float* x, int64_t n, CpuIsa isa);
double SumExpCpuWithIsa(const float* x, int64_t n, float shift, CpuIsa isa);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_SOFTMAX_CPU_H_
