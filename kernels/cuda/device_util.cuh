// Device-side helpers shared by the .cu files of kernels/cuda (nvcc only; host code never
// includes this). Conversions round to nearest even, like kernels/dtype.h on the host.
#ifndef DEEPINFER_KERNELS_CUDA_DEVICE_UTIL_CUH_
#define DEEPINFER_KERNELS_CUDA_DEVICE_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels::cuda_raw::dev {

template <typename T>
__device__ __forceinline__ float ToF32(T v);
template <>
__device__ __forceinline__ float ToF32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float ToF32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float ToF32<__half>(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float v) { return __float2half_rn(v); }

// v rounded to T and back: the value a tensor of type T would hold.
template <typename T>
__device__ __forceinline__ float Round(float v) {
  return ToF32(FromF32<T>(v));
}

// Element i of a buffer whose type is only known at run time (memory-bound kernels).
__device__ __forceinline__ float LoadAny(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(data)[i]);
  }
  return 0.0f;
}

__device__ __forceinline__ void StoreAny(void* data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      return;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v);
      return;
    case DType::kF16:
      static_cast<__half*>(data)[i] = __float2half_rn(v);
      return;
  }
}

// Sum and maximum over a full warp (every lane gets the result).
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Address of key/value `pos` of KV head `kvh` in a paged KV pool (engine/kv_cache.h's layout:
// block b at base + b * block_stride elements, slot s holding [num_kv_heads][head_dim]), or
// nullptr when the position's block is past max_blocks_per_seq or its id is not in
// [0, num_blocks) (e.g. -1: released before a sliding window). `Params` is any attention
// parameter struct with those fields.
template <typename T, typename Params>
__device__ __forceinline__ const T* PagedRow(const void* base, const Params& p,
                                             const int32_t* table, int pos, int kvh) {
  const int block_index = pos / p.block_size;
  if (block_index >= p.max_blocks_per_seq) return nullptr;
  const int32_t block = table[block_index];
  if (block < 0 || block >= p.num_blocks) return nullptr;
  return static_cast<const T*>(base) + block * p.block_stride +
         static_cast<int64_t>(pos % p.block_size) * p.num_kv_heads * p.head_dim +
         static_cast<int64_t>(kvh) * p.head_dim;
}

// Launches `launch` with T = the CUDA type of `dtype`; returns its error value.
template <typename Fn>
int DispatchDType(DType dtype, Fn&& launch) {
  switch (dtype) {
    case DType::kF32:
      return launch(float{});
    case DType::kBF16:
      return launch(__nv_bfloat16{});
    case DType::kF16:
      return launch(__half{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace deepinfer::kernels::cuda_raw::dev

#endif  // DEEPINFER_KERNELS_CUDA_DEVICE_UTIL_CUH_
