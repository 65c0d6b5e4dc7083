#include "engine/tokenizer/incremental_detokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace deepinfer::tokenizer {
namespace {

std::string FixtureDir(const std::string& name) {
  if (name.rfind("own_", 0) == 0) return "engine/tokenizer/testdata/" + name.substr(4);
  return "engine/testdata/tokenizers/" + name;
}

// True if `s` is valid UTF-8 (every chunk the detokenizer returns must be).
bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

class DetokenizerFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto t = Tokenizer::FromDirectory(FixtureDir(GetParam()));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t);
    std::ifstream in(FixtureDir(GetParam()) + "/cases.json");
    std::stringstream ss;
    ss << in.rdbuf();
    cases_ = nlohmann::json::parse(ss.str());
  }

  // Streams `ids` and checks every chunk; returns the concatenation.
  std::string StreamAll(const std::vector<int32_t>& ids, bool skip_special) {
    IncrementalDetokenizer detok(*tokenizer_, skip_special);
    std::string text;
    for (int32_t id : ids) {
      auto chunk = detok.Push(id);
      EXPECT_TRUE(chunk.ok()) << chunk.status();
      if (!chunk.ok()) return text;
      EXPECT_TRUE(IsValidUtf8(*chunk)) << "partial UTF-8 emitted after id " << id;
      // Text once emitted is final: it must be a prefix of the full decode.
      text += *chunk;
    }
    auto rest = detok.Flush();
    EXPECT_TRUE(rest.ok()) << rest.status();
    EXPECT_TRUE(IsValidUtf8(*rest));
    text += *rest;
    EXPECT_EQ(detok.num_tokens(), static_cast<int64_t>(ids.size()));
    return text;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  nlohmann::json cases_;
};

TEST_P(DetokenizerFixtureTest, StreamEqualsFullDecodeForEveryCase) {
  for (const auto& c : cases_["cases"]) {
    for (const char* key : {"ids", "ids_with_special"}) {
      const auto ids = c[key].get<std::vector<int32_t>>();
      for (bool skip : {false, true}) {
        auto full = tokenizer_->Decode(ids, skip);
        ASSERT_TRUE(full.ok());
        EXPECT_EQ(StreamAll(ids, skip), *full) << "text: " << c["text"].get<std::string>();
      }
    }
    EXPECT_EQ(StreamAll(c["ids"].get<std::vector<int32_t>>(), false),
              c["decoded"].get<std::string>());
  }
}

TEST_P(DetokenizerFixtureTest, EmittedTextIsAlwaysAPrefixOfTheFinalText) {
  for (const auto& c : cases_["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const std::string expected = c["decoded"].get<std::string>();
    IncrementalDetokenizer detok(*tokenizer_, false);
    std::string text;
    for (int32_t id : ids) {
      text += *detok.Push(id);
      ASSERT_EQ(expected.compare(0, text.size(), text), 0)
          << "emitted \"" << text << "\" is not a prefix of \"" << expected << "\"";
    }
  }
}

TEST_P(DetokenizerFixtureTest, PrefixStreamsMatchReferenceDecodeOfPrefixes) {
  if (!cases_.contains("partial_decode_cases")) GTEST_SKIP();
  for (const auto& c : cases_["partial_decode_cases"]) {
    EXPECT_EQ(StreamAll(c["ids"].get<std::vector<int32_t>>(), false),
              c["decoded"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DetokenizerFixtureTest,
                         ::testing::Values("gpt2", "llama3", "qwen2", "own_mistral",
                                           "own_metaspace"));

TEST(IncrementalDetokenizerTest, HoldsBackSplitCharacterAndFlushesReplacement) {
  auto t = Tokenizer::FromDirectory("engine/testdata/tokenizers/qwen2");
  ASSERT_TRUE(t.ok()) << t.status();
  // Byte-level tokens for the two bytes of "é" (C3 A9) and one lone lead byte (E4).
  const auto c3 = (*t)->TokenToId("\u00c3");
  const auto a9 = (*t)->TokenToId("\u00a9");
  const auto e4 = (*t)->TokenToId("\u00e4");
  const auto a = (*t)->TokenToId("a");
  ASSERT_TRUE(c3 && a9 && e4 && a);
  IncrementalDetokenizer detok(**t, false);
  EXPECT_EQ(*detok.Push(*a), "a");
  EXPECT_EQ(*detok.Push(*c3), "");
  EXPECT_EQ(*detok.Push(*a9), "\u00e9");
  EXPECT_EQ(*detok.Push(*e4), "");
  EXPECT_EQ(*detok.Flush(), "\ufffd");
  EXPECT_EQ(detok.Push(*a).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(detok.Flush().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*(*t)->Decode({*a, *c3, *a9, *e4}, false), "a\u00e9\ufffd");
}

TEST(IncrementalDetokenizerTest, UnknownIdLeavesStreamUsable) {
  auto t = Tokenizer::FromDirectory("engine/testdata/tokenizers/gpt2");
  ASSERT_TRUE(t.ok());
  IncrementalDetokenizer detok(**t, false);
  auto bad = detok.Push((*t)->vocab_size() + 3);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("id "));
  EXPECT_EQ(*detok.Push(*(*t)->TokenToId("a")), "a");
  EXPECT_EQ(detok.num_tokens(), 1);
}

}  // namespace
}  // namespace deepinfer::tokenizer
