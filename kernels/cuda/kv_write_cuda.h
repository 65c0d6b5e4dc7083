// CUDA KV-cache write (kernels/cuda/kv_write_params.h) on device pointers.
//
// Positions, sequence ids and block tables live in device memory and are not checked on the
// host. On the device, a token whose position is negative or beyond the block table, whose
// sequence is outside [0, num_seqs), or whose block id is outside [0, num_blocks) is not written
// (no out-of-bounds access); callers validate them where they are made (the block manager).
//
// Asynchronous on `stream` (a cudaStream_t, nullptr = default stream); errors of the launch itself
// are returned, errors during execution surface at the next synchronisation. Thread-safe; two
// writes into the same slot in one batch race (callers never do that).
#ifndef DEEPINFER_KERNELS_CUDA_KV_WRITE_CUDA_H_
#define DEEPINFER_KERNELS_CUDA_KV_WRITE_CUDA_H_

#include "absl/status/status.h"
#include "kernels/cuda/kv_write_params.h"

namespace deepinfer::kernels {

// kInvalidArgument naming the field for bad parameters (checked first); kUnavailable without a
// device; kInternal for a failed launch.
absl::Status KvWriteCuda(const KvWriteParams& p, void* stream);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_KV_WRITE_CUDA_H_
