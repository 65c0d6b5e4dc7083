// Paged prefill attention (kernels/cuda/prefill_attention_params.h). One thread block (4 warps)
// per (query tile, sequence, query head):
//   1. the tile's query rows -> shared memory (f32);
//   2. per key tile: K and V rows -> shared memory (f32; K rows padded by one float so that the
//      32 lanes reading 32 keys' same dimension hit different banks); each thread computes 4 of
//      the 16 x 32 scores (masked: causal, window, released blocks -> -inf);
//   3. one warp per query row (lane = key): the running max m, the rescale factor
//      exp(m_old - m_new), the probabilities exp(s - m_new) and the running sum l;
//   4. each thread owns one query row and head_dim / 8 output dimensions in registers:
//      o = o * rescale + sum_j p_j v_j.
// Finally out = o / l, rounded once to the type.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kQTile = kPrefillAttentionQueryTile;
constexpr int kKTile = kPrefillAttentionKeyTile;
constexpr int kDimLanes = kThreads / kQTile;  // threads per query row in step 4 (8)
constexpr int kMaxDimsPerThread = kPrefillAttentionMaxHeadDim / kDimLanes;
static_assert(kKTile == 32, "step 3 maps one key per lane");
static_assert(kQTile * kKTile % kThreads == 0, "step 2 splits the scores evenly");

inline size_t SharedBytes(int head_dim) {
  // q [kQTile][D], k [kKTile][D + 1], v [kKTile][D], scores [kQTile][kKTile], 3 x kQTile stats.
  return sizeof(float) *
         (static_cast<size_t>(kQTile) * head_dim + static_cast<size_t>(kKTile) * (head_dim + 1) +
          static_cast<size_t>(kKTile) * head_dim + kQTile * kKTile + 3 * kQTile);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) PrefillAttentionKernel(PrefillAttentionParams p) {
  extern __shared__ float smem[];
  const int seq = blockIdx.y;
  const int head = blockIdx.z;
  const int D = p.head_dim;
  const int kvh = head / (p.num_heads / p.num_kv_heads);
  const int row0 = p.query_starts[seq];
  const int rows_in_seq = p.query_starts[seq + 1] - row0;
  const int tile_begin = blockIdx.x * kQTile;
  if (tile_begin >= rows_in_seq) return;
  const int rows = min(kQTile, rows_in_seq - tile_begin);
  const int start = p.start_positions[seq];
  const int first_pos = start + tile_begin;  // the tile's first query position
  const int last_pos = first_pos + rows - 1;
  const int key_begin = p.sliding_window > 0 ? max(0, first_pos - p.sliding_window + 1) : 0;
  const int key_end = last_pos + 1;
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;

  float* q_s = smem;                    // [kQTile][D]
  float* k_s = q_s + kQTile * D;        // [kKTile][D + 1]
  float* v_s = k_s + kKTile * (D + 1);  // [kKTile][D]
  float* s_s = v_s + kKTile * D;        // [kQTile][kKTile]
  float* m_s = s_s + kQTile * kKTile;   // running max per row
  float* l_s = m_s + kQTile;            // running sum per row
  float* c_s = l_s + kQTile;            // this tile's rescale factor per row

  const T* q = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < kQTile * D; i += kThreads) {
    const int r = i / D, d = i % D;
    q_s[i] =
        r < rows
            ? dev::ToF32(
                  q[(static_cast<int64_t>(row0 + tile_begin + r) * p.num_heads + head) * D + d])
            : 0.0f;
  }
  if (threadIdx.x < kQTile) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  const int my_row = threadIdx.x / kDimLanes;   // step 4's row
  const int my_lane = threadIdx.x % kDimLanes;  // and its dimensions my_lane + kDimLanes * e
  const int dims = D / kDimLanes;
  float acc[kMaxDimsPerThread];
