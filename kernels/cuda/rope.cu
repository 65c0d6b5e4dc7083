// RoPE: one thread block per token. cos/sin of the token's angles are computed once into shared
// memory, then every (head, i) pair of q and k is rotated. The products and differences use
// explicitly rounded f32 intrinsics so that nvcc does not contract them into FMAs: with f32
// activations the result then equals the CPU reference given equal cos/sin.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalf = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(T* q, T* k, const int32_t* __restrict__ positions,
               const float* __restrict__ inv_freq, int num_heads, int num_kv_heads, int head_dim,
               int64_t q_stride, int64_t k_stride) {
  __shared__ float cos_s[kMaxHalf];
  __shared__ float sin_s[kMaxHalf];
  const int64_t t = blockIdx.x;
  const int32_t pos = positions[t];
  if (pos < 0) return;
  const int half = head_dim / 2;
  for (int i = threadIdx.x; i < half; i += kThreads) {
    const float angle = __fmul_rn(static_cast<float>(pos), inv_freq[i]);
    cos_s[i] = dev::Round<T>(cosf(angle));
    sin_s[i] = dev::Round<T>(sinf(angle));
  }
  __syncthreads();
  const int pairs = (num_heads + num_kv_heads) * half;
  for (int idx = threadIdx.x; idx < pairs; idx += kThreads) {
    const int head = idx / half;
    const int i = idx - head * half;
    T* vec = head < num_heads ? q + t * q_stride + static_cast<int64_t>(head) * head_dim
                              : k + t * k_stride + static_cast<int64_t>(head - num_heads) * head_dim;
    const float a = dev::ToF32(vec[i]);
    const float b = dev::ToF32(vec[i + half]);
    const float c = cos_s[i];
    const float s = sin_s[i];
    vec[i] = dev::FromF32<T>(
        __fsub_rn(dev::Round<T>(__fmul_rn(a, c)), dev::Round<T>(__fmul_rn(b, s))));
    vec[i + half] = dev::FromF32<T>(
        __fadd_rn(dev::Round<T>(__fmul_rn(b, c)), dev::Round<T>(__fmul_rn(a, s))));
  }
}

}  // namespace

int LaunchRope(const RopeParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  const int64_t q_stride =
      p.q_row_stride == 0 ? static_cast<int64_t>(p.num_heads) * p.head_dim : p.q_row_stride;
  const int64_t k_stride =
      p.k_row_stride == 0 ? static_cast<int64_t>(p.num_kv_heads) * p.head_dim : p.k_row_stride;
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    RopeKernel<T><<<static_cast<unsigned>(p.num_tokens), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(
        static_cast<T*>(p.q), static_cast<T*>(p.k), p.positions, p.inv_freq, p.num_heads,
        p.num_kv_heads, p.head_dim, q_stride, k_stride);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace deepinfer::kernels::cuda_raw
