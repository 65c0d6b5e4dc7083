// Dense projection on the GPU through cuBLASLt: y[m, n] = x[m, k] · W[n, k]^T (+ bias[n]), the
// layout of PyTorch's nn.Linear weights, as kernels/linear_cpu.h computes it on the CPU. x, W,
// bias and y are all `dtype` (bf16, f16 or f32); products accumulate in f32 (CUBLAS_COMPUTE_32F:
// no TF32 for f32 inputs), the bias is added in f32 and y is rounded once to `dtype`, so results
// differ from LinearCpu (round_to = dtype) only by f32 summation order, i.e. by at most about one
// ulp of `dtype`. Plain C++ so nvcc sees it too; the launcher is kernels/cuda/linear_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_LINEAR_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_LINEAR_PARAMS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

// The cuBLASLt workspace that lets it pick its fastest Hopper kernels (split-K among them).
inline constexpr size_t kLinearCudaWorkspaceBytes = size_t{32} << 20;

struct LinearCudaParams {
  // Device memory of `dtype`.
  const void* x = nullptr;       // [m, ldx], first k used
  const void* weight = nullptr;  // [n, k], contiguous
  const void* bias = nullptr;    // [n], optional
  void* y = nullptr;             // [m, ldy], first n written; must not overlap x or weight
  int64_t m = 0;                 // >= 0 (0: nothing to do)
  int64_t n = 0;                 // > 0
  int64_t k = 0;                 // > 0
  int64_t ldx = 0;               // elements between rows of x; 0 means k, otherwise >= k
  int64_t ldy = 0;               // elements between rows of y; 0 means n, otherwise >= n
  DType dtype = DType::kBF16;
  // cuBLASLt's scratch (device memory); kLinearCudaWorkspaceBytes recommended, 0 allowed (then
  // only algorithms without one run). Calls running at the same time need distinct workspaces.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_LINEAR_PARAMS_H_
