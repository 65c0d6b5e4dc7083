// CUDA next-token sampling (kernels/cuda/sample_params.h) on device pointers. Asynchronous on
// `stream` (a cudaStream_t, nullptr = default stream); errors of the launch itself are returned,
// errors during execution surface at the next synchronisation. Thread-safe given distinct
// workspaces.
#ifndef DEEPINFER_KERNELS_CUDA_SAMPLE_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_SAMPLE_CUDA_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/sample_params.h"

namespace deepinfer::kernels {

// The workspace SampleCuda needs for `rows` rows of `vocab` logits (a segmented radix sort of
// every row, plus one f64 probability per logit). kInvalidArgument for sizes out of range;
// kUnavailable without a device (the sort's scratch is sized by the CUDA runtime).
absl::StatusOr<size_t> SampleWorkspaceBytes(int64_t rows, int vocab);

// kInvalidArgument naming the field for bad parameters (checked first); kUnavailable without a
// device; then kInvalidArgument for a workspace smaller than SampleWorkspaceBytes; kInternal for
// a failed launch.
absl::Status SampleCuda(const SampleParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_SAMPLE_CUDA_H_
