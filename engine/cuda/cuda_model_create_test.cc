// Runs everywhere: what CudaModel::Create refuses, before and without a device.
#include <memory>
#include <vector>

#include "engine/cuda/cuda_model.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"

namespace deepinfer::engine {
namespace {

std::unique_ptr<Model> Load(const char* dir) {
  auto m = Model::Load(dir, ModelOptions{1});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

TEST(CudaModelCreateTest, RefusesWhatTheKernelsCannotRunNamingWhy) {
  CudaModelOptions options;
  options.num_blocks = 8;
  // head_dim 16: below the attention kernels' multiple of 32.
  auto llama = Load("engine/testdata/models/llama");
  ASSERT_NE(llama, nullptr);
  auto s = CudaModel::Create(*llama, options);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.status().message().find("head_dim 16"), std::string::npos) << s.status();
  // Mixture-of-experts layers run (head_dim 32): without a device, only the device is missing.
  auto moe = Load("engine/testdata/models/qwen3_moe");
  ASSERT_NE(moe, nullptr);
  s = CudaModel::Create(*moe, options);
  if (!kernels::CudaAvailable().ok()) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  }
}

TEST(CudaModelCreateTest, BadOptionsNameTheField) {
  auto qwen3 = Load("engine/testdata/models/qwen3");
  ASSERT_NE(qwen3, nullptr);
  CudaModelOptions options;
  options.num_blocks = 0;
  auto s = CudaModel::Create(*qwen3, options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("num_blocks"), std::string::npos);
  options.num_blocks = 4;
  options.block_size = 0;
  s = CudaModel::Create(*qwen3, options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("block_size"), std::string::npos);
  options.block_size = 16;
  options.graph_max_batch = 8;  // without graph_max_blocks_per_seq
  s = CudaModel::Create(*qwen3, options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("graph_max_blocks_per_seq"), std::string::npos);
}

TEST(CudaModelCreateTest, WithoutADeviceSaysUnavailable) {
  auto qwen3 = Load("engine/testdata/models/qwen3");
  ASSERT_NE(qwen3, nullptr);
  CudaModelOptions options;
  options.num_blocks = 4;
  auto model = CudaModel::Create(*qwen3, options);
  if (kernels::CudaAvailable().ok()) {
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_GT((*model)->weight_bytes(), 0u);
    // layers x (K, V) x blocks x block_size x kv heads x head_dim x f32
    EXPECT_EQ((*model)->kv_bytes(), 2u * 2 * 4 * 16 * 2 * 32 * 4);
  } else {
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kUnavailable) << model.status();
  }
}

TEST(CudaModelCreateTest, SyntheticWeightsFollowTheSameChecks) {
  auto moe = LoadModelConfig("engine/testdata/models/qwen3_moe");
  ASSERT_TRUE(moe.ok()) << moe.status();
  moe->moe.num_experts = 1000;  // beyond the routing kernel's 512
  CudaModelOptions options;
  options.num_blocks = 4;
  auto s = CudaModel::CreateRandom(*moe, options, 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented) << s.status();
  EXPECT_NE(s.status().message().find("1000 experts"), std::string::npos) << s.status();
  auto dense = LoadModelConfig("engine/testdata/models/qwen3");
  ASSERT_TRUE(dense.ok()) << dense.status();
  s = CudaModel::CreateRandom(*dense, options, 1);
  if (kernels::CudaAvailable().ok()) {
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<float> logits;
    const int32_t tokens[3] = {1, 2, 3};
    const int32_t table[1] = {0};
    SequenceInput in;
    in.tokens = tokens;
    in.num_tokens = 3;
    in.block_table = table;
    in.num_blocks = 1;
    ASSERT_TRUE((*s)->Forward({in}, &logits).ok());
    EXPECT_EQ(static_cast<int>(logits.size()), dense->vocab_size);
  } else {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  }
}

}  // namespace
}  // namespace deepinfer::engine
