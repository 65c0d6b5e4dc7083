// CUDA RoPE against the CPU reference (kernels/rope.h ApplyRopeCpu, the engine's numerics) for
// every scaling, ragged batches with per-token positions, and strided q/k slices of a fused qkv
// buffer. Needs a GPU (tag "gpu").
#include "kernels/cuda/rope_cuda.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/rope.h"

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
  RopeScalingType scaling;
  int head_dim;
  int num_heads;
  int num_kv_heads;
  std::vector<int> seq_lens;  // ragged batch
  bool fused_qkv;             // q and k are slices of one [tokens, (h + 2 kv) * d] buffer
};

class RopeCudaTest : public CudaParamTest<Case> {};

TEST_P(RopeCudaTest, MatchesCpu) {
  const Case c = GetParam();
  std::mt19937 rng(11);
  RopeScaling scaling;
  scaling.type = c.scaling;
  if (c.scaling == RopeScalingType::kLinear) scaling.factor = 4.0;
  if (c.scaling == RopeScalingType::kLlama3) {
    scaling.theta = 500000.0;
    scaling.factor = 8.0;
    scaling.original_max_position_embeddings = 8192;
  }
  std::vector<float> inv_freq(c.head_dim / 2);
  RopeInvFreq(scaling, c.head_dim, inv_freq.data());

  // Positions: each sequence continues from a random start (prefill chunks and decode steps);
  // one padding token (position -1) is left untouched.
  std::vector<int32_t> positions;
  std::uniform_int_distribution<int32_t> start_dist(0, 131000);
  for (int len : c.seq_lens) {
    const int32_t start = len == 1 ? start_dist(rng) : start_dist(rng) % 5000;
    for (int i = 0; i < len; ++i) positions.push_back(start + i);
  }
  positions.push_back(-1);
  const int64_t tokens = positions.size();
  const int64_t q_width = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t k_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t row = c.fused_qkv ? q_width + 2 * k_width : 0;

  std::vector<uint8_t> q_host, k_host;
  std::vector<float> q_ref, k_ref;
  std::vector<int64_t> pos64(positions.begin(), positions.end());
  pos64.back() = 0;  // reference: rotate the padding row by 0 (identity) rather than skip it
  if (c.fused_qkv) {
    q_host = RandomTensor(c.dtype, tokens * row, rng);
    q_ref = ToF32(q_host, c.dtype);
    ApplyRopeCpu(q_ref.data(), tokens, row, c.num_heads, c.head_dim, pos64.data(),
                 inv_freq.data(), c.dtype);
    ApplyRopeCpu(q_ref.data() + q_width, tokens, row, c.num_kv_heads, c.head_dim, pos64.data(),
                 inv_freq.data(), c.dtype);
  } else {
    q_host = RandomTensor(c.dtype, tokens * q_width, rng);
    k_host = RandomTensor(c.dtype, tokens * k_width, rng);
    q_ref = ToF32(q_host, c.dtype);
    k_ref = ToF32(k_host, c.dtype);
    ApplyRopeCpu(q_ref.data(), tokens, q_width, c.num_heads, c.head_dim, pos64.data(),
                 inv_freq.data(), c.dtype);
    ApplyRopeCpu(k_ref.data(), tokens, k_width, c.num_kv_heads, c.head_dim, pos64.data(),
                 inv_freq.data(), c.dtype);
  }

  auto d_q = Upload(q_host);
  auto d_k = c.fused_qkv ? nullptr : Upload(k_host);
  auto d_pos = Upload(positions);
  auto d_inv = Upload(inv_freq);
  RopeParams p;
  p.q = d_q->data();
  p.k = c.num_kv_heads == 0 ? nullptr
        : c.fused_qkv      ? static_cast<uint8_t*>(d_q->data()) + q_width * DTypeSize(c.dtype)
                           : d_k->data();
  p.positions = static_cast<const int32_t*>(d_pos->data());
  p.inv_freq = static_cast<const float*>(d_inv->data());
  p.num_tokens = tokens;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.q_row_stride = row;
  p.k_row_stride = row;
  p.dtype = c.dtype;
  ASSERT_TRUE(RopeCuda(p, nullptr).ok());

  // cos/sin come from the device's cosf/sinf (<= 2 ulp of f32) and the host's: f32 results agree
  // to a few f32 ulps; in bf16/f16 a rounding boundary can move a result by one ulp of the type.
  const float rtol = c.dtype == DType::kF32 ? 2e-6f : (c.dtype == DType::kBF16 ? 8e-3f : 1e-3f);
  // A one-ulp change of a rounded product before the difference is absolute (inputs are O(1)).
  const float atol = c.dtype == DType::kF32 ? 2e-6f : (c.dtype == DType::kBF16 ? 3e-2f : 4e-3f);
  ExpectNear(q_ref, ToF32(Download(*d_q), c.dtype), atol, rtol, "q");
  if (!c.fused_qkv) ExpectNear(k_ref, ToF32(Download(*d_k), c.dtype), atol, rtol, "k");
  // The padding token is untouched (the reference rotated it by angle 0, the identity).
  const std::vector<float> got = ToF32(Download(*d_q), c.dtype);
  const std::vector<float> orig = ToF32(q_host, c.dtype);
  const int64_t last = (tokens - 1) * (c.fused_qkv ? row : q_width);
  for (int64_t i = 0; i < q_width; ++i) ASSERT_EQ(got[last + i], orig[last + i]) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeCudaTest,
    ::testing::Values(
        Case{DType::kF32, RopeScalingType::kDefault, 64, 4, 2, {5, 1, 17}, false},
        Case{DType::kBF16, RopeScalingType::kDefault, 128, 32, 8, {1, 1, 1, 40}, false},
        Case{DType::kF16, RopeScalingType::kDefault, 128, 8, 8, {33}, false},
        Case{DType::kBF16, RopeScalingType::kLinear, 64, 8, 2, {3, 9}, true},
        Case{DType::kF32, RopeScalingType::kLlama3, 128, 8, 2, {1, 20, 1}, false},
        Case{DType::kBF16, RopeScalingType::kLlama3, 128, 32, 8, {7, 1, 64}, true},
        Case{DType::kF16, RopeScalingType::kLlama3, 256, 4, 1, {2, 1}, false},
        Case{DType::kF32, RopeScalingType::kLinear, 96, 6, 0, {4}, false}));

}  // namespace
}  // namespace deepinfer::kernels
