// Causal attention for one sequence over a paged KV cache, on the CPU (GQA, optional sliding
// window). Numerics follow the eager attention of Hugging Face transformers: scores = (q·k)
// rounded to `round_to`, times `scale` rounded again; softmax in f32 over the allowed keys, the
// probabilities rounded to `round_to`; output = Σ p·v accumulated in f32 and rounded.
//
// KV layout (one layer): block b holds `block_size` token slots; slot s holds
// [num_kv_heads][head_dim] elements of kv_dtype; K and V blocks are at
// k_base + b * block_stride and v_base + b * block_stride (elements).
#ifndef DEEPINFER_KERNELS_ATTENTION_CPU_H_
#define DEEPINFER_KERNELS_ATTENTION_CPU_H_

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/dtype.h"
#include "kernels/thread_pool.h"

namespace deepinfer::kernels {

struct PagedAttentionParams {
  const float* q = nullptr;    // [num_tokens, num_heads, head_dim]
  float* out = nullptr;        // [num_tokens, num_heads, head_dim]
  int64_t num_tokens = 0;      // new tokens of this sequence
  int64_t start_position = 0;  // position of q row 0; keys cover [0, start_position + num_tokens)
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  const void* k_base = nullptr;
  const void* v_base = nullptr;
  DType kv_dtype = DType::kF32;
  int64_t block_stride = 0;  // elements between consecutive blocks
  int block_size = 0;
  const int32_t* block_table = nullptr;  // >= ceil((start_position + num_tokens) / block_size)
  int sliding_window = 0;                // 0: full causal; else keys with pos > q_pos - window
  float scale = 1.0f;
  DType round_to = DType::kF32;
};

// Best path for this CPU. The AVX2 path (head_dim a multiple of 8) runs one task per (token,
// KV head) that serves all query heads of the group, so each K/V row is read and widened once
// per token rather than once per query head; exp is vectorised. It differs from the reference
// only by f32 summation order and exp's last-ulp error. A bf16 cache with bf16 activations runs
// on AMX tiles where the CPU has them (kernels/attention_amx.h), else on AVX-512 bf16 dot
// products where it has those (kernels/attention_avx512.h).
void PagedAttentionCpu(const PagedAttentionParams& p, ThreadPool* pool);

// Several sequences (e.g. a decode batch) in one parallel region; each computed exactly as
// PagedAttentionCpu would.
void PagedAttentionBatchCpu(const PagedAttentionParams* params, int count, ThreadPool* pool);

// A specific path (must be supported by this CPU); for tests and benchmarks.
void PagedAttentionCpuWithIsa(const PagedAttentionParams& p, ThreadPool* pool, CpuIsa isa);

// The portable reference path, the baseline the optimised paths are tested against.
void PagedAttentionCpuReference(const PagedAttentionParams& p, ThreadPool* pool);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_ATTENTION_CPU_H_
