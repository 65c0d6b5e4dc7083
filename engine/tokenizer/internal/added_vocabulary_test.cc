#include "engine/tokenizer/internal/added_vocabulary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace deepinfer::tokenizer::internal {
namespace {

using ::testing::ElementsAre;

class AddedVocabularyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = BpeModel::FromJson(
        Json::parse(R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "<|end|>": 2}, "merges": []})"));
    ASSERT_TRUE(m.ok());
    model_ = std::move(*m);
  }

  std::unique_ptr<AddedVocabulary> Make(const std::string& tokens_json,
                                        const Normalizer* normalizer = nullptr) {
    auto tokens = ParseAddedTokens(Json::parse(tokens_json));
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    auto v = AddedVocabulary::Create(*tokens, *model_, normalizer);
    EXPECT_TRUE(v.ok()) << v.status();
    return std::move(*v);
  }

  // Segments rendered as "text" or "#id[text]".
  std::vector<std::string> Split(const AddedVocabulary& v, const std::string& text,
                                 bool normalized = false) {
    std::vector<AddedVocabulary::Segment> segs;
    EXPECT_TRUE(v.Split(text, normalized, &segs).ok());
    std::vector<std::string> out;
    for (const auto& s : segs) {
      const std::string piece = text.substr(s.begin, s.end - s.begin);
      out.push_back(s.id < 0 ? piece : "#" + std::to_string(s.id) + "[" + piece + "]");
    }
    return out;
  }

  std::unique_ptr<BpeModel> model_;
};

TEST_F(AddedVocabularyTest, IdsFollowTokenizersAssignment) {
  auto v = Make(R"([
    {"id": 2, "content": "<|end|>", "special": true, "normalized": false},
    {"id": 3, "content": "<|x|>", "special": true, "normalized": false},
    {"id": 4, "content": "<|xy|>", "special": false, "normalized": false}])");
  EXPECT_EQ(v->TokenToId("<|end|>"), 2);  // already in the model vocab
  EXPECT_EQ(v->TokenToId("<|x|>"), 3);    // model vocab size onwards
  EXPECT_EQ(v->TokenToId("<|xy|>"), 4);
  EXPECT_TRUE(v->IsSpecialContent("<|x|>"));
  EXPECT_FALSE(v->IsSpecialContent("<|xy|>"));
}

TEST_F(AddedVocabularyTest, LeftmostLongestMatching) {
  auto v = Make(R"([
    {"id": 3, "content": "<|x|>", "special": true, "normalized": false},
    {"id": 4, "content": "<|x|>y", "special": true, "normalized": false}])");
  EXPECT_THAT(Split(*v, "a<|x|>y<|x|>b<|x"), ElementsAre("a", "#4[<|x|>y]", "#3[<|x|>]", "b<|x"));
  EXPECT_THAT(Split(*v, "plain"), ElementsAre("plain"));
  EXPECT_THAT(Split(*v, "plain", /*normalized=*/true), ElementsAre("plain"));
}

TEST_F(AddedVocabularyTest, StripAndSingleWordOptions) {
  auto v = Make(R"([
    {"id": 3, "content": "<t>", "lstrip": true, "rstrip": true, "normalized": false},
    {"id": 4, "content": "sep", "single_word": true, "normalized": false}])");
  EXPECT_THAT(Split(*v, "a \t<t>\n b"), ElementsAre("a", "#3[ \t<t>\n ]", "b"));
  EXPECT_THAT(Split(*v, "a sep b"), ElementsAre("a ", "#4[sep]", " b"));
  EXPECT_THAT(Split(*v, "asep b"), ElementsAre("asep b"));
  EXPECT_THAT(Split(*v, "a sepb"), ElementsAre("a sepb"));
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
