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
