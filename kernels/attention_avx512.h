// The AVX-512 BF16 path of PagedAttentionCpu (kernels/attention_cpu.h) for bf16 KV caches and
// bf16 activations, on CPUs with VDPBF16PS but no AMX tiles (Zen 4, Cooper Lake, or a hypervisor
// that hides AMX).
//
// Why a path of its own: the AVX2 path widens every K and V row the task reads to f32 in a
// scratch buffer, then multiplies one query head at a time with 8-lane FMAs, re-reading the keys
// for each head of the group, and accumulates P . V with one broadcast load per key and head. At
// a decode step that is most of a layer's time at long contexts (demo model, 8 sequences with 512
// cached tokens: 40% of a forward pass, perf). Here K and V are read in place as bf16:
//   scores:  per block of 16 keys (aligned to absolute positions) and query row, 16 accumulators
//            of head_dim / 32 VDPBF16PS each (32 products an instruction), one reduction tree;
//   softmax: per query row in f32 over 16-key blocks aligned to absolute positions;
//   P . V:   per pair of keys (aligned to even positions), the two V rows interleaved once and
//            multiplied by each row's pair of bf16 probabilities (32 products an instruction),
//            up to 24 accumulators: the query rows of a task share every read of V.
// A task is (up to 24 query rows' worth of tokens, KV head): a decode token and its drafts read
// the context once.
//
// Numerics as the other paths: products of bf16 are exact in f32, only the f32 summation order
// differs from the reference. A query row's result depends only on its own row and keys, not on
// which other tokens share its call (blocks and pairs are aligned to absolute positions, keys a
// row does not attend to contribute exact zeros): greedy verification relies on that. VDPBF16PS
// treats denormal inputs as zero and flushes denormal results, which the tolerances cover.
//
// Slots outside the keys some row of a task attends to are never read (they may be unwritten or
// freed). May only be used after CpuSupports(CpuIsa::kAvx512Bf16). Thread-safety:
// thread-compatible.
#ifndef DEEPINFER_KERNELS_ATTENTION_AVX512_H_
#define DEEPINFER_KERNELS_ATTENTION_AVX512_H_

#include <cstdint>

#include "kernels/attention_cpu.h"

namespace deepinfer::kernels {

// True when p can run on this path: KV and activations bf16 (and q holding bf16 values), head_dim
// 32, 64 or 128.
bool AttentionAvx512Supports(const PagedAttentionParams& p);

// Tasks of p on this path; tasks [begin, end) are run by AttentionTasksAvx512.
int64_t AttentionAvx512NumTasks(const PagedAttentionParams& p);
void AttentionTasksAvx512(const PagedAttentionParams& p, int64_t begin, int64_t end);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_ATTENTION_AVX512_H_
