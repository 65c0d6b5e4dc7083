// CUDA KV-cache write against the host store the CPU engine does (engine/model.cc: StoreFromF32 of
// each new token's K/V into block_table[pos / block_size], slot pos % block_size), for ragged
// batches with shuffled block tables. Needs a GPU (tag "gpu").
#include "kernels/cuda/kv_write_cuda.h"

#include <algorithm>
#include <numeric>
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
  DType src_dtype;
  DType cache_dtype;
  int num_kv_heads;
  int head_dim;
  int block_size;
  std::vector<int> starts;  // per sequence: position of its first new token
  std::vector<int> lens;    // per sequence: new tokens
  int64_t row_pad;          // extra elements per K/V row (strided source)
};

class KvWriteCudaTest : public CudaParamTest<Case> {};

TEST_P(KvWriteCudaTest, MatchesHostStore) {
  const Case c = GetParam();
  std::mt19937 rng(5);
  const int num_seqs = static_cast<int>(c.lens.size());
  int max_blocks = 1;
  for (int s = 0; s < num_seqs; ++s) {
    max_blocks = std::max(max_blocks, (c.starts[s] + c.lens[s] + c.block_size - 1) / c.block_size);
  }
  const int num_blocks = num_seqs * max_blocks + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(num_seqs * max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = ids[i];

  std::vector<int32_t> positions, token_seq;
  for (int s = 0; s < num_seqs; ++s) {
    for (int i = 0; i < c.lens[s]; ++i) {
      positions.push_back(c.starts[s] + i);
      token_seq.push_back(s);
    }
  }
  positions.push_back(-1);  // padding
  token_seq.push_back(0);
  const int64_t tokens = positions.size();
  const int64_t width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t row = width + c.row_pad;
  const int64_t block_elements = width * c.block_size;
  const std::vector<uint8_t> k = RandomTensor(c.src_dtype, tokens * row, rng);
  const std::vector<uint8_t> v = RandomTensor(c.src_dtype, tokens * row, rng);
  const size_t pool_bytes = num_blocks * block_elements * DTypeSize(c.cache_dtype);
  // Existing cache contents (earlier tokens) must survive.
  const std::vector<uint8_t> k_pool = RandomTensor(c.cache_dtype, num_blocks * block_elements, rng);
  const std::vector<uint8_t> v_pool = RandomTensor(c.cache_dtype, num_blocks * block_elements, rng);

  std::vector<uint8_t> k_want = k_pool, v_want = v_pool;
  for (int64_t t = 0; t + 1 < tokens; ++t) {
    const int64_t dst = static_cast<int64_t>(tables[token_seq[t] * max_blocks +
                                                    positions[t] / c.block_size]) *
                            block_elements +
                        (positions[t] % c.block_size) * width;
    for (int64_t i = 0; i < width; ++i) {
      StoreFromF32(k_want.data(), c.cache_dtype, dst + i, LoadAsF32(k.data(), c.src_dtype, t * row + i));
      StoreFromF32(v_want.data(), c.cache_dtype, dst + i, LoadAsF32(v.data(), c.src_dtype, t * row + i));
    }
  }

  auto dk = Upload(k);
  auto dv = Upload(v);
  auto dkc = Upload(k_pool);
  auto dvc = Upload(v_pool);
  auto dpos = Upload(positions);
  auto dseq = Upload(token_seq);
  auto dtab = Upload(tables);
  KvWriteParams p;
  p.k = dk->data();
  p.v = dv->data();
  p.k_cache = dkc->data();
  p.v_cache = dvc->data();
  p.positions = static_cast<const int32_t*>(dpos->data());
  p.token_seq = static_cast<const int32_t*>(dseq->data());
  p.block_tables = static_cast<const int32_t*>(dtab->data());
  p.num_tokens = tokens;
  p.num_seqs = num_seqs;
  p.max_blocks_per_seq = max_blocks;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.block_size = c.block_size;
  p.num_blocks = num_blocks;
  p.block_stride = block_elements;
  p.k_row_stride = row;
  p.v_row_stride = row;
  p.src_dtype = c.src_dtype;
  p.cache_dtype = c.cache_dtype;
  ASSERT_TRUE(KvWriteCuda(p, nullptr).ok());
  ASSERT_EQ(Download(*dkc).size(), pool_bytes);
  EXPECT_TRUE(Download(*dkc) == k_want) << "K pool differs";
  EXPECT_TRUE(Download(*dvc) == v_want) << "V pool differs";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvWriteCudaTest,
    ::testing::Values(
        // Prefill of three prompts, one continuing a prefix.
        Case{DType::kBF16, DType::kBF16, 8, 128, 16, {0, 0, 32}, {17, 1, 40}, 0},
        // Decode step: one token per sequence at block boundaries.
        Case{DType::kF16, DType::kF16, 2, 64, 16, {15, 16, 0, 1023}, {1, 1, 1, 1}, 0},
        Case{DType::kF32, DType::kF32, 4, 64, 32, {5, 31}, {30, 2}, 0},
        // Fused qkv source rows; f32 activations into a bf16 cache.
        Case{DType::kF32, DType::kBF16, 4, 128, 16, {3, 100}, {9, 1}, 256},
        Case{DType::kBF16, DType::kBF16, 1, 96, 1, {0, 7}, {3, 5}, 96}));

}  // namespace
}  // namespace deepinfer::kernels
