// SwiGLU on the GPU: out = round(round(silu(gate)) * up), silu(x) = x / (1 + exp(-x)), round =
// rounding to `dtype` (kernels/activation_cpu.h's numerics; expf on the device is within 2 ulp).
// Row strides let gate and up be the two halves of a fused gate_up projection output. Plain C++
// so nvcc sees it too; the launcher is kernels/cuda/swiglu_cuda.h. (The fused residual-add +
// RMSNorm is kernels/cuda/rmsnorm_cuda.h with RmsNormParams::residual.)
#ifndef DEEPINFER_KERNELS_CUDA_SWIGLU_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_SWIGLU_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

struct SwiGluParams {
  // All pointers are device memory of `dtype`; out may alias gate or up (same element).
  const void* gate = nullptr;  // [rows, gate_row_stride], first `width` used
  const void* up = nullptr;    // [rows, up_row_stride]
  void* out = nullptr;         // [rows, out_row_stride]
  int64_t rows = 0;            // >= 0
  int64_t width = 0;           // > 0
  // Elements between rows; 0 means `width`, otherwise >= width.
  int64_t gate_row_stride = 0;
  int64_t up_row_stride = 0;
  int64_t out_row_stride = 0;
  DType dtype = DType::kBF16;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_SWIGLU_PARAMS_H_
