// RMSNorm on CUDA: one thread block per row; f32 accumulation with warp shuffles, the same
// rounding steps as the CPU implementation (kernels/rmsnorm_cpu.cc).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 256;

using dev::FromF32;
using dev::ToF32;

__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  float total = 0.0f;
  if (warp == 0) {
    total = lane < (kThreads / 32) ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset >>= 1) {
      total += __shfl_xor_sync(0xffffffffu, total, offset);
    }
    if (lane == 0) warp_sums[0] = total;
  }
  __syncthreads();
  return warp_sums[0];
}

template <typename T>
__global__ void RmsNormKernel(const T* __restrict__ input, const T* __restrict__ weight,
                             T* output, const T* residual, T* residual_out, int64_t hidden,
                             float eps, float weight_offset) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * hidden;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    float x = ToF32(input[base + i]);
    if (residual != nullptr) {
      const T sum = FromF32<T>(x + ToF32(residual[base + i]));
      residual_out[base + i] = sum;
      x = ToF32(sum);
    }
    sum_sq += x * x;
  }
  const float inv_rms = rsqrtf(BlockSum(sum_sq) / static_cast<float>(hidden) + eps);
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    // Re-read: residual_out holds the rounded sum this thread wrote above.
    const float x = ToF32(residual != nullptr ? residual_out[base + i] : input[base + i]);
    const float w = ToF32(weight[i]) + weight_offset;
    const float normalized = weight_offset == 0.0f ? ToF32(FromF32<T>(x * inv_rms)) : x * inv_rms;
    output[base + i] = FromF32<T>(w * normalized);
  }
}

template <typename T>
int Launch(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return 0;
  RmsNormKernel<T><<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(
      static_cast<const T*>(p.input), static_cast<const T*>(p.weight), static_cast<T*>(p.output),
      static_cast<const T*>(p.residual), static_cast<T*>(p.residual_out), p.hidden, p.eps,
      p.weight_offset);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchRmsNorm(const RmsNormParams& p, void* stream_ptr) {
  const auto stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.dtype) {
    case DType::kF32:
      return Launch<float>(p, stream);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(p, stream);
    case DType::kF16:
      return Launch<__half>(p, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace deepinfer::kernels::cuda_raw
