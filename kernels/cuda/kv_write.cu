// KV-cache write: one thread block per token, threads stride over the token's K and V rows.
// Memory-bound: element types are dispatched per element at run time (one instantiation).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) KvWriteKernel(KvWriteParams p, int64_t k_stride,
                                                          int64_t v_stride) {
  const int64_t t = blockIdx.x;
  const int32_t pos = p.positions[t];
  const int32_t seq = p.token_seq[t];
  if (pos < 0 || seq < 0 || seq >= p.num_seqs) return;
  const int32_t block_index = pos / p.block_size;
  if (block_index >= p.max_blocks_per_seq) return;
  const int32_t block =
      p.block_tables[static_cast<int64_t>(seq) * p.max_blocks_per_seq + block_index];
  if (block < 0 || block >= p.num_blocks) return;
  const int64_t width = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t dst = block * p.block_stride + (pos % p.block_size) * width;
  for (int64_t i = threadIdx.x; i < width; i += kThreads) {
    dev::StoreAny(p.k_cache, p.cache_dtype, dst + i, dev::LoadAny(p.k, p.src_dtype, t * k_stride + i));
    dev::StoreAny(p.v_cache, p.cache_dtype, dst + i, dev::LoadAny(p.v, p.src_dtype, t * v_stride + i));
  }
}

}  // namespace

int LaunchKvWrite(const KvWriteParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  const int64_t width = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  KvWriteKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(
      p, p.k_row_stride == 0 ? width : p.k_row_stride, p.v_row_stride == 0 ? width : p.v_row_stride);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace deepinfer::kernels::cuda_raw
