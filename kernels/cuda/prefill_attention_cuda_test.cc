// CUDA paged prefill attention against the CPU attention (kernels/attention_cpu.h reference path)
// on random inputs: one ragged batch per case whose sequences have (cached prefix, new rows) =
// (0, 1), (0, 17), (5, 16), (100, 33), (0, 300), (1000, 64), (30, 5) and (7, 0): single rows,
// rows across query tiles, prefixes across key tiles and blocks, a sequence with no rows; block
// sizes 16 and 32; head_dim 64 and 128; GQA ratios 1 and 4; no window and a 64-token window
// (blocks wholly before every row's window are released, -1, as the engine does). Needs a GPU
// (tag "gpu").
#include "kernels/cuda/prefill_attention_cuda.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>
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

class PrefillAttentionCudaTest : public CudaParamTest<Case> {};

TEST_P(PrefillAttentionCudaTest, MatchesCpu) {
  const Case c = GetParam();
  std::mt19937 rng(c.block_size * 1000 + c.head_dim * 10 + c.group + c.window);
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{0, 1},   {0, 17},    {5, 16}, {100, 33},
                                                         {0, 300}, {1000, 64}, {30, 5}, {7, 0}};
  const int num_seqs = static_cast<int>(seqs.size());
  const int num_kv_heads = 2;
  const int num_heads = num_kv_heads * c.group;
  const int D = c.head_dim;
  int max_context = 0, max_rows = 0, total_rows = 0;
  std::vector<int32_t> query_starts = {0}, start_positions;
  for (const auto& [start, rows] : seqs) {
    max_context = std::max(max_context, start + rows);
    max_rows = std::max(max_rows, rows);
    total_rows += rows;
    query_starts.push_back(total_rows);
    start_positions.push_back(start);
  }
  const int max_blocks = (max_context + c.block_size - 1) / c.block_size;

  std::vector<int32_t> contexts;
  for (const auto& [start, rows] : seqs) contexts.push_back(start + rows);
  int total_blocks = 0;
  std::vector<int32_t> tables =
      ShuffledBlockTables(contexts, c.block_size, max_blocks, rng, &total_blocks);
  if (c.window > 0) {  // released: blocks wholly before the first row's window
    for (int s = 0; s < num_seqs; ++s) {
      const int first = std::max(0, seqs[s].first - c.window + 1);
      for (int b = 0; b < first / c.block_size; ++b) tables[s * max_blocks + b] = -1;
    }
  }
  const int64_t block_elements = static_cast<int64_t>(c.block_size) * num_kv_heads * D;
  const std::vector<uint8_t> k_pool = RandomTensor(c.dtype, total_blocks * block_elements, rng);
  const std::vector<uint8_t> v_pool = RandomTensor(c.dtype, total_blocks * block_elements, rng);
  const std::vector<uint8_t> q = RandomTensor(c.dtype, int64_t{total_rows} * num_heads * D, rng);
  const std::vector<float> q32 = ToF32(q, c.dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<float> want(int64_t{total_rows} * num_heads * D, 0.0f);
  for (int s = 0; s < num_seqs; ++s) {
    const auto [start, rows] = seqs[s];
    if (rows == 0) continue;
    PagedAttentionParams ap;
    ap.q = q32.data() + int64_t{query_starts[s]} * num_heads * D;
    ap.out = want.data() + int64_t{query_starts[s]} * num_heads * D;
    ap.num_tokens = rows;
    ap.start_position = start;
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
  auto dstarts = Upload(query_starts);
  auto dpos = Upload(start_positions);
  auto dout = Upload(std::vector<uint8_t>(q.size(), 0x7f));
  PrefillAttentionParams p;
  p.q = dq->data();
  p.out = dout->data();
  p.k_cache = dk->data();
  p.v_cache = dv->data();
  p.block_tables = static_cast<const int32_t*>(dtab->data());
  p.query_starts = static_cast<const int32_t*>(dstarts->data());
  p.start_positions = static_cast<const int32_t*>(dpos->data());
  p.num_seqs = num_seqs;
  p.num_heads = num_heads;
  p.num_kv_heads = num_kv_heads;
  p.head_dim = D;
  p.block_size = c.block_size;
  p.num_blocks = total_blocks;
  p.max_blocks_per_seq = max_blocks;
  p.block_stride = block_elements;
  p.max_query_len = max_rows;
  p.sliding_window = c.window;
  p.scale = scale;
  p.dtype = c.dtype;
  const absl::Status status = PrefillAttentionCuda(p, nullptr);
  ASSERT_TRUE(status.ok()) << status;
  const std::vector<float> got = ToF32(Download(*dout), c.dtype);

  // f32: summation order only. bf16/f16: the CPU rounds each probability to the type (the GPU
  // keeps f32), and a score can round to the neighbouring value of the type; about one ulp.
  const float rtol = c.dtype == DType::kF32 ? 1e-4f : (c.dtype == DType::kBF16 ? 1.6e-2f : 2e-3f);
  const float atol = c.dtype == DType::kF32 ? 1e-5f : (c.dtype == DType::kBF16 ? 4e-3f : 1e-3f);
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t begin = int64_t{query_starts[s]} * num_heads * D;
    const int64_t end = int64_t{query_starts[s + 1]} * num_heads * D;
    ExpectNear(std::vector<float>(want.begin() + begin, want.begin() + end),
               std::vector<float>(got.begin() + begin, got.begin() + end), atol, rtol,
               "sequence " + std::to_string(s) + " (prefix " + std::to_string(seqs[s].first) +
                   ", rows " + std::to_string(seqs[s].second) + ")");
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int block_size : {16, 32}) {
      for (int head_dim : {64, 128}) {
        for (int group : {1, 4}) {
          for (int window : {0, 64}) cases.push_back({dtype, block_size, head_dim, group, window});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, PrefillAttentionCudaTest, ::testing::ValuesIn(AllCases()), Name);

// Odd shapes: head_dim 32, 96 and 256 (dynamic shared memory past 48 KiB), a group of 8, a
// window narrower than a key tile.
INSTANTIATE_TEST_SUITE_P(Edges, PrefillAttentionCudaTest,
                         ::testing::Values(Case{DType::kF32, 16, 32, 2, 0},
                                           Case{DType::kBF16, 16, 96, 3, 0},
                                           Case{DType::kF32, 8, 256, 8, 0},
                                           Case{DType::kBF16, 16, 256, 2, 300},
                                           Case{DType::kF16, 64, 128, 8, 7}),
                         Name);

}  // namespace
}  // namespace deepinfer::kernels
