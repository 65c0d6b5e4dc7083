// Paged decode attention, split-K. Kernel 1: one thread block (4 warps) per (KV head, sequence,
// partition of <= kPartition keys) serving the whole query-head group:
//   1. q of the group -> shared memory (f32);
//   2. one warp per key: lanes split head_dim, warp-reduce one dot product per query head;
//   3. one warp per query head: partition max and sum of exp, probabilities in shared memory;
//   4. threads own output dimensions (and, for head_dim < 128, a share of the keys) and
//      accumulate p * v for every query head of the group in registers.
// A single-partition sequence is normalised and written directly; otherwise the partial max, sum
// and unnormalised output go to the workspace and kernel 2 combines them:
//   out = sum_s exp(m_s - M) * o_s / sum_s exp(m_s - M) * l_s.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPartition = kDecodeAttentionPartition;
constexpr int kMaxGroup = kDecodeAttentionMaxGroup;
constexpr int kMaxDimsPerLane = kDecodeAttentionMaxHeadDim / 32;
constexpr int kMaxDimsPerThread = (kDecodeAttentionMaxHeadDim + kThreads - 1) / kThreads;

struct Range {
  int first;       // first attended position
  int num_splits;  // partitions of this sequence (0 when it has no keys)
};

__device__ __forceinline__ Range SeqRange(const DecodeAttentionParams& p, int ctx, int max_splits) {
  Range r{0, 0};
  if (ctx <= 0) return r;
  r.first = p.sliding_window > 0 ? max(0, ctx - p.sliding_window) : 0;
  r.num_splits = min(max_splits, (ctx - r.first + kPartition - 1) / kPartition);
  return r;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    DecodeAttentionKernel(DecodeAttentionParams p, int max_splits) {
  extern __shared__ float smem[];
  __shared__ float stat_max[kMaxGroup];
  __shared__ float stat_sum[kMaxGroup];
  const int kvh = blockIdx.x;
  const int seq = blockIdx.y;
  const int split = blockIdx.z;
  const int D = p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int head0 = kvh * group;
  const int ctx = p.context_lens[seq];
  const Range range = SeqRange(p, ctx, max_splits);
  T* out = static_cast<T*>(p.out);
  if (range.num_splits == 0) {
    if (split == 0) {
      for (int i = threadIdx.x; i < group * D; i += kThreads) {
        out[(static_cast<int64_t>(seq) * p.num_heads + head0) * D + i] = dev::FromF32<T>(0.0f);
      }
    }
    return;
  }
  if (split >= range.num_splits) return;
  const int begin = range.first + split * kPartition;
  const int n = min(ctx, begin + kPartition) - begin;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;

  float* q_s = smem;                 // [group][D]
  float* scores = smem + group * D;  // [group][kPartition]
  const T* q = static_cast<const T*>(p.q) + (static_cast<int64_t>(seq) * p.num_heads + head0) * D;
  for (int i = threadIdx.x; i < group * D; i += kThreads) q_s[i] = dev::ToF32(q[i]);
  __syncthreads();

  // 2. Scores.
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int dims_per_lane = D / 32;
  for (int j = warp; j < n; j += kWarps) {
    const T* k = dev::PagedRow<T>(p.k_cache, p, table, begin + j, kvh);
    float kv[kMaxDimsPerLane];
#pragma unroll
    for (int e = 0; e < kMaxDimsPerLane; ++e) {
      kv[e] = (k != nullptr && e < dims_per_lane) ? dev::ToF32(k[lane + 32 * e]) : 0.0f;
    }
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h < group) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kMaxDimsPerLane; ++e) {
          if (e < dims_per_lane) dot = fmaf(q_s[h * D + lane + 32 * e], kv[e], dot);
        }
        dot = dev::WarpSum(dot);
        if (lane == 0) {
          scores[h * kPartition + j] =
              k == nullptr ? -INFINITY : dev::Round<T>(__fmul_rn(dev::Round<T>(dot), p.scale));
        }
      }
    }
  }
  __syncthreads();

  // 3. Partition softmax statistics; scores become exp(s - max).
  for (int h = warp; h < group; h += kWarps) {
    float* s = scores + h * kPartition;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, s[j]);
    m = dev::WarpMax(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
      const float e = m == -INFINITY ? 0.0f : expf(s[j] - m);
      s[j] = e;
      l += e;
    }
    l = dev::WarpSum(l);
    if (lane == 0) {
      stat_max[h] = m;
      stat_sum[h] = l;
    }
  }
  __syncthreads();

  // 4. p * v. For D < kThreads, key_lanes groups of D threads take every key_lanes-th key.
  const int key_lanes = D >= kThreads ? 1 : kThreads / D;
  const int key_lane = D >= kThreads ? 0 : threadIdx.x / D;
  const int d0 = D >= kThreads ? threadIdx.x : threadIdx.x % D;
  const bool active = key_lane < key_lanes;
  float acc[kMaxGroup][kMaxDimsPerThread];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
