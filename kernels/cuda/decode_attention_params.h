// Paged decode attention on the GPU: one new query token per sequence attends to its sequence's
// cached keys/values (GQA; optional sliding window). KV layout as engine/kv_cache.h and
// kernels/attention_cpu.h: block b of the layer at base + b * block_stride elements, slot s holds
// [num_kv_heads][head_dim]; key position p of sequence i is in block
// block_tables[i * max_blocks_per_seq + p / block_size], slot p % block_size. The new token's own
// K/V must already be written (kernels/cuda/kv_write_cuda.h).
//
// Numerics: scores = round(round(q·k) * scale) with round = rounding to `dtype` (as the CPU op);
// softmax and the weighted sum of V in f32 (flash-style: per split a running max, sum and
// unnormalised output, combined exactly); the output rounded once to `dtype`. Unlike the CPU op
// the probabilities are not rounded to `dtype` before the sum, so bf16/f16 results differ from
// kernels/attention_cpu.h by about one ulp of the type.
//
// Work split (split-K): contexts longer than kDecodeAttentionPartition keys are cut into
// partitions, one thread block per (sequence, KV head, partition) serving all query heads of the
// group; a second kernel combines the partial maxima, sums and outputs through `workspace`.
// Plain C++ so nvcc sees it too; the launcher is kernels/cuda/decode_attention_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_DECODE_ATTENTION_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_DECODE_ATTENTION_PARAMS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

inline constexpr int kDecodeAttentionPartition = 256;  // keys per thread block
inline constexpr int kDecodeAttentionMaxGroup = 16;    // num_heads / num_kv_heads limit
inline constexpr int kDecodeAttentionMaxHeadDim = 256;

struct DecodeAttentionParams {
  // All pointers are device memory.
  const void* q = nullptr;  // [num_seqs, num_heads, head_dim], dtype
  void* out = nullptr;      // [num_seqs, num_heads, head_dim], dtype
  const void* k_cache = nullptr;  // this layer's K pool base, dtype
  const void* v_cache = nullptr;  // this layer's V pool base, dtype
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  // [num_seqs]: keys of sequence i are positions [0, context_lens[i]) (the new token is the
  // last). A sequence with context_lens <= 0 gets a zero output.
  const int32_t* context_lens = nullptr;
  int num_seqs = 0;            // >= 0
  int num_heads = 0;           // > 0, a multiple of num_kv_heads
  int num_kv_heads = 0;        // > 0; num_heads / num_kv_heads <= kDecodeAttentionMaxGroup
  int head_dim = 0;            // a multiple of 32 in [32, kDecodeAttentionMaxHeadDim]
  int block_size = 0;          // > 0
  int num_blocks = 0;          // blocks in the pool; ids outside [0, num_blocks) are skipped
  int max_blocks_per_seq = 0;  // >= ceil(max_context_len / block_size)
  int64_t block_stride = 0;    // elements, >= block_size * num_kv_heads * head_dim
  // Host-side upper bound of context_lens (sizes the grid and the workspace). Longer contexts
  // are a caller bug: their keys beyond the bound are silently not attended to.
  int max_context_len = 0;
  int sliding_window = 0;  // 0: all keys; W > 0: only the last W positions
  float scale = 1.0f;      // usually 1 / sqrt(head_dim)
  DType dtype = DType::kBF16;  // of q, out and the cache
  // f32 scratch for the split-K partials; DecodeAttentionWorkspaceBytes() bytes (0 when no
  // sequence needs more than one partition). Must not be shared by concurrent launches.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Partitions per sequence for these parameters (>= 1) and the workspace they need.
inline int DecodeAttentionMaxSplits(const DecodeAttentionParams& p) {
  int64_t span = p.max_context_len;
  if (p.sliding_window > 0 && p.sliding_window < span) span = p.sliding_window;
  const int64_t splits = (span + kDecodeAttentionPartition - 1) / kDecodeAttentionPartition;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

inline size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionParams& p) {
  const int splits = DecodeAttentionMaxSplits(p);
  if (splits <= 1) return 0;
  // Per (sequence, head, split): head_dim partial outputs, a max and a sum.
  return static_cast<size_t>(p.num_seqs) * p.num_heads * splits * (p.head_dim + 2) *
         sizeof(float);
}

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_DECODE_ATTENTION_PARAMS_H_
