// Paged prefill attention on the GPU: a batch of sequences, each with a run of new query tokens
// (a prompt, a prompt chunk after a cached prefix, or a decode step's verified drafts) attending
// causally to its keys in the paged KV cache (GQA; optional sliding window). The new tokens' K/V
// must already be written (kernels/cuda/kv_write_cuda.h). KV layout as engine/kv_cache.h and
// kernels/attention_cpu.h: block b of the layer at base + b * block_stride elements, slot s holds
// [num_kv_heads][head_dim]; key position p of sequence i is in block
// block_tables[i * max_blocks_per_seq + p / block_size], slot p % block_size; block ids outside
// [0, num_blocks) (e.g. -1 for blocks released before a sliding window) are not attended to.
//
// Query row r of sequence i (r in [0, query_starts[i + 1] - query_starts[i])) is at position
// start_positions[i] + r and attends to positions [first, start_positions[i] + r], first = 0, or
// with a window W > 0 the position W - 1 before it.
//
// Numerics: scores = round(round(q·k) * scale) with round = rounding to `dtype` (as the CPU op);
// softmax and the weighted sum of V in f32 (flash-style: per key tile a running max, sum and
// unnormalised output); the output rounded once to `dtype`. Unlike the CPU op the probabilities
// are not rounded to `dtype` before the sum, so bf16/f16 results differ from
// kernels/attention_cpu.h by about one ulp of the type.
//
// Work split: one thread block per (tile of kPrefillAttentionQueryTile query rows, sequence,
// query head), walking the tile's keys kPrefillAttentionKeyTile at a time through shared memory.
// CUDA cores only: a correct baseline for the tensor-core version to be measured against.
// Plain C++ so nvcc sees it too; the launcher is kernels/cuda/prefill_attention_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_PREFILL_ATTENTION_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_PREFILL_ATTENTION_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

inline constexpr int kPrefillAttentionQueryTile = 16;
inline constexpr int kPrefillAttentionKeyTile = 32;
inline constexpr int kPrefillAttentionMaxHeadDim = 256;

struct PrefillAttentionParams {
  // All pointers are device memory.
  const void* q = nullptr;                // [total query rows, num_heads, head_dim], dtype
  void* out = nullptr;                    // [total query rows, num_heads, head_dim], dtype
  const void* k_cache = nullptr;          // this layer's K pool base, dtype
  const void* v_cache = nullptr;          // this layer's V pool base, dtype
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  // [num_seqs + 1], non-decreasing from 0: sequence i's rows of q and out.
  const int32_t* query_starts = nullptr;
  // [num_seqs], >= 0: the position of sequence i's first query row (its cached prefix length).
  const int32_t* start_positions = nullptr;
  int num_seqs = 0;            // >= 0, <= 65535
  int num_heads = 0;           // > 0, a multiple of num_kv_heads, <= 65535
  int num_kv_heads = 0;        // > 0
  int head_dim = 0;            // a multiple of 32 in [32, kPrefillAttentionMaxHeadDim]
  int block_size = 0;          // > 0
  int num_blocks = 0;          // blocks in the pool
  int max_blocks_per_seq = 0;  // > 0; positions past it are not attended to
  int64_t block_stride = 0;    // elements, >= block_size * num_kv_heads * head_dim
  // Host-side upper bound of the sequences' query rows (sizes the grid). Longer runs are a
  // caller bug: their rows beyond the bound are not computed.
  int max_query_len = 0;
  int sliding_window = 0;      // 0: all keys; W > 0: only the last W positions
  float scale = 1.0f;          // usually 1 / sqrt(head_dim)
  DType dtype = DType::kBF16;  // of q, out and the cache
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_PREFILL_ATTENTION_PARAMS_H_
