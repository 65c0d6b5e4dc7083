// CPU implementation of RMSNorm (see kernels/rmsnorm.h). Thread-compatible: concurrent calls on
// disjoint outputs are safe.
#ifndef DEEPINFER_KERNELS_RMSNORM_CPU_H_
#define DEEPINFER_KERNELS_RMSNORM_CPU_H_

#include "absl/status/status.h"
#include "kernels/cpu_features.h"
#include "kernels/rmsnorm.h"

namespace deepinfer::kernels {

// kInvalidArgument naming the field for unusable parameters. Uses the best path for this CPU:
// the AVX2 path (f32 buffers, hidden a multiple of 8) accumulates the same f64 sum of squares
// in another order, so it matches the reference except, rarely, by one ulp of the result type.
absl::Status RmsNormCpu(const RmsNormParams& p);

// A specific path (must be supported by this CPU); kScalar is the reference path the others are
// tested against.
absl::Status RmsNormCpuWithIsa(const RmsNormParams& p, CpuIsa isa);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_RMSNORM_CPU_H_
