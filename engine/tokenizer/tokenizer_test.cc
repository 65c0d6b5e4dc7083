#include "engine/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::HasSubstr;

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fixture directories: tokenizer.json, tokenizer_config.json and cases.json generated with
// Hugging Face tokenizers/transformers (engine/testdata from tools/fixtures, and our own
// Mistral-style ones from engine/tokenizer/testdata/make_testdata.py).
std::string FixtureDir(const std::string& name) {
  if (name.rfind("own_", 0) == 0) return "engine/tokenizer/testdata/" + name.substr(4);
  return "engine/testdata/tokenizers/" + name;
}

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto t = Tokenizer::FromDirectory(FixtureDir(GetParam()));
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = std::move(*t);
    cases_ = nlohmann::json::parse(ReadFileOrDie(FixtureDir(GetParam()) + "/cases.json"));
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  nlohmann::json cases_;
};

TEST_P(FixtureTest, EncodeMatchesReference) {
  ASSERT_GT(cases_["cases"].size(), 10u);
  for (const auto& c : cases_["cases"]) {
    const std::string text = c["text"].get<std::string>();
    auto ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    auto with_special = tokenizer_->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(with_special.ok()) << with_special.status();
    EXPECT_EQ(*with_special, c["ids_with_special"].get<std::vector<int32_t>>()) << "text: " << text;
  }
}

TEST_P(FixtureTest, DecodeMatchesReference) {
  for (const auto& c : cases_["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    auto decoded = tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
    auto skipped = tokenizer_->Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>());
  }
}

TEST_P(FixtureTest, DecodeOfPrefixesMatchesReference) {
  if (!cases_.contains("partial_decode_cases")) GTEST_SKIP() << "no partial decode cases";
  ASSERT_GT(cases_["partial_decode_cases"].size(), 0u);
  for (const auto& c : cases_["partial_decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    auto decoded = tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
  }
}

TEST_P(FixtureTest, IdAndTokenLookupsRoundTrip) {
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    auto token = tokenizer_->IdToToken(id);
    if (!token.has_value()) continue;
    EXPECT_EQ(tokenizer_->TokenToId(*token), id) << *token;
  }
  EXPECT_FALSE(tokenizer_->IdToToken(tokenizer_->vocab_size()).has_value());
  EXPECT_FALSE(tokenizer_->IdToToken(-1).has_value());
}

TEST_P(FixtureTest, InvalidUtf8IsRejectedWithOffset) {
  auto ids = tokenizer_->Encode(std::string("abc\xC3(def", 8), false);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr("byte offset 3"));
  auto truncated = tokenizer_->Encode("ok \xE4\xBD", false);
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), HasSubstr("byte offset 3"));
  EXPECT_FALSE(tokenizer_->Encode("\xED\xA0\x80", false).ok());  // surrogate
  EXPECT_FALSE(tokenizer_->Encode("\xC0\xAF", false).ok());      // overlong
}

TEST_P(FixtureTest, UnknownIdIsRejectedByName) {
  auto text = tokenizer_->Decode({0, tokenizer_->vocab_size() + 7}, false);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(),
              HasSubstr(absl::StrCat("id ", tokenizer_->vocab_size() + 7)));
  EXPECT_FALSE(tokenizer_->Decode({-1}, false).ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         ::testing::Values("gpt2", "llama3", "qwen2", "own_mistral",
                                           "own_metaspace"));

