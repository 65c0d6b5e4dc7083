// CUDA dense projection through cuBLASLt (kernels/cuda/linear_params.h) on device pointers.
// Asynchronous on `stream` (a cudaStream_t, nullptr = default stream); errors of the call itself
// are returned, errors during execution surface at the next synchronisation. Thread-safe given
// distinct workspaces.
#ifndef DEEPINFER_KERNELS_CUDA_LINEAR_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_LINEAR_CUDA_H_

#include "absl/status/status.h"
#include "kernels/cuda/linear_params.h"

namespace deepinfer::kernels {

// kUnavailable with the reason when cuBLASLt cannot be loaded (it is loaded at run time, not
// linked, so that binaries with the CUDA backend run on machines without the CUDA libraries).
absl::Status CublasLtAvailable();

// kInvalidArgument naming the field for bad parameters (checked first); kUnavailable without a
// device or without cuBLASLt (CublasLtAvailable); kInternal with cuBLASLt's status name when the matmul is refused (e.g. no algorithm for
// the shape within the workspace).
absl::Status LinearCuda(const LinearCudaParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_LINEAR_CUDA_H_
