// The router's hash chain must be exactly what a worker's engine stores and publishes: checked
// against the engine's own helpers and against the KV events of a real LlmEngine run.
#include "router/prompt_block_hashes.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/block_hash.h"
#include "engine/block_manager.h"
#include "engine/llm_engine.h"
#include "engine/model.h"
#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {

std::vector<uint32_t> Prompt(int n, uint32_t offset) {
  std::vector<uint32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((static_cast<uint32_t>(i) * 37 + offset) % 760 + 1);
  return p;
}

TEST(PromptBlockHashesTest, EqualsTheEngineChain) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, ~uint64_t{0}}) {
    for (const char* salt : {"", "tenant-a", "a much longer salt than eight bytes"}) {
      for (int block_size : {1, 4, 16}) {
        const std::vector<uint32_t> prompt = Prompt(70, static_cast<uint32_t>(seed % 13));
        const std::vector<int32_t> as_int(prompt.begin(), prompt.end());
        const std::vector<uint64_t> expected =
            engine::BlockHashes(engine::RootBlockHash(seed, salt), as_int, block_size);
        EXPECT_EQ(PromptBlockHashes(prompt, seed, salt, block_size), expected)
            << "seed " << seed << " salt \"" << salt << "\" block_size " << block_size;
        EXPECT_EQ(expected.size(), static_cast<size_t>(70 / block_size));
      }
    }
  }
}

TEST(PromptBlockHashesTest, SeedSaltAndContentChangeTheChain) {
  const std::vector<uint32_t> prompt = Prompt(32, 3);
  const std::vector<uint64_t> base = PromptBlockHashes(prompt, 1, "", 8);
  ASSERT_EQ(base.size(), 4u);
  EXPECT_NE(PromptBlockHashes(prompt, 2, "", 8)[0], base[0]);
  EXPECT_NE(PromptBlockHashes(prompt, 1, "x", 8)[0], base[0]);
  // Changing a token of block 2 keeps blocks 0-1 and changes 2-3 (the chain).
  std::vector<uint32_t> changed = prompt;
  changed[17] += 1;
  const std::vector<uint64_t> other = PromptBlockHashes(changed, 1, "", 8);
  EXPECT_EQ(other[0], base[0]);
  EXPECT_EQ(other[1], base[1]);
  EXPECT_NE(other[2], base[2]);
  EXPECT_NE(other[3], base[3]);
  // Partial blocks have no hash; a bad block size gives none.
  EXPECT_EQ(PromptBlockHashes(Prompt(7, 0), 1, "", 8).size(), 0u);
  EXPECT_TRUE(PromptBlockHashes(prompt, 1, "", 0).empty());
}

// Token ids at and above 2^31 keep their bit pattern, as the engine's int32 ids would.
TEST(PromptBlockHashesTest, LargeIdsHashAsTheirBitPattern) {
  const std::vector<uint32_t> prompt = {0x80000000u, 0xffffffffu, 5, 6};
  const std::vector<int32_t> as_int = {static_cast<int32_t>(0x80000000u), -1, 5, 6};
  EXPECT_EQ(PromptBlockHashes(prompt, 9, "s", 2),
            engine::BlockHashes(engine::RootBlockHash(9, "s"), as_int, 2));
}

// With images: exactly the engine's image-aware chain (llm_engine_vision_test checks that chain
// against a real engine's KV events).
TEST(PromptBlockHashesTest, ImagesHashAsTheEngineHashesThem) {
  const std::vector<uint32_t> prompt = Prompt(40, 5);
  const std::vector<int32_t> as_int(prompt.begin(), prompt.end());
  const std::vector<engine::ImageSpan> images = {{std::string(32, 'a'), 6, 10},
                                                 {std::string(32, 'b'), 20, 3}};
  const std::vector<uint64_t> with = PromptBlockHashes(prompt, 7, "s", 8, images);
  EXPECT_EQ(with, engine::PromptBlockHashes(engine::RootBlockHash(7, "s"), as_int, images, 8));
  const std::vector<uint64_t> without = PromptBlockHashes(prompt, 7, "s", 8);
  ASSERT_EQ(with.size(), 5u);
  EXPECT_NE(with[0], without[0]);  // the first image starts in block 0
  EXPECT_NE(PromptBlockHashes(prompt, 7, "s", 8, {{std::string(32, 'c'), 6, 10}})[0], with[0]);
}

// The hashes a real engine publishes (its KV events) for a prompt, in order.
TEST(PromptBlockHashesTest, EqualsWhatARealEnginePublishes) {
  constexpr uint64_t kSeed = 1234;
  constexpr int kBlockSize = 4;
  absl::StatusOr<std::unique_ptr<engine::Model>> model =
      engine::Model::Load("engine/testdata/models/llama", engine::ModelOptions{1});
  ASSERT_TRUE(model.ok()) << model.status();
  engine::EngineOptions options;
  options.num_blocks = 64;
  options.block_size = kBlockSize;
  options.hash_seed = kSeed;
  absl::StatusOr<std::unique_ptr<engine::LlmEngine>> eng =
      engine::LlmEngine::Create(model->get(), options);
  ASSERT_TRUE(eng.ok()) << eng.status();
  ASSERT_TRUE((*eng)->Start().ok());

  const std::vector<uint32_t> prompt = Prompt(23, 11);  // 5 full blocks + 3 tokens
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  engine::EngineRequest request;
  request.request_id = "r";
  request.prompt.assign(prompt.begin(), prompt.end());
  request.cache_salt = "tenant-b";
  request.sampling.max_tokens = 1;
  request.sampling.temperature = 0;
  ASSERT_TRUE((*eng)
                  ->Submit(request,
                           [&](const engine::EngineOutput& out) {
                             if (!out.finished) return;
                             std::lock_guard<std::mutex> lock(mu);
                             finished = true;
                             cv.notify_all();
                           })
                  .ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished; }));
  }
  // The engine moves a step's events to its queue after the step's outputs went out.
  const std::vector<uint64_t> mine = PromptBlockHashes(prompt, kSeed, "tenant-b", kBlockSize);
  std::vector<uint64_t> stored;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stored.size() < mine.size() && std::chrono::steady_clock::now() < give_up) {
    for (const engine::KvEvent& e : (*eng)->DrainKvEvents()) {
      if (e.kind == engine::KvEvent::Kind::kStored) stored.push_back(e.block_hash);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  (*eng)->Stop();
  ASSERT_EQ(mine.size(), 5u);
  ASSERT_GE(stored.size(), mine.size());
  EXPECT_EQ(std::vector<uint64_t>(stored.begin(), stored.begin() + mine.size()), mine);
  // Another salt or seed would not match what the engine holds.
  EXPECT_NE(PromptBlockHashes(prompt, kSeed, "", kBlockSize)[0], stored[0]);
  EXPECT_NE(PromptBlockHashes(prompt, kSeed + 1, "tenant-b", kBlockSize)[0], stored[0]);
}

}  // namespace
}  // namespace deepinfer::router