TEST(TokenizerTest, SpecialTokensInTextAndConfig) {
  auto t = Tokenizer::FromDirectory("engine/testdata/tokenizers/llama3");
  ASSERT_TRUE(t.ok()) << t.status();
  const Tokenizer& tok = **t;
  const auto bot = tok.TokenToId("<|begin_of_text|>");
  const auto eot = tok.TokenToId("<|eot_id|>");
  ASSERT_TRUE(bot.has_value());
  ASSERT_TRUE(eot.has_value());
  EXPECT_EQ(tok.bos_id(), bot);
  EXPECT_EQ(tok.eos_id(), eot);
  EXPECT_TRUE(tok.IsSpecial(*bot));
  EXPECT_FALSE(tok.IsSpecial(0));
  auto ids = tok.Encode("a<|eot_id|>b", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 4u);
  EXPECT_EQ((*ids)[0], *bot);
  EXPECT_EQ((*ids)[2], *eot);
  auto kept = tok.Decode(*ids, false);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "<|begin_of_text|>a<|eot_id|>b");
  auto skipped = tok.Decode(*ids, true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "ab");
}

TEST(TokenizerTest, LoadErrorsNameTheProblem) {
  const std::string json = ReadFileOrDie("engine/testdata/tokenizers/gpt2/tokenizer.json");
  auto doc = nlohmann::json::parse(json);

  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json copy = doc;
    copy[key] = std::move(value);
    return Tokenizer::FromJson(copy.dump());
  };
  auto bad_pre = with("pre_tokenizer", {{"type", "Whitespace"}});
  ASSERT_FALSE(bad_pre.ok());
  EXPECT_EQ(bad_pre.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_pre.status().message(),
              HasSubstr("pre_tokenizer type \"Whitespace\" is not supported"));
  auto bad_norm = with("normalizer", {{"type", "Lowercase"}});
  EXPECT_THAT(bad_norm.status().message(),
              HasSubstr("normalizer type \"Lowercase\" is not supported"));
  auto bad_dec = with("decoder", {{"type", "WordPiece"}});
  EXPECT_THAT(bad_dec.status().message(), HasSubstr("decoder type \"WordPiece\""));
  auto bad_model = with("model", {{"type", "Unigram"}, {"vocab", nlohmann::json::array()}});
  EXPECT_THAT(bad_model.status().message(), HasSubstr("model type \"Unigram\""));
  auto bad_regex = with("pre_tokenizer", {{"type", "Split"},
                                          {"pattern", {{"Regex", "(unclosed"}}},
                                          {"behavior", "Isolated"},
                                          {"invert", false}});
  EXPECT_THAT(bad_regex.status().message(), HasSubstr("(unclosed"));
  auto truncation = with("truncation", {{"max_length", 8}});
  EXPECT_THAT(truncation.status().message(), HasSubstr("truncation"));

  nlohmann::json bad_merge = doc;
  bad_merge["model"]["merges"].push_back("nosuchtoken1 nosuchtoken2");
  auto merge = Tokenizer::FromJson(bad_merge.dump());
  EXPECT_THAT(merge.status().message(), HasSubstr("nosuchtoken1"));

  EXPECT_EQ(Tokenizer::FromJson("{\"model\": ").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromJson("[]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenizerTest, MergesInBothFormatsGiveTheSameTokenizer) {
  auto doc =
      nlohmann::json::parse(ReadFileOrDie("engine/testdata/tokenizers/llama3/tokenizer.json"));
  ASSERT_TRUE(doc["model"]["merges"][0].is_array());
  nlohmann::json legacy = doc;
  legacy["model"]["merges"] = nlohmann::json::array();
  for (const auto& m : doc["model"]["merges"]) {
    legacy["model"]["merges"].push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  auto a = Tokenizer::FromJson(doc.dump());
  auto b = Tokenizer::FromJson(legacy.dump());
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string text = "def merges_in_both_formats(x):\n    return x * 2  # same ids\n";
  EXPECT_EQ(*(*a)->Encode(text, true), *(*b)->Encode(text, true));
}

// Hand-written configurations (also the JSON fuzzer's seeds) exercising components the
// fixtures do not: Replace/Strip normalizers, Digits, BertProcessing, lstrip/rstrip/single_word,
// Metaspace and Strip decoders, ids colliding with unknown characters. Expected values are what
// tokenizers 0.23.3 returns for the same files.
TEST(TokenizerTest, HandWrittenConfigsMatchTokenizers) {
  struct Case {
    const char* file;
    const char* text;
    std::vector<int32_t> ids;
    const char* decoded;
    const char* decoded_skip_special;
  };
  const Case kCases[] = {
      {"minimal.json", "Hello  world 12345", {7, 6, 3, 3, 2}, "<|endoftext|>Hellool", "Hellool"},
      {"minimal.json", "a a  aA<unk>é ", {7}, "<|endoftext|>", ""},
      {"minimal.json", "", {7}, "<|endoftext|>", ""},
      {"minimal.json",
       "Hell<|endoftext|>oÅ",
       {7, 6, 7, 3},
       "<|endoftext|>Hell<|endoftext|>o",
       "Hello"},
      {"minimal.json", " <unk>a", {7}, "<|endoftext|>", ""},
      {"metaspace.json",
       "Hello  world 12345",
       {1, 4, 0, 4, 4, 0, 4, 0, 2},
       "<s> <unk>  <unk> <unk></s>",
       "<s>    </s>"},
      {"metaspace.json",
       "a a  aA<unk>é ",
       {1, 6, 6, 4, 6, 3, 0, 2},
       "<s> a a  aA<unk></s>",
       "<s> a a  aA</s>"},
      {"metaspace.json", "", {1, 2}, "<s></s>", "<s></s>"},
      {"metaspace.json", "Hell<|endoftext|>oÅ", {1, 4, 0, 2}, "<s> <unk></s>", "<s> </s>"},
      {"metaspace.json", " <unk>a", {1, 4, 4, 0, 5, 2}, "<s>  <unk>a</s>", "<s>  a</s>"},
      {"metaspace.json", "x<unk> a", {1, 4, 0, 6, 2}, "<s> <unk> a</s>", "<s>  a</s>"},
  };
  for (const Case& c : kCases) {
    auto t = Tokenizer::FromFile(std::string("engine/tokenizer/fuzz_corpus/json/") + c.file);
    ASSERT_TRUE(t.ok()) << t.status();
    auto ids = (*t)->Encode(c.text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c.ids) << c.file << ": " << c.text;
    EXPECT_EQ(*(*t)->Decode(*ids, false), c.decoded) << c.file << ": " << c.text;
    EXPECT_EQ(*(*t)->Decode(*ids, true), c.decoded_skip_special) << c.file << ": " << c.text;
  }
}

TEST(TokenizerTest, LongWordsAndConcurrentCallers) {
  auto t = Tokenizer::FromDirectory("engine/testdata/tokenizers/llama3");
  ASSERT_TRUE(t.ok()) << t.status();
  const Tokenizer& tok = **t;
  // One 256 KB pre-token: merging must stay O(n log n), and the result must round-trip.
  std::string word;
  for (int i = 0; word.size() < (1 << 18); ++i) word += "abcdefghij"[(i * 7) % 10];
  auto ids = tok.Encode(word, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*tok.Decode(*ids, false), word);

  // Four threads encode the same texts and must agree with a single-threaded run.
  const std::vector<std::string> texts = {"def f(x):\n    return x", "Hello, world!",
                                          "\u4f60\u597d <|eot_id|> caf\u00e9", "  12345 xyz  "};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& text : texts) expected.push_back(*tok.Encode(text, true));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        const size_t k = i % texts.size();
        auto got = tok.Encode(texts[k] + std::to_string(i % 17), true);
        auto want = tok.Encode(texts[k] + std::to_string(i % 17), true);
        if (!got.ok() || *got != *want) ++mismatches;
        if (*tok.Encode(texts[k], true) != expected[k]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerTest, MixedMergeFormatsAreRejected) {
  auto t = Tokenizer::FromJson(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "abb": 3},
          "merges": ["a b", ["ab", "b"]]}})");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("merge 1"));
}

}  // namespace
}  // namespace deepinfer::tokenizer
