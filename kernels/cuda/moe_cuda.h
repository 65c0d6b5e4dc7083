// CUDA mixture-of-experts routing and combining (kernels/cuda/moe_params.h) on device pointers.
// Asynchronous on `stream` (a cudaStream_t, nullptr = default stream); errors of the launch itself
// are returned, errors during execution surface at the next synchronisation. Thread-safe.
#ifndef DEEPINFER_KERNELS_CUDA_MOE_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_MOE_CUDA_H_

#include "absl/status/status.h"
#include "kernels/cuda/moe_params.h"

namespace deepinfer::kernels {

// Each: kInvalidArgument naming the field for bad parameters (checked first); kUnavailable
// without a device; kInternal for a failed launch.
absl::Status MoeRouteCuda(const MoeRouteParams& p, void* stream);
absl::Status MoeCombineCuda(const MoeCombineParams& p, void* stream);
absl::Status MoeSharedCuda(const MoeSharedParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_MOE_CUDA_H_
