#include "engine/tokenizer/internal/bpe_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace deepinfer::tokenizer::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<BpeModel> Make(const std::string& json) {
  auto m = BpeModel::FromJson(Json::parse(json));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Tokenize(const BpeModel& m, const std::string& word) {
  std::vector<int32_t> ids;
  EXPECT_TRUE(m.Tokenize(word, &ids).ok());
  return ids;
}

constexpr char kModel[] = R"({"type": "BPE",
  "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "cc": 6},
  "merges": ["b c", "a b", "a bc", "c c"]})";

TEST(BpeModelTest, MergesByRankThenPosition) {
  auto m = Make(kModel);
  // "abc": rank 0 "b c" first, then "a bc".
  EXPECT_THAT(Tokenize(*m, "abc"), ElementsAre(5));
  // "abab": "a b" at both positions.
  EXPECT_THAT(Tokenize(*m, "abab"), ElementsAre(3, 3));
  // "ccc": equal ranks resolve left to right.
  EXPECT_THAT(Tokenize(*m, "ccc"), ElementsAre(6, 2));
  // Unknown characters are dropped without unk_token or byte_fallback, as in tokenizers, and
  // their neighbours then merge.
  EXPECT_THAT(Tokenize(*m, "axb"), ElementsAre(3));
  // Cached results are the same.
  EXPECT_THAT(Tokenize(*m, "abc"), ElementsAre(5));
}

TEST(BpeModelTest, PairMergesFormatAndIgnoreMerges) {
  auto m = Make(R"({"type": "BPE", "ignore_merges": true,
      "vocab": {"a": 0, "b": 1, "ab": 2, "aba": 3, "ba": 4},
      "merges": [["b", "a"], ["a", "b"]]})");
  EXPECT_THAT(Tokenize(*m, "aba"), ElementsAre(3));  // whole word in vocab
  EXPECT_THAT(Tokenize(*m, "abab"), ElementsAre(0, 4, 1));
}

TEST(BpeModelTest, UnkAndByteFallback) {
  auto unk = Make(R"({"type": "BPE", "unk_token": "<unk>", "fuse_unk": true,
      "vocab": {"<unk>": 0, "a": 1}, "merges": []})");
  EXPECT_THAT(Tokenize(*unk, "a\u00e9\u00e9a"), ElementsAre(1, 0, 1));
  auto unfused = Make(R"({"type": "BPE", "unk_token": "<unk>", "fuse_unk": false,
      "vocab": {"<unk>": 0, "a": 1}, "merges": []})");
  EXPECT_THAT(Tokenize(*unfused, "a\u00e9\u00e9a"), ElementsAre(1, 0, 0, 1));
  auto bytes = Make(R"({"type": "BPE", "unk_token": "<unk>", "byte_fallback": true,
      "vocab": {"<unk>": 0, "a": 1, "<0xC3>": 2, "<0xA9>": 3}, "merges": []})");
  EXPECT_THAT(Tokenize(*bytes, "a\u00e9\u00ea"), ElementsAre(1, 2, 3, 0));
}

TEST(BpeModelTest, SubwordPrefixAndSuffix) {
  auto m = Make(R"({"type": "BPE", "continuing_subword_prefix": "##",
      "end_of_word_suffix": "</w>",
      "vocab": {"a": 0, "##b": 1, "##c</w>": 2, "a##b": 3, "ab": 4, "abc</w>": 5},
      "merges": [["a", "##b"], ["ab", "##c</w>"]]})");
  EXPECT_THAT(Tokenize(*m, "abc"), ElementsAre(5));
}

TEST(BpeModelTest, BadModelsAreRejected) {
  auto missing =
      BpeModel::FromJson(Json::parse(R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]})"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("\"b\" which is not in the vocab"));
  EXPECT_FALSE(
      BpeModel::FromJson(Json::parse(R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]})"))
          .ok());
  EXPECT_FALSE(
      BpeModel::FromJson(Json::parse(R"({"type": "BPE", "vocab": {"a": -1}, "merges": []})")).ok());
  EXPECT_FALSE(
      BpeModel::FromJson(
          Json::parse(R"({"type": "BPE", "dropout": 0.1, "vocab": {"a": 0}, "merges": []})"))
          .ok());
  EXPECT_FALSE(BpeModel::FromJson(Json::parse(R"({"type": "BPE", "vocab": {}})")).ok());
}

TEST(BpeModelTest, ConcurrentTokenizeAgrees) {
  auto m = Make(kModel);
  std::vector<std::thread> threads;
  std::vector<bool> ok(4, true);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        std::string word = std::string(1 + i % 7, 'a') + "bc" + std::string(i % 3, 'c');
        std::vector<int32_t> ids;
        ok[t] = ok[t] && m->Tokenize(word, &ids).ok() && !ids.empty();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (bool b : ok) EXPECT_TRUE(b);
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
