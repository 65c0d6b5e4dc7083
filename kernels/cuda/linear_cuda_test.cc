// CUDA dense projection (cuBLASLt) against the CPU op (kernels/linear_cpu.h reference path, with
// round_to = the buffers' type, on all cores) on random inputs: decode-sized and prefill-sized m
// (1, 3, 17, 64, 257, 4096), odd n and k, padded row strides for x and y (y's padding must stay
// untouched), bias and no bias, bf16 / f16 / f32, with cuBLASLt's workspace and without. A second
// call of the same shape reuses the cached algorithm and must give the same bits. Needs a GPU (tag
// "gpu").
#include "kernels/cuda/linear_cuda.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/linear_cpu.h"
#include "kernels/thread_pool.h"

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
  int64_t m, n, k;
  int64_t x_pad;  // ldx = k + x_pad (0: ldx left 0)
  int64_t y_pad;  // ldy = n + y_pad (0: ldy left 0)
  bool bias;
  bool workspace;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(DTypeName(c.dtype)) + "_m" + std::to_string(c.m) + "_n" + std::to_string(c.n) +
         "_k" + std::to_string(c.k) + (c.x_pad ? "_ldx" : "") + (c.y_pad ? "_ldy" : "") +
         (c.bias ? "_bias" : "") + (c.workspace ? "_ws" : "");
}

class LinearCudaTest : public CudaParamTest<Case> {};

TEST_P(LinearCudaTest, MatchesCpu) {
  const Case c = GetParam();
  std::mt19937 rng(11);
  const size_t es = DTypeSize(c.dtype);
  const int64_t ldx = c.k + c.x_pad, ldy = c.n + c.y_pad;
  // Weights ~ N(0, 1/k): outputs of order 1, as in a trained layer.
  std::vector<uint8_t> x = RandomTensor(c.dtype, c.m * ldx, rng);
  std::vector<uint8_t> w =
      RandomTensor(c.dtype, c.n * c.k, rng, 0.0f, 1.0f / std::sqrt(static_cast<float>(c.k)));
  std::vector<uint8_t> bias = RandomTensor(c.dtype, c.n, rng);
  // The CPU reference reads x as f32 (exactly the values x holds in dtype).
  const std::vector<float> x32 = ToF32(x, c.dtype);
  std::vector<float> want(c.m * ldy, 0.0f);
  LinearParams ref;
  ref.x = x32.data();
  ref.weight = w.data();
  ref.weight_dtype = c.dtype;
  ref.bias = c.bias ? bias.data() : nullptr;
  ref.y = want.data();
  ref.m = c.m;
  ref.n = c.n;
  ref.k = c.k;
  ref.ldy = ldy;
  ref.round_to = c.dtype;
  // LinearParams has no row stride for x: pack the used columns.
  std::vector<float> packed(c.m * c.k);
  for (int64_t r = 0; r < c.m; ++r) {
    std::memcpy(&packed[r * c.k], &x32[r * ldx], c.k * sizeof(float));
  }
  ref.x = packed.data();
  static const std::unique_ptr<ThreadPool> pool = ThreadPool::Create(0);
  LinearCpuReference(ref, pool.get());

  // y starts as a sentinel so that writes past n in each row show.
  std::vector<uint8_t> y0(c.m * ldy * es);
  for (int64_t i = 0; i < c.m * ldy; ++i) StoreFromF32(y0.data(), c.dtype, i, 1234.0f);
  auto dx = Upload(x);
  auto dw = Upload(w);
  auto db = Upload(bias);
  auto dy = Upload(y0);
  std::unique_ptr<DeviceBuffer> ws;
  LinearCudaParams p;
  p.x = dx->data();
  p.weight = dw->data();
  p.bias = c.bias ? db->data() : nullptr;
  p.y = dy->data();
  p.m = c.m;
  p.n = c.n;
  p.k = c.k;
  p.ldx = c.x_pad ? ldx : 0;
  p.ldy = c.y_pad ? ldy : 0;
  p.dtype = c.dtype;
  if (c.workspace) {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> buf =
        DeviceBuffer::Allocate(kLinearCudaWorkspaceBytes);
    ASSERT_TRUE(buf.ok()) << buf.status();
    ws = *std::move(buf);
    p.workspace = ws->data();
    p.workspace_bytes = kLinearCudaWorkspaceBytes;
  }
  const absl::Status s = LinearCuda(p, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<uint8_t> first = Download(*dy);
  const std::vector<float> got = ToF32(first, c.dtype);
  // Padding columns keep the sentinel; the used ones match the CPU within summation-order error
  // (f32: a few ulps of the sum; bf16 / f16: one ulp of the type after rounding).
  std::vector<float> want_used, got_used;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t j = 0; j < ldy; ++j) {
      if (j >= c.n) {
        ASSERT_EQ(got[r * ldy + j], 1234.0f) << "row " << r << " padding column " << j;
        continue;
      }
      want_used.push_back(want[r * ldy + j]);
      got_used.push_back(got[r * ldy + j]);
    }
  }
  const float rtol = c.dtype == DType::kF32 ? 1e-5f : (c.dtype == DType::kBF16 ? 1e-2f : 2e-3f);
  const float atol = c.dtype == DType::kF32 ? 1e-5f : rtol * 0.05f;
  ExpectNear(want_used, got_used, atol, rtol, "y");

  // The cached algorithm: the same bits again.
  ASSERT_TRUE(LinearCuda(p, nullptr).ok());
  EXPECT_EQ(Download(*dy), first) << "second call of the same shape differs";
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearCudaTest,
                         ::testing::Values(Case{DType::kBF16, 1, 384, 384, 0, 0, false, true},
                                           Case{DType::kBF16, 3, 1024, 384, 0, 0, true, true},
                                           Case{DType::kBF16, 17, 4096, 1024, 0, 8, false, false},
                                           Case{DType::kBF16, 64, 1000, 1029, 0, 0, false, true},
                                           Case{DType::kBF16, 257, 2304, 4096, 16, 0, true, true},
                                           Case{DType::kBF16, 4096, 512, 1024, 0, 0, false, true},
                                           Case{DType::kF16, 5, 768, 2048, 8, 8, true, true},
                                           Case{DType::kF16, 128, 96, 4096, 0, 0, false, false},
                                           Case{DType::kF32, 7, 512, 333, 0, 3, true, true},
                                           Case{DType::kF32, 64, 128, 64, 0, 0, false, false},
                                           Case{DType::kBF16, 0, 64, 64, 0, 0, false, false}),
                         Name);

}  // namespace
}  // namespace deepinfer::kernels
