// CUDA device discovery and device memory, for host code. Builds and runs on machines without a
// GPU or driver: every call then returns kUnavailable saying why (no driver, no device), never
// crashes.
//
// Thread-safety: all functions are thread-safe (the CUDA runtime is). DeviceBuffer is
// thread-compatible, neither copyable nor movable (it owns device memory).
#ifndef DEEPINFER_KERNELS_CUDA_DEVICE_H_
#define DEEPINFER_KERNELS_CUDA_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::kernels {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_bytes = 0;
};

// OK when at least one CUDA device can be used; otherwise kUnavailable with the runtime's
// reason, e.g. "no CUDA device: cudaErrorNoDevice (no CUDA-capable device is detected)".
absl::Status CudaAvailable();

// Number of usable devices (>= 1), or CudaAvailable()'s error.
absl::StatusOr<int> CudaDeviceCount();

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device);

// OK for error 0; otherwise kInternal (kUnavailable for "no device/driver" errors) with
// "<what>: <cudaErrorName> (<description>)".
absl::Status CudaStatus(int cuda_error, absl::string_view what);

class DeviceBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  // Synchronous copies of `bytes` <= size() bytes.
  absl::Status CopyFromHost(const void* src, size_t bytes);
  absl::Status CopyToHost(void* dst, size_t bytes) const;

 private:
  DeviceBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_;
  size_t bytes_;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_DEVICE_H_
