// CUDA embedding gather against the host gather the CPU engine does (engine/model.cc: LoadAsF32
// of the weight row, stored in the activation type). Needs a GPU (tag "gpu").
#include "kernels/cuda/embedding_cuda.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"

namespace deepinfer::kernels {
namespace {

using testing::CudaParamTest;
using testing::Download;
using testing::RandomTensor;
using testing::Upload;

struct Case {
  DType weight_dtype;
  DType out_dtype;
  int64_t vocab;
  int64_t hidden;
  int64_t num_tokens;
  int64_t out_row_stride;
};

class EmbeddingCudaTest : public CudaParamTest<Case> {};

TEST_P(EmbeddingCudaTest, MatchesHostGather) {
  const Case c = GetParam();
  std::mt19937 rng(7);
  const std::vector<uint8_t> weight = RandomTensor(c.weight_dtype, c.vocab * c.hidden, rng);
  std::uniform_int_distribution<int32_t> id_dist(0, static_cast<int32_t>(c.vocab - 1));
  std::vector<int32_t> ids(c.num_tokens);
  for (int32_t& id : ids) id = id_dist(rng);
  // Out-of-range ids produce zero rows.
  if (c.num_tokens >= 3) {
    ids[1] = -1;
    ids[2] = static_cast<int32_t>(c.vocab);
  }
  const int64_t stride = c.out_row_stride == 0 ? c.hidden : c.out_row_stride;
  const size_t out_bytes = c.num_tokens * stride * DTypeSize(c.out_dtype);
  // Sentinel fill: the gaps between strided rows must stay untouched.
  std::vector<uint8_t> sentinel(out_bytes, 0x5a);

  auto d_ids = Upload(ids);
  auto d_weight = Upload(weight);
  auto d_out = Upload(sentinel);
  EmbeddingParams p;
  p.token_ids = static_cast<const int32_t*>(d_ids->data());
  p.weight = d_weight->data();
  p.out = d_out->data();
  p.num_tokens = c.num_tokens;
  p.vocab_size = c.vocab;
  p.hidden = c.hidden;
  p.out_row_stride = c.out_row_stride;
  p.weight_dtype = c.weight_dtype;
  p.out_dtype = c.out_dtype;
  ASSERT_TRUE(EmbeddingCuda(p, nullptr).ok());
  const std::vector<uint8_t> got = Download(*d_out);

  std::vector<uint8_t> want = sentinel;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    const bool valid = ids[t] >= 0 && ids[t] < c.vocab;
    for (int64_t i = 0; i < c.hidden; ++i) {
      const float v = valid ? LoadAsF32(weight.data(), c.weight_dtype, ids[t] * c.hidden + i) : 0;
      StoreFromF32(want.data(), c.out_dtype, t * stride + i, v);
    }
  }
  EXPECT_EQ(want, got);  // a conversion: bit-exact
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmbeddingCudaTest,
    ::testing::Values(Case{DType::kF32, DType::kF32, 768, 64, 9, 0},
                      Case{DType::kBF16, DType::kBF16, 32000, 4096, 37, 0},
                      Case{DType::kF16, DType::kF16, 1000, 1000, 5, 0},
                      Case{DType::kF32, DType::kBF16, 500, 257, 17, 0},
                      Case{DType::kBF16, DType::kF32, 500, 130, 4, 0},
                      Case{DType::kF16, DType::kBF16, 300, 96, 3, 0},
                      Case{DType::kBF16, DType::kF16, 300, 96, 6, 200},
                      Case{DType::kF32, DType::kF16, 300, 33, 0, 0}));

}  // namespace
}  // namespace deepinfer::kernels
