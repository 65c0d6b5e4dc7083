// SwiGLU: a 2-D grid (rows x column chunks); each thread handles elements of one row.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 256;
constexpr int kColsPerBlock = kThreads * 4;  // launcher checks width fits 65535 chunks

template <typename T>
__global__ void __launch_bounds__(kThreads)
    SwiGluKernel(const T* gate, const T* up, T* out, int64_t width, int64_t gate_stride,
                 int64_t up_stride, int64_t out_stride) {
  const int64_t row = blockIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kColsPerBlock;
  const int64_t end = min(width, begin + kColsPerBlock);
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float g = dev::ToF32(gate[row * gate_stride + i]);
    const float u = dev::ToF32(up[row * up_stride + i]);
    const float silu = __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    out[row * out_stride + i] = dev::FromF32<T>(__fmul_rn(dev::Round<T>(silu), u));
  }
}

}  // namespace

int LaunchSwiGlu(const SwiGluParams& p, void* stream) {
  if (p.rows == 0) return 0;
  const int64_t gs = p.gate_row_stride == 0 ? p.width : p.gate_row_stride;
  const int64_t us = p.up_row_stride == 0 ? p.width : p.up_row_stride;
  const int64_t os = p.out_row_stride == 0 ? p.width : p.out_row_stride;
  const dim3 grid(static_cast<unsigned>(p.rows),
                  static_cast<unsigned>((p.width + kColsPerBlock - 1) / kColsPerBlock));
  return dev::DispatchDType(p.dtype, [&](auto zero) {
    using T = decltype(zero);
    SwiGluKernel<T><<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(p.gate), static_cast<const T*>(p.up), static_cast<T*>(p.out),
        p.width, gs, us, os);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace deepinfer::kernels::cuda_raw
