// Elementwise activations of the MLP on the CPU.
//
// SwiGLU: out[i] = round(round(silu(gate[i])) * up[i]) with round = rounding to `round_to`, the
// points where Hugging Face transformers' eager Llama MLP stores bf16/f16 tensors. silu(x) =
// x / (1 + exp(-x)).
//
// Thread-safety: thread-compatible; parallelises internally on `pool` (may be null).
#ifndef DEEPINFER_KERNELS_ACTIVATION_CPU_H_
#define DEEPINFER_KERNELS_ACTIVATION_CPU_H_

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace deepinfer::kernels {

// out may alias gate or up. The AVX2 path differs from the reference by exp's last ulp only.
void SwiGluCpu(const float* gate, const float* up, float* out, int64_t count, DType round_to,
               ThreadPool* pool);
void SwiGluCpuWithIsa(const float* gate, const float* up, float* out, int64_t count, DType round_to,
                      ThreadPool* pool, CpuIsa isa);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_ACTIVATION_CPU_H_
