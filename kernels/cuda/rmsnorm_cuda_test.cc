// CUDA RMSNorm against the CPU reference. Needs a GPU (tag "gpu").
#include "kernels/cuda/rmsnorm_cuda.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"
#include "kernels/rmsnorm_cpu.h"

namespace deepinfer::kernels {
namespace {

struct Case {
  DType dtype;
  int64_t rows;
  int64_t hidden;
  bool residual;
  float weight_offset;
};

std::vector<uint8_t> RandomTensor(DType t, int64_t n, std::mt19937& rng, float mean) {
  std::normal_distribution<float> dist(mean, 1.0f);
  std::vector<uint8_t> out(n * DTypeSize(t));
  for (int64_t i = 0; i < n; ++i) StoreFromF32(out.data(), t, i, dist(rng));
  return out;
}

class RmsNormCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    absl::Status available = CudaAvailable();
    if (!available.ok()) GTEST_SKIP() << available;
  }
};

TEST_P(RmsNormCudaTest, MatchesCpu) {
  const Case c = GetParam();
  std::mt19937 rng(42);
  const int64_t n = c.rows * c.hidden;
  const size_t bytes = n * DTypeSize(c.dtype);
  std::vector<uint8_t> x = RandomTensor(c.dtype, n, rng, 0.0f);
  std::vector<uint8_t> w = RandomTensor(c.dtype, c.hidden, rng, 1.0f);
  std::vector<uint8_t> r = RandomTensor(c.dtype, n, rng, 0.0f);

  RmsNormParams cpu;
  std::vector<uint8_t> y_cpu(bytes), r_cpu(bytes);
  cpu.input = x.data();
  cpu.weight = w.data();
  cpu.output = y_cpu.data();
  if (c.residual) {
    cpu.residual = r.data();
    cpu.residual_out = r_cpu.data();
  }
  cpu.rows = c.rows;
  cpu.hidden = c.hidden;
  cpu.weight_offset = c.weight_offset;
  cpu.dtype = c.dtype;
  ASSERT_TRUE(RmsNormCpu(cpu).ok());

  auto dx = DeviceBuffer::Allocate(bytes).value();
  auto dw = DeviceBuffer::Allocate(w.size()).value();
  auto dr = DeviceBuffer::Allocate(bytes).value();
  auto dy = DeviceBuffer::Allocate(bytes).value();
  ASSERT_TRUE(dx->CopyFromHost(x.data(), bytes).ok());
  ASSERT_TRUE(dw->CopyFromHost(w.data(), w.size()).ok());
  ASSERT_TRUE(dr->CopyFromHost(r.data(), bytes).ok());
  RmsNormParams gpu = cpu;
  gpu.input = dx->data();
  gpu.weight = dw->data();
  gpu.output = dy->data();
  if (c.residual) {
    gpu.residual = dr->data();
    gpu.residual_out = dr->data();  // in place, as the engine uses it
  }
  ASSERT_TRUE(RmsNormCuda(gpu, nullptr).ok());
  ASSERT_TRUE(CudaStatus(cuda_raw::StreamSynchronize(nullptr), "sync").ok());
  std::vector<uint8_t> y_gpu(bytes), r_gpu(bytes);
  ASSERT_TRUE(dy->CopyToHost(y_gpu.data(), bytes).ok());
  ASSERT_TRUE(dr->CopyToHost(r_gpu.data(), bytes).ok());

  // Reduction order differs (tree vs sequential), so allow one unit in the last place of the
  // output type; the residual sum is exact.
  const float tol = c.dtype == DType::kF32 ? 1e-5f : (c.dtype == DType::kBF16 ? 1.6e-2f : 2e-3f);
  for (int64_t i = 0; i < n; ++i) {
    const float a = LoadAsF32(y_cpu.data(), c.dtype, i);
    const float b = LoadAsF32(y_gpu.data(), c.dtype, i);
    ASSERT_NEAR(a, b, tol * std::max(1.0f, std::fabs(a))) << "element " << i;
  }
  if (c.residual) {
    EXPECT_EQ(r_cpu, r_gpu);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormCudaTest,
                         ::testing::Values(Case{DType::kF32, 4, 512, false, 0.0f},
                                           Case{DType::kBF16, 7, 4096, false, 0.0f},
                                           Case{DType::kBF16, 3, 67, true, 0.0f},
                                           Case{DType::kF16, 5, 1000, true, 0.0f},
                                           Case{DType::kBF16, 2, 2048, false, 1.0f},
                                           Case{DType::kBF16, 0, 128, false, 0.0f}));

}  // namespace
}  // namespace deepinfer::kernels
