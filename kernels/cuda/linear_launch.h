// Raw cuBLASLt entry points for kernels/cuda/linear_cuda.h, implemented in linear.cu. Plain C++:
// no CUDA, cuBLAS or Abseil types, so host code includes this without the CUDA headers.
#ifndef DEEPINFER_KERNELS_CUDA_LINEAR_LAUNCH_H_
#define DEEPINFER_KERNELS_CUDA_LINEAR_LAUNCH_H_

#include <string>

#include "kernels/cuda/linear_params.h"

namespace deepinfer::kernels::cuda_raw {

// One cublasLtMatmul for `p` (already validated) on `stream` (a cudaStream_t, nullptr = the
// default stream). Returns a cublasStatus_t value (0 = success; CUBLAS_STATUS_NOT_INITIALIZED when the library
// could not be loaded, see CublasLtLoadError). The process-wide cuBLASLt handle
// is created on first use; the algorithm for each shape, dtype, bias and alignment is chosen once
// by cuBLASLt's heuristic and cached. Thread-safe.
int LaunchLinearCublasLt(const LinearCudaParams& p, void* stream);

// cuBLASLt is not linked: the first use loads libcublasLt.so.<major> (dlopen: LD_LIBRARY_PATH,
// the executable's run path, the loader's cache, then the CUDA toolkit's lib64) and resolves every
// entry point the matmul calls. "" once loaded, else why not (the library or an entry point
// missing); the same answer for the whole process. Thread-safe.
const char* CublasLtLoadError();
// Opens the library at `path` (a soname or a file), resolves the same entry points, closes it:
// "" when all resolved, else why not. For tests and diagnostics.
std::string ProbeCublasLt(const char* path);

// cublasLtGetStatusName / cublasLtGetStatusString of a cublasStatus_t value (without the
// library: CUBLAS_STATUS_NOT_INITIALIZED and the load error).
const char* CublasStatusName(int status);
const char* CublasStatusString(int status);

}  // namespace deepinfer::kernels::cuda_raw

#endif  // DEEPINFER_KERNELS_CUDA_LINEAR_LAUNCH_H_
