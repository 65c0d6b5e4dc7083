// Runs on every machine. Without a GPU (CI) the CUDA entry points must report kUnavailable with
// a reason instead of crashing; with one, they must work.
#include "kernels/cuda/device.h"

#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/rmsnorm_cuda.h"

namespace deepinfer::kernels {
namespace {

TEST(CudaDeviceTest, AvailabilityIsReportedEitherWay) {
  absl::Status available = CudaAvailable();
  if (available.ok()) {
    absl::StatusOr<CudaDeviceInfo> info = GetCudaDeviceInfo(0);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_FALSE(info->name.empty());
    EXPECT_GT(info->total_bytes, 0u);
    EXPECT_EQ(GetCudaDeviceInfo(-1).status().code(), absl::StatusCode::kInvalidArgument);
  } else {
    EXPECT_EQ(available.code(), absl::StatusCode::kUnavailable) << available;
    EXPECT_NE(available.message().find("no CUDA device"), absl::string_view::npos) << available;
    EXPECT_EQ(CudaDeviceCount().status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(GetCudaDeviceInfo(0).status().code(), absl::StatusCode::kUnavailable);
  }
}

TEST(CudaDeviceTest, EntryPointsFailCleanlyWithoutADevice) {
  if (CudaAvailable().ok()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(DeviceBuffer::Allocate(1024).status().code(), absl::StatusCode::kUnavailable);
  std::vector<float> x(4, 1.0f), w(4, 1.0f), y(4);
  RmsNormParams p;
  p.input = x.data();
  p.weight = w.data();
  p.output = y.data();
  p.rows = 1;
  p.hidden = 4;
  p.dtype = DType::kF32;
  absl::Status s = RmsNormCuda(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(CudaDeviceTest, ErrorsNameTheCall) {
  absl::Status s = CudaStatus(100, "cudaMalloc(8 bytes)");  // cudaErrorNoDevice
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cudaMalloc(8 bytes)"), absl::string_view::npos);
  EXPECT_NE(s.message().find("cudaErrorNoDevice"), absl::string_view::npos);
  EXPECT_EQ(CudaStatus(2, "x").code(), absl::StatusCode::kInternal);  // memory allocation
  EXPECT_TRUE(CudaStatus(0, "x").ok());
}

}  // namespace
}  // namespace deepinfer::kernels
