// KV-cache write on the GPU: stores the K and V rows of a ragged batch of new tokens into their
// paged slots, for one layer. Cache layout as engine/kv_cache.h: block b of a layer starts
// b * block_stride elements after the layer's K (V) base; slot s of a block holds
// [num_kv_heads][head_dim] elements of cache_dtype. Token t of the batch belongs to sequence
// token_seq[t] and goes to position positions[t], i.e. block
// block_tables[token_seq[t] * max_blocks_per_seq + positions[t] / block_size], slot
// positions[t] % block_size. Plain C++ so nvcc sees it too; the launcher is
// kernels/cuda/kv_write_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_KV_WRITE_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_KV_WRITE_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

struct KvWriteParams {
  // All pointers are device memory.
  const void* k = nullptr;  // [num_tokens, k_row_stride], first num_kv_heads * head_dim, src_dtype
  const void* v = nullptr;  // [num_tokens, v_row_stride]
  void* k_cache = nullptr;  // this layer's K pool base (KvCache::k_layer), cache_dtype
  void* v_cache = nullptr;  // this layer's V pool base
  const int32_t* positions = nullptr;     // [num_tokens]; negative = padding, not written
  const int32_t* token_seq = nullptr;     // [num_tokens], in [0, num_seqs)
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t num_tokens = 0;                 // >= 0
  int num_seqs = 0;                       // >= 1 when num_tokens > 0
  int max_blocks_per_seq = 0;             // > 0
  int num_kv_heads = 0;                   // > 0
  int head_dim = 0;                       // > 0
  int block_size = 0;                     // tokens per block, > 0
  int num_blocks = 0;                     // blocks in the pool, > 0
  // Elements between blocks: >= block_size * num_kv_heads * head_dim (KvCache::block_elements).
  int64_t block_stride = 0;
  // Elements between consecutive tokens' K (V) rows; 0 means num_kv_heads * head_dim.
  int64_t k_row_stride = 0;
  int64_t v_row_stride = 0;
  DType src_dtype = DType::kBF16;
  DType cache_dtype = DType::kBF16;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_KV_WRITE_PARAMS_H_
