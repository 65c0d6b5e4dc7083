// Raw cuBLASLt entry points for kernels/cuda/linear_cuda.h, implemented in linear.cu. Plain C++:
// no CUDA, cuBLAS or Abseil types, so host code includes this without the CUDA headers.
#ifndef DEEPINFER_KERNELS_CUDA_LINEAR_LAUNCH_H_
#define DEEPINFER_KERNELS_CUDA_LINEAR_LAUNCH_H_

#include "kernels/cuda/linear_params.h"

namespace deepinfer::kernels::cuda_raw {

// One cublasLtMatmul for `p` (already validated) on `stream` (a cudaStream_t, nullptr = the
// default stream). Returns a cublasStatus_t value (0 = success). The process-wide cuBLASLt handle
// is created on first use; the algorithm for each shape, dtype, bias and alignment is chosen once
// by cuBLASLt's heuristic and cached. Thread-safe.
int LaunchLinearCublasLt(const LinearCudaParams& p, void* stream);

// cublasLtGetStatusName / cublasLtGetStatusString of a cublasStatus_t value.
const char* CublasStatusName(int status);
const char* CublasStatusString(int status);

}  // namespace deepinfer::kernels::cuda_raw

#endif  // DEEPINFER_KERNELS_CUDA_LINEAR_LAUNCH_H_
