// Next-token sampling (kernels/cuda/sample_params.h):
//   1. ScaleKernel: l = logits / temperature (or the logits at temperature 0) and ids, per row,
//      into the workspace; SegmentOffsetsKernel: row r's segment is [r * vocab, (r + 1) * vocab);
//   2. cub::DeviceSegmentedRadixSort, descending and stable: every row sorted by (l desc, id asc);
//   3. ChooseKernel, one block per row: the cut (top-k, top-p, min-p) on the sorted row, the
//      row's probabilities scattered back to id order (f64), and the first id whose cumulative
//      probability exceeds u; the chosen token's raw logprob.
#include <cstdint>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Workspace layout: keys in/out (f32), ids in/out (i32), segment offsets, f64 probabilities in id
// order, then CUB's scratch.
struct Layout {
  size_t keys_in = 0, keys_out = 0, ids_in = 0, ids_out = 0, offsets = 0, dense = 0, cub = 0;
  size_t cub_bytes = 0, total = 0;
};

int MakeLayout(int64_t rows, int vocab, Layout* l) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(vocab);
  size_t at = 0;
  l->keys_in = at;
  at += AlignUp(n * sizeof(float));
  l->keys_out = at;
  at += AlignUp(n * sizeof(float));
  l->ids_in = at;
  at += AlignUp(n * sizeof(int32_t));
  l->ids_out = at;
  at += AlignUp(n * sizeof(int32_t));
  l->offsets = at;
  at += AlignUp((static_cast<size_t>(rows) + 1) * sizeof(int32_t));
  l->dense = at;
  at += AlignUp(n * sizeof(double));
  l->cub = at;
  size_t cub_bytes = 0;
  const cudaError_t err = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, cub_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(n),
      static_cast<int>(rows), static_cast<const int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr) + 1);
  if (err != cudaSuccess) return static_cast<int>(err);
  l->cub_bytes = cub_bytes;
  l->total = at + AlignUp(cub_bytes);
  return 0;
}

__global__ void ScaleKernel(SampleParams p, float* keys, int32_t* ids) {
  const int64_t row = blockIdx.y;
  const int64_t stride = p.row_stride == 0 ? p.vocab : p.row_stride;
  const float t = p.temperature[row];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.vocab; i += gridDim.x * blockDim.x) {
    const float x = p.logits[row * stride + i];
    keys[row * p.vocab + i] = t > 0.0f ? x / t : x;
    ids[row * p.vocab + i] = i;
  }
}

__global__ void SegmentOffsetsKernel(int32_t* offsets, int64_t rows, int vocab) {
  for (int64_t r = blockIdx.x * blockDim.x + threadIdx.x; r <= rows; r += gridDim.x * blockDim.x) {
    offsets[r] = static_cast<int32_t>(r * vocab);
  }
}

template <typename T, typename Op>
__device__ T BlockReduce(T v, T* shared, Op op, T identity) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T w = lane < kWarps ? shared[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) w = op(w, __shfl_xor_sync(0xffffffffu, w, o));
    if (lane == 0) shared[0] = w;
  }
  __syncthreads();
  const T out = shared[0];
  __syncthreads();
  return out;
}

struct Add {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Min {
  __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};
struct Max {
  __device__ int operator()(int a, int b) const { return a > b ? a : b; }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Each thread's contiguous chunk of [0, n): [begin, end).
__device__ __forceinline__ void Chunk(int n, int* begin, int* end) {
  const int per = (n + kThreads - 1) / kThreads;
  *begin = min(n, static_cast<int>(threadIdx.x) * per);
  *end = min(n, *begin + per);
}

// The first index i of [0, n) in chunk order whose inclusive prefix sum of value(i) reaches
// `target` (>= when or_equal, else >); n when none. Every thread gets the answer.
template <typename Value>
__device__ int FirstCrossing(int n, double target, bool or_equal, Value value, double* scan,
                             int* found) {
  int begin, end;
  Chunk(n, &begin, &end);
  double local = 0.0;
  for (int i = begin; i < end; ++i) local += value(i);
  scan[threadIdx.x] = local;
  if (threadIdx.x == 0) *found = n;
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive prefix of the chunk sums (1024 values)
    double run = 0.0;
    for (int t = 0; t < kThreads; ++t) {
      const double s = scan[t];
      scan[t] = run;
      run += s;
    }
  }
  __syncthreads();
  double cum = scan[threadIdx.x];
  for (int i = begin; i < end; ++i) {
    cum += value(i);
    if (or_equal ? cum >= target : target < cum) {
      atomicMin(found, i);
      break;
    }
  }
  __syncthreads();
  const int out = *found;
  __syncthreads();
  return out;
}

__global__ void __launch_bounds__(kThreads) ChooseKernel(SampleParams p, const float* sorted_keys,
                                                         const int32_t* sorted_ids, double* dense) {
  __shared__ double dshared[kWarps];
  __shared__ float fshared[kWarps];
  __shared__ int ishared[kWarps];
  __shared__ double scan[kThreads];
  __shared__ int found;
  const int64_t row = blockIdx.x;
  const int V = p.vocab;
  const int64_t stride = p.row_stride == 0 ? V : p.row_stride;
  const float* x = p.logits + row * stride;
  const float* s = sorted_keys + row * V;
  const int32_t* ids = sorted_ids + row * V;
  double* d = dense + row * V;
  const float t = p.temperature[row];

  // Raw log-softmax normaliser (as the host: max in f32, the sum in f64).
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kThreads) mx = fmaxf(mx, x[i]);
  mx = BlockReduce(mx, fshared, Max(), -INFINITY);
  double raw = 0.0;
  for (int i = threadIdx.x; i < V; i += kThreads) raw += exp(static_cast<double>(x[i] - mx));
  raw = BlockReduce(raw, dshared, Add(), 0.0);
  const float log_z = mx + static_cast<float>(log(raw));

