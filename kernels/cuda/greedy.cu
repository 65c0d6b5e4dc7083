// Greedy choice and logprobs: one thread block per row. Pass 1: the arg-max (block reduction of
// (value, id) pairs ordered by value, then lower id); pass 2: sum exp(x - max); then top_n - 1
// more passes, each the best pair ranked strictly below the previous one (so ties come out in id
// order, as the host's partial_sort gives them).
#include <climits>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct Pick {
  float v;
  int id;  // INT_MAX: none
};

// Ranked ahead: the larger value, then the lower id. NaN never ranks ahead.
__device__ __forceinline__ bool Ahead(float v, int id, const Pick& b) {
  return v > b.v || (v == b.v && id < b.id);
}

__device__ __forceinline__ Pick WarpBest(Pick b) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, b.v, o);
    const int oid = __shfl_xor_sync(0xffffffffu, b.id, o);
    if (Ahead(ov, oid, b)) b = Pick{ov, oid};
  }
  return b;
}

// The block's best pick, returned to every thread. Uses `shared` (kWarps picks) and synchronises.
__device__ Pick BlockBest(Pick b, Pick* shared) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  b = WarpBest(b);
  if (lane == 0) shared[warp] = b;
  __syncthreads();
  if (warp == 0) {
    Pick w = lane < kWarps ? shared[lane] : Pick{-INFINITY, INT_MAX};
    w = WarpBest(w);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  const Pick out = shared[0];
  __syncthreads();  // shared is reused by the next reduction
  return out;
}

__device__ float BlockSum(float s, float* shared) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) shared[warp] = s;
  __syncthreads();
  if (warp == 0) {
    float w = lane < kWarps ? shared[lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  const float out = shared[0];
  __syncthreads();
  return out;
}

__global__ void __launch_bounds__(kThreads) GreedyKernel(GreedyParams p) {
  __shared__ Pick picks[kWarps];
  __shared__ float sums[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t stride = p.row_stride == 0 ? p.vocab : p.row_stride;
  const float* x = p.logits + row * stride;

  Pick best{-INFINITY, INT_MAX};
  for (int i = threadIdx.x; i < p.vocab; i += kThreads) {
    const float v = x[i];
    if (Ahead(v, i, best)) best = Pick{v, i};
  }
  best = BlockBest(best, picks);
  const float m = best.v;
  float s = 0.0f;
  for (int i = threadIdx.x; i < p.vocab; i += kThreads) s += expf(x[i] - m);
  const float log_z = m + logf(BlockSum(s, sums));
  const int token = best.id == INT_MAX ? 0 : best.id;
  if (threadIdx.x == 0) {
    p.tokens[row] = token;
    if (p.logprobs != nullptr) p.logprobs[row] = x[token] - log_z;
  }
  const int n = min(p.top_n, p.vocab);
  if (n == 0) return;
  int32_t* top_tokens = p.top_tokens + row * p.top_n;
  float* top_logprobs = p.top_logprobs + row * p.top_n;
  if (threadIdx.x == 0) {
    top_tokens[0] = token;
    top_logprobs[0] = x[token] - log_z;
  }
  Pick prev = Pick{x[token], token};
  for (int t = 1; t < n; ++t) {
    Pick next{-INFINITY, INT_MAX};
    for (int i = threadIdx.x; i < p.vocab; i += kThreads) {
      const float v = x[i];
      const bool below = v < prev.v || (v == prev.v && i > prev.id);
      if (below && Ahead(v, i, next)) next = Pick{v, i};
    }
    next = BlockBest(next, picks);
    const int id = next.id == INT_MAX ? 0 : next.id;
    if (threadIdx.x == 0) {
      top_tokens[t] = id;
      top_logprobs[t] = next.id == INT_MAX ? NAN : x[id] - log_z;
    }
    prev = next;
  }
}

}  // namespace

int LaunchGreedy(const GreedyParams& p, void* stream) {
  if (p.rows == 0) return 0;
  GreedyKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace deepinfer::kernels::cuda_raw
