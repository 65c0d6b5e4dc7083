// Device-side fills for synthetic weights (benchmarks of checkpoints nobody has on disk) and a
// device-to-device copy for measuring memory bandwidth. Memory-bound; one grid-stride loop.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 256;

// splitmix64: a counter-based generator, so every element's value depends only on (seed, i).
__device__ uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void __launch_bounds__(kThreads)
    FillUniformKernel(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += stride) {
    // 24 random bits -> [0, 1).
    const float u =
        static_cast<float>(Mix(seed ^ static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    dev::StoreAny(data, dtype, i, lo + (hi - lo) * u);
  }
}

}  // namespace

int LaunchFillUniform(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi,
                      void* stream) {
  if (count <= 0) return 0;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
  FillUniformKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(data, dtype, count,
                                                                              seed, lo, hi);
  return static_cast<int>(cudaGetLastError());
}

int MemcpyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  return static_cast<int>(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

int DeviceSynchronize() { return static_cast<int>(cudaDeviceSynchronize()); }

}  // namespace deepinfer::kernels::cuda_raw