#pragma unroll
    for (int e = 0; e < kMaxDimsPerThread; ++e) acc[h][e] = 0.0f;
  }
  if (active) {
    for (int j = key_lane; j < n; j += key_lanes) {
      const T* v = dev::PagedRow<T>(p.v_cache, p, table, begin + j, kvh);
      if (v == nullptr) continue;
      float vv[kMaxDimsPerThread];
#pragma unroll
      for (int e = 0; e < kMaxDimsPerThread; ++e) {
        const int d = d0 + e * kThreads;
        vv[e] = d < D ? dev::ToF32(v[d]) : 0.0f;
      }
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h < group) {
          const float pr = scores[h * kPartition + j];
#pragma unroll
          for (int e = 0; e < kMaxDimsPerThread; ++e) acc[h][e] = fmaf(pr, vv[e], acc[h][e]);
        }
      }
    }
  }
  if (key_lanes > 1) {  // combine the key lanes through shared memory (scores are done)
    __syncthreads();
    float* red = scores;  // [key_lanes][group][D] <= kThreads * kMaxGroup floats
    if (active) {
      for (int h = 0; h < group; ++h) red[(key_lane * group + h) * D + d0] = acc[h][0];
    }
    __syncthreads();
    if (key_lane == 0) {
      for (int h = 0; h < group; ++h) {
        float sum = 0.0f;
        for (int kl = 0; kl < key_lanes; ++kl) sum += red[(kl * group + h) * D + d0];
        acc[h][0] = sum;
      }
    }
  }
  if (key_lane != 0) return;

  const int64_t head_row = static_cast<int64_t>(seq) * p.num_heads + head0;
  float* ws = static_cast<float*>(p.workspace);
  const int64_t per_split = D + 2;
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h >= group) break;
    const float l = stat_sum[h];
#pragma unroll
    for (int e = 0; e < kMaxDimsPerThread; ++e) {
      const int d = d0 + e * kThreads;
      if (d >= D) continue;
      if (range.num_splits == 1) {
        out[(head_row + h) * D + d] = dev::FromF32<T>(l > 0.0f ? acc[h][e] / l : 0.0f);
      } else {
        float* part = ws + ((head_row + h) * max_splits + split) * per_split;
        part[d] = acc[h][e];
        if (d == 0) {
          part[D] = stat_max[h];
          part[D + 1] = l;
        }
      }
    }
  }
}

// One thread block per (head, sequence): combines the partitions of multi-partition sequences.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    DecodeAttentionReduceKernel(DecodeAttentionParams p, int max_splits) {
  extern __shared__ float weights[];  // [max_splits]
  __shared__ float total;
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const Range range = SeqRange(p, p.context_lens[seq], max_splits);
  if (range.num_splits <= 1) return;
  const int D = p.head_dim;
  const int64_t per_split = D + 2;
  const int64_t head_row = static_cast<int64_t>(seq) * p.num_heads + head;
  const float* parts = static_cast<const float*>(p.workspace) + head_row * max_splits * per_split;
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int s = 0; s < range.num_splits; ++s) m = fmaxf(m, parts[s * per_split + D]);
    float l = 0.0f;
    for (int s = 0; s < range.num_splits; ++s) {
      const float ms = parts[s * per_split + D];
      const float w = ms == -INFINITY ? 0.0f : expf(ms - m);
      weights[s] = w;
      l += w * parts[s * per_split + D + 1];
    }
    total = l;
  }
  __syncthreads();
  T* out = static_cast<T*>(p.out) + head_row * D;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.0f;
    for (int s = 0; s < range.num_splits; ++s)
      acc = fmaf(weights[s], parts[s * per_split + d], acc);
    out[d] = dev::FromF32<T>(total > 0.0f ? acc / total : 0.0f);
  }
}

}  // namespace

int LaunchDecodeAttention(const DecodeAttentionParams& p, void* stream_ptr) {
  if (p.num_seqs == 0) return 0;
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int max_splits = DecodeAttentionMaxSplits(p);
  const int group = p.num_heads / p.num_kv_heads;
  const size_t smem = static_cast<size_t>(group) * (p.head_dim + kPartition) * sizeof(float);
  const dim3 grid(p.num_kv_heads, p.num_seqs, max_splits);
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    DecodeAttentionKernel<T><<<grid, kThreads, smem, stream>>>(p, max_splits);
    int err = static_cast<int>(cudaGetLastError());
    if (err != 0 || max_splits <= 1) return err;
    DecodeAttentionReduceKernel<T>
        <<<dim3(p.num_heads, p.num_seqs), kThreads, max_splits * sizeof(float), stream>>>(
            p, max_splits);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace deepinfer::kernels::cuda_raw
