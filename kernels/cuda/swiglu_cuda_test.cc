// CUDA SwiGLU against the CPU op (kernels/activation_cpu.h SwiGluCpu with round_to = the
// buffers' type), separate and fused gate/up layouts. Needs a GPU (tag "gpu").
#include "kernels/cuda/swiglu_cuda.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation_cpu.h"
#include "kernels/cuda/cuda_test_util.h"

namespace deepinfer::kernels {
namespace {

using testing::CudaParamTest;
using testing::Download;
using testing::ExpectNear;
using testing::RandomTensor;
using testing::ToF32;
using testing::Upload;

struct Case {
  DType dtype;
  int64_t rows;
  int64_t width;
  bool fused;  // gate_up = [rows, 2 * width]; out written over the gate half
};

class SwiGluCudaTest : public CudaParamTest<Case> {};

TEST_P(SwiGluCudaTest, MatchesCpu) {
  const Case c = GetParam();
  std::mt19937 rng(3);
  const int64_t n = c.rows * c.width;
  std::vector<uint8_t> gate = RandomTensor(c.dtype, n, rng, 0.0f, 3.0f);
  std::vector<uint8_t> up = RandomTensor(c.dtype, n, rng);
  std::vector<float> g32 = ToF32(gate, c.dtype), u32 = ToF32(up, c.dtype), want(n);
  SwiGluCpu(g32.data(), u32.data(), want.data(), n, c.dtype, nullptr);

  SwiGluParams p;
  p.rows = c.rows;
  p.width = c.width;
  p.dtype = c.dtype;
  std::vector<float> got(n);
  const size_t es = DTypeSize(c.dtype);
  if (c.fused) {
    std::vector<uint8_t> gate_up(2 * n * es);
    for (int64_t r = 0; r < c.rows; ++r) {
      std::memcpy(&gate_up[2 * r * c.width * es], &gate[r * c.width * es], c.width * es);
      std::memcpy(&gate_up[(2 * r + 1) * c.width * es], &up[r * c.width * es], c.width * es);
    }
    auto d = Upload(gate_up);
    p.gate = d->data();
    p.up = static_cast<uint8_t*>(d->data()) + c.width * es;
    p.out = d->data();
    p.gate_row_stride = p.up_row_stride = p.out_row_stride = 2 * c.width;
    ASSERT_TRUE(SwiGluCuda(p, nullptr).ok());
    const std::vector<float> all = ToF32(Download(*d), c.dtype);
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t i = 0; i < c.width; ++i) {
        got[r * c.width + i] = all[2 * r * c.width + i];
        ASSERT_EQ(all[(2 * r + 1) * c.width + i], u32[r * c.width + i]) << "up was modified";
      }
    }
  } else {
    auto dg = Upload(gate);
    auto du = Upload(up);
    auto dout = Upload(std::vector<uint8_t>(n * es));
    p.gate = dg->data();
    p.up = du->data();
    p.out = dout->data();
    ASSERT_TRUE(SwiGluCuda(p, nullptr).ok());
    got = ToF32(Download(*dout), c.dtype);
  }
  // expf differs by a few f32 ulps between device and host; in bf16/f16 that can move the rounded
  // silu, and then the product, by one ulp of the type.
  const float tol = c.dtype == DType::kF32 ? 1e-6f : (c.dtype == DType::kBF16 ? 1.6e-2f : 2e-3f);
  ExpectNear(want, got, tol * 1e-2f, tol, "out");
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwiGluCudaTest,
                         ::testing::Values(Case{DType::kF32, 3, 1000, false},
                                           Case{DType::kBF16, 17, 11008, false},
                                           Case{DType::kF16, 5, 4096, false},
                                           Case{DType::kBF16, 9, 1537, true},
                                           Case{DType::kF32, 2, 96, true},
                                           Case{DType::kF16, 0, 64, false}));

}  // namespace
}  // namespace deepinfer::kernels
