#include "kernels/cuda/rmsnorm_cuda.h"

#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {

absl::Status RmsNormCuda(const RmsNormParams& p, void* stream) {
  if (const char* error = ValidateRmsNormParams(p)) return absl::InvalidArgumentError(error);
  if (p.dtype == DType::kF32 && p.round_to != DType::kF32) {
    return absl::InvalidArgumentError("rmsnorm: round_to other than f32 on f32 buffers is CPU-only");
  }
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchRmsNorm(p, stream), "rmsnorm launch");
}

}  // namespace deepinfer::kernels
