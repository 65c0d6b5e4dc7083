// Mixture-of-experts routing and combining (kernels/cuda/moe_params.h).
//   Route: one thread per row (router widths are small: up to 512 experts), softmax in f32,
//   top-k by repeated arg-max (lowest index among equals).
//   Combine / shared: one thread block per row, threads over the hidden width.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kRouteThreads = 128;
constexpr int kThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRouteThreads) MoeRouteKernel(MoeRouteParams p) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRouteThreads + threadIdx.x;
  if (row >= p.rows) return;
  const T* logits = static_cast<const T*>(p.logits) + row * p.num_experts;
  float mx = -INFINITY;
  for (int e = 0; e < p.num_experts; ++e) mx = fmaxf(mx, dev::ToF32(logits[e]));
  float sum = 0.0f;
  for (int e = 0; e < p.num_experts; ++e) sum += expf(dev::ToF32(logits[e]) - mx);
  // Top-k over the probabilities exp(l - mx) / sum (the same order as the logits), picked one by
  // one; a chosen expert is marked in a bit set.
  uint32_t taken[kMoeMaxExperts / 32] = {};
  float probs[kMoeMaxTopK];
  int ids[kMoeMaxTopK];
  float top_sum = 0.0f;
  for (int j = 0; j < p.top_k; ++j) {
    int best = -1;
    float best_p = -1.0f;
    for (int e = 0; e < p.num_experts; ++e) {
      if (taken[e >> 5] & (1u << (e & 31))) continue;
      const float pe = expf(dev::ToF32(logits[e]) - mx) / sum;
      if (pe > best_p) {
        best_p = pe;
        best = e;
      }
    }
    taken[best >> 5] |= 1u << (best & 31);
    ids[j] = best;
    probs[j] = best_p;
    top_sum += best_p;
  }
  for (int j = 0; j < p.top_k; ++j) {
    const float w = p.normalize ? probs[j] / top_sum : probs[j];
    p.expert_ids[row * p.top_k + j] = ids[j];
    p.weights[row * p.top_k + j] = dev::Round<T>(w);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) MoeCombineKernel(MoeCombineParams p) {
  const int64_t row = blockIdx.x;
  const T* eout = static_cast<const T*>(p.expert_out);
  T* out = static_cast<T*>(p.out) + row * p.hidden;
  for (int64_t i = threadIdx.x; i < p.hidden; i += kThreads) {
    float acc = 0.0f;
    for (int j = 0; j < p.top_k; ++j) {
      const int32_t r = p.token_rows[row * p.top_k + j];
      if (r < 0 || r >= p.assignments) continue;
      const float w = p.token_weights[row * p.top_k + j];
      acc = dev::Round<T>(
          acc + dev::Round<T>(dev::ToF32(eout[static_cast<int64_t>(r) * p.hidden + i]) * w));
    }
    out[i] = dev::FromF32<T>(acc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) MoeSharedKernel(MoeSharedParams p) {
  const int64_t row = blockIdx.x;
  const float gl = dev::ToF32(static_cast<const T*>(p.gate_logits)[row]);
  const float g = dev::Round<T>(1.0f / (1.0f + expf(-gl)));
  T* out = static_cast<T*>(p.out) + row * p.hidden;
  const T* shared = static_cast<const T*>(p.shared) + row * p.hidden;
  for (int64_t i = threadIdx.x; i < p.hidden; i += kThreads) {
    out[i] = dev::FromF32<T>(
        dev::Round<T>(dev::ToF32(out[i]) + dev::Round<T>(g * dev::ToF32(shared[i]))));
  }
}

}  // namespace

int LaunchMoeRoute(const MoeRouteParams& p, void* stream) {
  if (p.rows == 0) return 0;
  const unsigned grid = static_cast<unsigned>((p.rows + kRouteThreads - 1) / kRouteThreads);
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    MoeRouteKernel<T><<<grid, kRouteThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return static_cast<int>(cudaGetLastError());
  });
}

int LaunchMoeCombine(const MoeCombineParams& p, void* stream) {
  if (p.rows == 0) return 0;
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    MoeCombineKernel<T>
        <<<static_cast<unsigned>(p.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return static_cast<int>(cudaGetLastError());
  });
}

int LaunchMoeShared(const MoeSharedParams& p, void* stream) {
  if (p.rows == 0) return 0;
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    MoeSharedKernel<T>
        <<<static_cast<unsigned>(p.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace deepinfer::kernels::cuda_raw
