// CUDA embedding gather (kernels/cuda/embedding_params.h) on device pointers.
//
// Token ids live in device memory, so they are not checked on the host: a row whose id is outside
// [0, vocab_size) is written as zeros (never read out of bounds). Callers validate ids where they
// come from (the engine checks requests against the vocabulary).
//
// Asynchronous on `stream` (a cudaStream_t, nullptr = default stream); errors of the launch itself
// are returned, errors during execution surface at the next synchronisation. Thread-safe.
#ifndef DEEPINFER_KERNELS_CUDA_EMBEDDING_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_EMBEDDING_CUDA_H_

#include "absl/status/status.h"
#include "kernels/cuda/embedding_params.h"

namespace deepinfer::kernels {

// kInvalidArgument naming the field for bad parameters (checked first); kUnavailable without a
// device; kInternal for a failed launch.
absl::Status EmbeddingCuda(const EmbeddingParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_EMBEDDING_CUDA_H_
