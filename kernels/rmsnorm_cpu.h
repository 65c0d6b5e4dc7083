// CPU implementation of RMSNorm (see kernels/rmsnorm.h). Thread-compatible: concurrent calls on
// disjoint outputs are safe.
#ifndef DEEPINFER_KERNELS_RMSNORM_CPU_H_
#define DEEPINFER_KERNELS_RMSNORM_CPU_H_

#include "absl/status/status.h"
#include "kernels/rmsnorm.h"

namespace deepinfer::kernels {

// kInvalidArgument naming the field for unusable parameters.
absl::Status RmsNormCpu(const RmsNormParams& p);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_RMSNORM_CPU_H_
