#include "engine/model_assets.h"

#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
namespace {

TEST(ModelAssetsTest, LoadsLlamaFixture) {
  auto a = ModelAssets::Load("engine/testdata/models/llama");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->config().vocab_size, 768);
  EXPECT_EQ((*a)->architecture(), "LlamaForCausalLM");
  ASSERT_NE((*a)->chat_template(), nullptr);
  ASSERT_FALSE((*a)->eos_token_ids().empty());
  EXPECT_EQ((*a)->eos_token_ids()[0], 766);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", "hello"}});
  auto with = (*a)->RenderAndTokenize(messages, true);
  auto without = (*a)->RenderAndTokenize(messages, false);
  ASSERT_TRUE(with.ok()) << with.status();
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_GT(with->size(), without->size());  // the assistant header
}

// A LLaVA-style directory: the language model's config, the tokenizer with its added "<image>"
// token, and eos ids that agree between config, generation_config and tokenizer.
TEST(ModelAssetsTest, LoadsLlavaFixture) {
  auto a = ModelAssets::Load("engine/testdata/vision/llava");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->architecture(), "LlavaForConditionalGeneration");
  EXPECT_EQ((*a)->config().vocab_size, 769);
  EXPECT_EQ((*a)->config().image_token_id, 768);
  EXPECT_EQ((*a)->eos_token_ids(), (std::vector<int32_t>{763}));
  EXPECT_EQ((*a)->generation_config().value("eos_token_id", -1), 763);
  ASSERT_NE((*a)->chat_template(), nullptr);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "user"}, {"content", "<image>\nWhat is in this picture?"}});
  auto ids = (*a)->RenderAndTokenize(messages, true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // The reference prompt before LlavaProcessor expands the placeholder to 16 tokens.
  std::ifstream in("engine/testdata/vision/llava/reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  std::vector<int32_t> expected;
  bool in_run = false;
  for (int32_t id : ref["prompts"][0]["input_ids"].get<std::vector<int32_t>>()) {
    if (id == 768 && in_run) continue;
    in_run = id == 768;
    expected.push_back(id);
  }
  EXPECT_EQ(*ids, expected);
}

TEST(ModelAssetsTest, MissingDirectoryIsNotFound) {
  auto a = ModelAssets::Load("engine/testdata/models/does_not_exist");
  EXPECT_FALSE(a.ok());
}

}  // namespace
}  // namespace deepinfer::engine
