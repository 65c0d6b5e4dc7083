// Raw CUDA entry points, implemented in .cu files. Plain C++: no CUDA or Abseil types, so host
// code includes this without the CUDA headers. Each returns a cudaError_t value (0 = success);
// host wrappers (device.h, *_cuda.h) turn those into absl::Status. `stream` is a cudaStream_t
// (nullptr = the legacy default stream).
#ifndef DEEPINFER_KERNELS_CUDA_LAUNCH_H_
#define DEEPINFER_KERNELS_CUDA_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/decode_attention_params.h"
#include "kernels/cuda/embedding_params.h"
#include "kernels/cuda/greedy_params.h"
#include "kernels/cuda/kv_write_params.h"
#include "kernels/cuda/moe_params.h"
#include "kernels/cuda/prefill_attention_params.h"
#include "kernels/cuda/rope_params.h"
#include "kernels/cuda/sample_params.h"
#include "kernels/cuda/swiglu_params.h"
#include "kernels/rmsnorm.h"

namespace deepinfer::kernels::cuda_raw {

// cudaGetDeviceCount; *count is 0 on error.
int GetDeviceCount(int* count);
// cudaGetErrorName / cudaGetErrorString of an error value.
const char* ErrorName(int error);
const char* ErrorString(int error);
// Device properties of the current device: name (NUL-terminated into `name`), compute
// capability, global memory bytes.
int GetDeviceInfo(int device, char* name, size_t name_len, int* major, int* minor,
                  size_t* total_bytes);

int Malloc(void** ptr, size_t bytes);
int Free(void* ptr);
int MemcpyHostToDevice(void* dst, const void* src, size_t bytes);
int MemcpyDeviceToHost(void* dst, const void* src, size_t bytes);
// cudaMemset of device memory.
int Memset(void* ptr, int value, size_t bytes);
int MemcpyDeviceToDevice(void* dst, const void* src, size_t bytes);
int DeviceSynchronize();

// Streams, page-locked host memory, asynchronous copies and CUDA graphs (the engine's decode
// steps are captured once per batch-size bucket and replayed).
int StreamCreate(void** stream);  // non-blocking with respect to the legacy default stream
int StreamDestroy(void* stream);
int HostAlloc(void** ptr, size_t bytes);  // page-locked (cudaMallocHost)
int HostFree(void* ptr);
// kind: 1 host to device, 2 device to host, 3 device to device.
int MemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream);
int StreamBeginCapture(void* stream);  // thread-local capture mode
// Ends the capture and instantiates it: *exec is a cudaGraphExec_t.
int StreamEndCaptureInstantiate(void* stream, void** exec);
int GraphLaunch(void* exec, void* stream);
int GraphExecDestroy(void* exec);
// Fills `count` elements of `dtype` at `data` with values uniform in [lo, hi), each a function of
// (seed, index) only (synthetic weights for benchmarks).
int LaunchFillUniform(void* data, DType dtype, int64_t count, uint64_t seed, float lo, float hi,
                      void* stream);
int StreamSynchronize(void* stream);

// RMSNorm over device pointers; parameters as kernels/rmsnorm.h, already validated.
int LaunchRmsNorm(const RmsNormParams& p, void* stream);

// The launchers below take parameters already validated by their host wrappers
// (kernels/cuda/*_cuda.h) and return cudaGetLastError() after the launch.
int LaunchEmbedding(const EmbeddingParams& p, void* stream);
int LaunchRope(const RopeParams& p, void* stream);
int LaunchSwiGlu(const SwiGluParams& p, void* stream);
int LaunchKvWrite(const KvWriteParams& p, void* stream);
int LaunchDecodeAttention(const DecodeAttentionParams& p, void* stream);
int LaunchPrefillAttention(const PrefillAttentionParams& p, void* stream);
int LaunchGreedy(const GreedyParams& p, void* stream);
int LaunchMoeRoute(const MoeRouteParams& p, void* stream);
int LaunchMoeCombine(const MoeCombineParams& p, void* stream);
int LaunchMoeShared(const MoeSharedParams& p, void* stream);
// Sampling: the workspace for rows x vocab (queries CUB, so needs a device), then the launch.
int SampleWorkspaceBytes(int64_t rows, int vocab, size_t* bytes);
int LaunchSample(const SampleParams& p, void* stream);

}  // namespace deepinfer::kernels::cuda_raw

#endif  // DEEPINFER_KERNELS_CUDA_LAUNCH_H_