  int chosen = 0;
  if (t == 0.0f) {
    chosen = ids[0];  // stable descending sort: the lowest id among the largest
  } else {
    const int top_k = p.top_k[row];
    const float top_p = p.top_p[row], min_p = p.min_p[row];
    const float m = s[0];
    const bool truncates = (top_k > 0 && top_k < V) || top_p < 1.0f || min_p > 0.0f;
    for (int i = threadIdx.x; i < V; i += kThreads) d[i] = 0.0;
    __syncthreads();
    if (!truncates) {
      double sum = 0.0;
      for (int i = threadIdx.x; i < V; i += kThreads) sum += exp(static_cast<double>(s[i] - m));
      sum = BlockReduce(sum, dshared, Add(), 0.0);
      // x / t in id order: the same value the sort moved.
      for (int i = threadIdx.x; i < V; i += kThreads) {
        d[i] = exp(static_cast<double>(x[i] / t - m)) / sum;
      }
    } else {
      int keep = (top_k > 0 && top_k < V) ? top_k : V;
      double sum = 0.0;
      for (int i = threadIdx.x; i < keep; i += kThreads) sum += exp(static_cast<double>(s[i] - m));
      sum = BlockReduce(sum, dshared, Add(), 0.0);
      auto prob = [&](int i) { return exp(static_cast<double>(s[i] - m)) / sum; };
      if (top_p < 1.0f) {
        // The shortest prefix whose probability reaches top_p (all of it if none does).
        const int n =
            FirstCrossing(keep, static_cast<double>(top_p), /*or_equal=*/true, prob, scan, &found);
        keep = max(1, min(keep, n + 1));
      }
      if (min_p > 0.0f) {
        const double threshold = static_cast<double>(min_p) * prob(0);
        int first_below = keep;
        for (int i = threadIdx.x; i < keep; i += kThreads) {
          if (i > 0 && prob(i) < threshold) first_below = min(first_below, i);
        }
        keep = BlockReduce(first_below, ishared, Min(), keep);
      }
      double total = 0.0;
      for (int i = threadIdx.x; i < keep; i += kThreads) total += prob(i);
      total = BlockReduce(total, dshared, Add(), 0.0);
      for (int i = threadIdx.x; i < keep; i += kThreads) d[ids[i]] = prob(i) / total;
    }
    __syncthreads();
    // The first id whose cumulative probability exceeds u; rounding can leave u above the total:
    // then the last id with a probability.
    const double u = p.uniform[row];
    chosen = FirstCrossing(
        V, u, /*or_equal=*/false, [&](int i) { return d[i]; }, scan, &found);
    if (chosen >= V) {
      int last = 0;
      for (int i = threadIdx.x; i < V; i += kThreads) {
        if (d[i] > 0.0) last = max(last, i);
      }
      chosen = BlockReduce(last, ishared, Max(), 0);
    }
  }
  if (threadIdx.x == 0) {
    p.tokens[row] = chosen;
    if (p.logprobs != nullptr) p.logprobs[row] = x[chosen] - log_z;
  }
}

}  // namespace

int SampleWorkspaceBytes(int64_t rows, int vocab, size_t* bytes) {
  Layout l;
  const int err = MakeLayout(rows, vocab, &l);
  *bytes = err == 0 ? l.total : 0;
  return err;
}

int LaunchSample(const SampleParams& p, void* stream) {
  if (p.rows == 0) return 0;
  Layout l;
  if (const int err = MakeLayout(p.rows, p.vocab, &l); err != 0) return err;
  char* ws = static_cast<char*>(p.workspace);
  float* keys_in = reinterpret_cast<float*>(ws + l.keys_in);
  float* keys_out = reinterpret_cast<float*>(ws + l.keys_out);
  int32_t* ids_in = reinterpret_cast<int32_t*>(ws + l.ids_in);
  int32_t* ids_out = reinterpret_cast<int32_t*>(ws + l.ids_out);
  int32_t* offsets = reinterpret_cast<int32_t*>(ws + l.offsets);
  double* dense = reinterpret_cast<double*>(ws + l.dense);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  const dim3 scale_grid(
      static_cast<unsigned>((p.vocab + 255) / 256 < 64 ? (p.vocab + 255) / 256 : 64),
      static_cast<unsigned>(p.rows));
  ScaleKernel<<<scale_grid, 256, 0, st>>>(p, keys_in, ids_in);
  SegmentOffsetsKernel<<<static_cast<unsigned>((p.rows + 256) / 256), 256, 0, st>>>(offsets, p.rows,
                                                                                    p.vocab);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return static_cast<int>(err);
  size_t cub_bytes = l.cub_bytes;
  const cudaError_t sorted = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      ws + l.cub, cub_bytes, keys_in, keys_out, ids_in, ids_out, static_cast<int>(p.rows * p.vocab),
      static_cast<int>(p.rows), offsets, offsets + 1, 0, static_cast<int>(sizeof(float) * 8), st);
  if (sorted != cudaSuccess) return static_cast<int>(sorted);
  ChooseKernel<<<static_cast<unsigned>(p.rows), kThreads, 0, st>>>(p, keys_out, ids_out, dense);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace deepinfer::kernels::cuda_raw
