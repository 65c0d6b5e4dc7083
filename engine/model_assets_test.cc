#include "engine/model_assets.h"

#include "gtest/gtest.h"

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

TEST(ModelAssetsTest, MissingDirectoryIsNotFound) {
  auto a = ModelAssets::Load("engine/testdata/models/does_not_exist");
  EXPECT_FALSE(a.ok());
}

}  // namespace
}  // namespace deepinfer::engine
