// CUDA greedy choice and logprobs (kernels/cuda/greedy_params.h) on device pointers.
// Asynchronous on `stream` (a cudaStream_t, nullptr = default stream); errors of the launch itself
// are returned, errors during execution surface at the next synchronisation. Thread-safe.
#ifndef DEEPINFER_KERNELS_CUDA_GREEDY_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_GREEDY_CUDA_H_

#include "absl/status/status.h"
#include "kernels/cuda/greedy_params.h"

namespace deepinfer::kernels {

// kInvalidArgument naming the field for bad parameters (checked first); kUnavailable without a
// device; kInternal for a failed launch.
absl::Status GreedyCuda(const GreedyParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_GREEDY_CUDA_H_
