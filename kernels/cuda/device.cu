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

int StreamCreate(void** stream) {
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = err == cudaSuccess ? s : nullptr;
  return static_cast<int>(err);
}

int StreamDestroy(void* stream) {
  return static_cast<int>(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
}

int HostAlloc(void** ptr, size_t bytes) { return static_cast<int>(cudaMallocHost(ptr, bytes)); }
int HostFree(void* ptr) { return static_cast<int>(cudaFreeHost(ptr)); }

int MemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  const cudaMemcpyKind k = kind == 1   ? cudaMemcpyHostToDevice
                           : kind == 2 ? cudaMemcpyDeviceToHost
                                       : cudaMemcpyDeviceToDevice;
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
}

int StreamBeginCapture(void* stream) {
  return static_cast<int>(
      cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
}

int StreamEndCaptureInstantiate(void* stream, void** exec) {
  *exec = nullptr;
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  if (err != cudaSuccess) return static_cast<int>(err);
  cudaGraphExec_t instance = nullptr;
  err = cudaGraphInstantiate(&instance, graph, 0);
  cudaGraphDestroy(graph);
  if (err != cudaSuccess) return static_cast<int>(err);
  *exec = instance;
  return 0;
}

int GraphLaunch(void* exec, void* stream) {
  return static_cast<int>(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), static_cast<cudaStream_t>(stream)));
}

int GraphExecDestroy(void* exec) {
  return static_cast<int>(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)));
}

int StreamSynchronize(void* stream) {
  return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace deepinfer::kernels::cuda_raw
