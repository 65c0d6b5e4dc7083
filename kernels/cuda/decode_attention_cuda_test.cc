// CUDA paged decode attention against the CPU attention (kernels/attention_cpu.h reference path)
// on random inputs: one ragged decode batch per case with contexts 1, 15, 16, 17, 1000 and 4100
// (one and several partitions) plus an empty sequence; block sizes 16 (the engine's default) and
// 32; head_dim 64 and 128; GQA ratios 1, 4 and 8; no window and a 64-token window (blocks
// before the window are released, -1, as the engine does). Needs a GPU (tag "gpu").
#include "kernels/cuda/decode_attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention_cpu.h"
#include "kernels/cuda/cuda_test_util.h"

namespace deepinfer::kernels {
namespace {

using testing::CudaParamTest;
using testing::Download;
using testing::ExpectNear;
using testing::RandomTensor;
using testing::ShuffledBlockTables;
using testing::ToF32;
using testing::Upload;

struct Case {
  DType dtype;
  int block_size;
  int head_dim;
  int group;  // num_heads / num_kv_heads
  int window;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(DTypeName(c.dtype)) + "_bs" + std::to_string(c.block_size) + "_d" +
         std::to_string(c.head_dim) + "_g" + std::to_string(c.group) + "_w" +
         std::to_string(c.window);
}

class DecodeAttentionCudaTest : public CudaParamTest<Case> {};

TEST_P(DecodeAttentionCudaTest, MatchesCpu) {
  const Case c = GetParam();
  std::mt19937 rng(c.block_size * 1000 + c.head_dim * 10 + c.group + c.window);
  const std::vector<int32_t> contexts = {1, 15, 16, 17, 1000, 4100, 0};
  const int num_seqs = static_cast<int>(contexts.size());
  const int num_kv_heads = 2;
  const int num_heads = num_kv_heads * c.group;
  const int D = c.head_dim;
  const int max_context = *std::max_element(contexts.begin(), contexts.end());
  const int max_blocks = (max_context + c.block_size - 1) / c.block_size;

  int total_blocks = 0;
  std::vector<int32_t> tables =
      ShuffledBlockTables(contexts, c.block_size, max_blocks, rng, &total_blocks);
  if (c.window > 0) {  // released: blocks wholly before the window
    for (int s = 0; s < num_seqs; ++s) {
      const int first = std::max(0, contexts[s] - c.window);
      for (int b = 0; b < first / c.block_size; ++b) tables[s * max_blocks + b] = -1;
    }
  }
  const int64_t block_elements = static_cast<int64_t>(c.block_size) * num_kv_heads * D;
  const std::vector<uint8_t> k_pool = RandomTensor(c.dtype, total_blocks * block_elements, rng);
  const std::vector<uint8_t> v_pool = RandomTensor(c.dtype, total_blocks * block_elements, rng);
  const std::vector<uint8_t> q = RandomTensor(c.dtype, int64_t{num_seqs} * num_heads * D, rng);
  const std::vector<float> q32 = ToF32(q, c.dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<float> want(int64_t{num_seqs} * num_heads * D, 0.0f);
  for (int s = 0; s < num_seqs; ++s) {
    if (contexts[s] == 0) continue;  // contract: zero output
    PagedAttentionParams ap;
    ap.q = q32.data() + int64_t{s} * num_heads * D;
    ap.out = want.data() + int64_t{s} * num_heads * D;
    ap.num_tokens = 1;
    ap.start_position = contexts[s] - 1;
    ap.num_heads = num_heads;
    ap.num_kv_heads = num_kv_heads;
    ap.head_dim = D;
    ap.k_base = k_pool.data();
    ap.v_base = v_pool.data();
    ap.kv_dtype = c.dtype;
    ap.block_stride = block_elements;
    ap.block_size = c.block_size;
    ap.block_table = tables.data() + s * max_blocks;
    ap.sliding_window = c.window;
    ap.scale = scale;
    ap.round_to = c.dtype;
    PagedAttentionCpuReference(ap, nullptr);
  }

  auto dq = Upload(q);
  auto dk = Upload(k_pool);
  auto dv = Upload(v_pool);
  auto dtab = Upload(tables);
  auto dctx = Upload(contexts);
  auto dout = Upload(std::vector<uint8_t>(q.size(), 0x7f));
  DecodeAttentionParams p;
  p.q = dq->data();
  p.out = dout->data();
  p.k_cache = dk->data();
  p.v_cache = dv->data();
  p.block_tables = static_cast<const int32_t*>(dtab->data());
  p.context_lens = static_cast<const int32_t*>(dctx->data());
  p.num_seqs = num_seqs;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = D;
  p.block_size = c.block_size;
  p.num_blocks = total_blocks;
  p.max_blocks_per_seq = max_blocks;
  p.block_stride = block_elements;
  p.max_context_len = max_context;
  p.sliding_window = c.window;
  p.scale = scale;
  p.dtype = c.dtype;
  const size_t ws_bytes = DecodeAttentionWorkspaceBytes(p);
  if (c.window == 0) {
    EXPECT_GT(ws_bytes, 0u) << "4100 keys need several partitions";
  }
  auto dws = Upload(std::vector<uint8_t>(std::max<size_t>(ws_bytes, 1)));
  p.workspace = dws->data();
  p.workspace_bytes = ws_bytes;
  ASSERT_TRUE(DecodeAttentionCuda(p, nullptr).ok());
  const std::vector<float> got = ToF32(Download(*dout), c.dtype);

  // f32: summation order only. bf16/f16: the CPU rounds each probability to the type (the GPU
  // keeps f32), and a score can round to the neighbouring value of the type; about one ulp.
  const float rtol = c.dtype == DType::kF32 ? 1e-4f : (c.dtype == DType::kBF16 ? 1.6e-2f : 2e-3f);
  const float atol = c.dtype == DType::kF32 ? 1e-5f : (c.dtype == DType::kBF16 ? 4e-3f : 1e-3f);
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t off = int64_t{s} * num_heads * D;
    ExpectNear(std::vector<float>(want.begin() + off, want.begin() + off + num_heads * D),
               std::vector<float>(got.begin() + off, got.begin() + off + num_heads * D), atol, rtol,
               "context " + std::to_string(contexts[s]));
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int block_size : {16, 32}) {
      for (int head_dim : {64, 128}) {
        for (int group : {1, 4, 8}) {
          for (int window : {0, 64}) cases.push_back({dtype, block_size, head_dim, group, window});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeAttentionCudaTest, ::testing::ValuesIn(AllCases()), Name);

// Odd shapes: head_dim 32, 96 and 256, the largest group, a window wider than a partition.
INSTANTIATE_TEST_SUITE_P(Edges, DecodeAttentionCudaTest,
                         ::testing::Values(Case{DType::kF32, 16, 32, 2, 0},
                                           Case{DType::kBF16, 16, 96, 3, 0},
                                           Case{DType::kF32, 8, 256, 16, 0},
                                           Case{DType::kBF16, 16, 256, 2, 300},
                                           Case{DType::kF16, 64, 128, 16, 1000}),
                         Name);

}  // namespace
}  // namespace deepinfer::kernels