#pragma unroll
  for (int e = 0; e < kMaxDimsPerThread; ++e) acc[e] = 0.0f;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  __syncthreads();

  for (int kb = key_begin; kb < key_end; kb += kKTile) {
    // 2a. K and V rows of this key tile (zeros for keys past the end or not in the pool; their
    // scores are masked below).
    for (int i = threadIdx.x; i < kKTile * D; i += kThreads) {
      const int j = i / D, d = i % D;
      const int pos = kb + j;
      const T* k = pos < key_end ? dev::PagedRow<T>(p.k_cache, p, table, pos, kvh) : nullptr;
      const T* v = pos < key_end ? dev::PagedRow<T>(p.v_cache, p, table, pos, kvh) : nullptr;
      k_s[j * (D + 1) + d] = k != nullptr ? dev::ToF32(k[d]) : 0.0f;
      v_s[j * D + d] = v != nullptr ? dev::ToF32(v[d]) : 0.0f;
    }
    __syncthreads();
    // 2b. Scores: entry e = row * kKTile + key.
    for (int e = threadIdx.x; e < kQTile * kKTile; e += kThreads) {
      const int r = e / kKTile, j = e % kKTile;
      const int pos = kb + j;
      const int q_pos = first_pos + r;
      bool visible =
          r < rows && pos <= q_pos && (p.sliding_window == 0 || pos > q_pos - p.sliding_window);
      if (visible) visible = dev::PagedRow<T>(p.k_cache, p, table, pos, kvh) != nullptr;
      float score = -INFINITY;
      if (visible) {
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot = fmaf(q_s[r * D + d], k_s[j * (D + 1) + d], dot);
        score = dev::Round<T>(__fmul_rn(dev::Round<T>(dot), p.scale));
      }
      s_s[e] = score;
    }
    __syncthreads();
    // 3. Online softmax, one warp per row, one lane per key.
    for (int r = warp; r < kQTile; r += kWarps) {
      const float s = s_s[r * kKTile + lane];
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, dev::WarpMax(s));
      const float pr = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float sum = dev::WarpSum(pr);
      s_s[r * kKTile + lane] = pr;
      if (lane == 0) {
        const float rescale = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        c_s[r] = rescale;
        m_s[r] = m_new;
        l_s[r] = l_s[r] * rescale + sum;
      }
    }
    __syncthreads();
    // 4. o = o * rescale + p · v.
    {
      const float rescale = c_s[my_row];
      const float* pr = s_s + my_row * kKTile;
#pragma unroll
      for (int e = 0; e < kMaxDimsPerThread; ++e) {
        if (e < dims) {
          const int d = my_lane + kDimLanes * e;
          float o = acc[e] * rescale;
          for (int j = 0; j < kKTile; ++j) o = fmaf(pr[j], v_s[j * D + d], o);
          acc[e] = o;
        }
      }
    }
    __syncthreads();
  }

  if (my_row >= rows) return;
  const float l = l_s[my_row];
  T* out = static_cast<T*>(p.out) +
           (static_cast<int64_t>(row0 + tile_begin + my_row) * p.num_heads + head) * D;
#pragma unroll
  for (int e = 0; e < kMaxDimsPerThread; ++e) {
    if (e < dims) out[my_lane + kDimLanes * e] = dev::FromF32<T>(l > 0.0f ? acc[e] / l : 0.0f);
  }
}

}  // namespace

int LaunchPrefillAttention(const PrefillAttentionParams& p, void* stream) {
  if (p.num_seqs == 0 || p.max_query_len == 0) return 0;
  const size_t shared = SharedBytes(p.head_dim);
  const dim3 grid(static_cast<unsigned>((p.max_query_len + kQTile - 1) / kQTile),
                  static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.num_heads));
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    if (shared > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(PrefillAttentionKernel<T>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(shared));
      if (err != cudaSuccess) return static_cast<int>(err);
    }
    PrefillAttentionKernel<T><<<grid, kThreads, shared, static_cast<cudaStream_t>(stream)>>>(p);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace deepinfer::kernels::cuda_raw
