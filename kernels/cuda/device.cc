#include "kernels/cuda/device.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

// cudaErrorInsufficientDriver = 35, cudaErrorNoDevice = 100, cudaErrorInitializationError = 3,
// cudaErrorStubLibrary = 34: the machine cannot run CUDA at all.
bool IsNoDeviceError(int error) {
  return error == 35 || error == 100 || error == 3 || error == 34;
}

}  // namespace

absl::Status CudaStatus(int cuda_error, absl::string_view what) {
  if (cuda_error == 0) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cuda_raw::ErrorName(cuda_error), " (",
                   cuda_raw::ErrorString(cuda_error), ")");
  if (IsNoDeviceError(cuda_error)) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const int err = cuda_raw::GetDeviceCount(&count);
  if (err != 0) return CudaStatus(err, "no CUDA device");
  if (count == 0) return absl::UnavailableError("no CUDA device: the driver reports 0 devices");
  return count;
}

absl::Status CudaAvailable() {
  // Devices do not come and go within a process; ask the driver once (launchers call this).
  static const absl::Status* const kAvailable = new absl::Status(CudaDeviceCount().status());
  return *kAvailable;
}

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: expected 0..", *count - 1, ", got ", device));
  }
  CudaDeviceInfo info;
  info.index = device;
  char name[256];
  const int err = cuda_raw::GetDeviceInfo(device, name, sizeof(name), &info.compute_major,
                                          &info.compute_minor, &info.total_bytes);
  if (err != 0) return CudaStatus(err, absl::StrCat("cudaGetDeviceProperties(", device, ")"));
  info.name = name;
  return info;
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> DeviceBuffer::Allocate(size_t bytes) {
  void* ptr = nullptr;
  const int err = cuda_raw::Malloc(&ptr, bytes == 0 ? 1 : bytes);
  if (err != 0) return CudaStatus(err, absl::StrCat("cudaMalloc(", bytes, " bytes)"));
  return std::unique_ptr<DeviceBuffer>(new DeviceBuffer(ptr, bytes));
}

DeviceBuffer::~DeviceBuffer() { cuda_raw::Free(data_); }

absl::Status DeviceBuffer::CopyFromHost(const void* src, size_t bytes) {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: expected <= buffer size ", bytes_, ", got ", bytes));
  }
  return CudaStatus(cuda_raw::MemcpyHostToDevice(data_, src, bytes), "cudaMemcpy H2D");
}

absl::Status DeviceBuffer::CopyToHost(void* dst, size_t bytes) const {
  if (bytes > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes: expected <= buffer size ", bytes_, ", got ", bytes));
  }
  return CudaStatus(cuda_raw::MemcpyDeviceToHost(dst, data_, bytes), "cudaMemcpy D2H");
}

}  // namespace deepinfer::kernels
