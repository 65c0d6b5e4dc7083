// CUDA runtime calls for kernels/cuda/launch.h, so host code never includes CUDA headers.
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {

int GetDeviceCount(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) *count = 0;
  return static_cast<int>(err);
}

const char* ErrorName(int error) { return cudaGetErrorName(static_cast<cudaError_t>(error)); }

const char* ErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

int GetDeviceInfo(int device, char* name, size_t name_len, int* major, int* minor,
                  size_t* total_bytes) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (name_len > 0) {
    std::strncpy(name, prop.name, name_len - 1);
    name[name_len - 1] = '\0';
  }
  *major = prop.major;
  *minor = prop.minor;
  *total_bytes = prop.totalGlobalMem;
  return 0;
}

int Malloc(void** ptr, size_t bytes) { return static_cast<int>(cudaMalloc(ptr, bytes)); }
int Free(void* ptr) { return static_cast<int>(cudaFree(ptr)); }

int MemcpyHostToDevice(void* dst, const void* src, size_t bytes) {
  return static_cast<int>(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

int MemcpyDeviceToHost(void* dst, const void* src, size_t bytes) {
  return static_cast<int>(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

int Memset(void* ptr, int value, size_t bytes) {
  return static_cast<int>(cudaMemset(ptr, value, bytes));
}

int StreamSynchronize(void* stream) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace deepinfer::kernels::cuda_raw
