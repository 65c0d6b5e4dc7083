// CUDA RMSNorm (kernels/rmsnorm.h) on device pointers. Asynchronous on `stream` (a cudaStream_t,
// nullptr = default stream); errors of the launch itself are returned, errors during execution
// surface at the next synchronisation.
#ifndef DEEPINFER_KERNELS_CUDA_RMSNORM_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_RMSNORM_CUDA_H_

#include "absl/status/status.h"
#include "kernels/rmsnorm.h"

namespace deepinfer::kernels {

// kInvalidArgument for bad parameters, kUnavailable without a device.
absl::Status RmsNormCuda(const RmsNormParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_RMSNORM_CUDA_H_
