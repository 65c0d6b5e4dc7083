// The AMX path of PagedAttentionCpu (kernels/attention_cpu.h) for bf16 KV caches and bf16
// activations: one task per (up to 4 tiles of query tokens, KV head) multiplies the tiles' query
// rows (a tile: tokens x the group's query heads, up to 16 rows) with the keys and values on AMX
// tiles, so a sequence verifying several draft tokens reads each K/V row from memory once for all
// of them (up to 20 tokens for the demo model's group of 3: a draft of 16 and its known token).
// With one tile a task, a draft of 5 or more read the context twice: at one sequence and 1024
// cached tokens, 6 tokens took 119 us a layer against 80 for 5 (attention_bench).
//
//   scores^T = K . Q^T: K rows read in place from the paged cache (16 keys of one block a tile),
//              Q packed per tile; transposed into one row of scores per query row.
//   softmax:   per query row in f32 over keys in chunks of 8 aligned to absolute positions, so a
//              row's result does not depend on which other rows share its task.
//   out = P . V: probabilities (bf16 values) by V packed as key pairs, f32 accumulation.
// Numerics as the other paths (kernels/attention_cpu.h): products exact, only the f32 summation
// order differs.
//
// Tiles may only be used after CpuSupports(CpuIsa::kAmx). Thread-safety: thread-compatible.
#ifndef DEEPINFER_KERNELS_ATTENTION_AMX_H_
#define DEEPINFER_KERNELS_ATTENTION_AMX_H_

#include <cstdint>

#include "kernels/attention_cpu.h"

namespace deepinfer::kernels {

// True when p can run on tiles: KV and activations bf16 (and q holding bf16 values), head_dim a
// multiple of 32, block_size a multiple of 16, at most 16 query heads per KV head.
bool AttentionAmxSupports(const PagedAttentionParams& p);

// Tasks of p on the tile path; tasks [begin, end) are run by AttentionTasksAmx.
int64_t AttentionAmxNumTasks(const PagedAttentionParams& p);
void AttentionTasksAmx(const PagedAttentionParams& p, int64_t begin, int64_t end);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_ATTENTION_AMX_H_
