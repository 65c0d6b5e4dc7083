#include "engine/tokenizer/internal/pre_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace deepinfer::tokenizer::internal {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Pieces(const std::string& json, const std::string& text,
                                bool at_origin = true) {
  auto p = ParsePreTokenizer(Json::parse(json));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {};
  std::vector<PreToken> pieces = {PreToken{text, at_origin}};
  EXPECT_TRUE((*p)->PreTokenize(&pieces).ok());
  std::vector<std::string> out;
  for (const auto& piece : pieces) out.push_back(piece.text);
  return out;
}

std::string SplitJson(const std::string& behavior, bool invert) {
  return R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior +
         R"(", "invert": )" + (invert ? "true" : "false") + "}";
}

TEST(PreTokenizerTest, SplitBehaviorsMatchTokenizers) {
  // The examples of tokenizers' SplitDelimiterBehavior documentation.
  const std::string text = "the-final--countdown";
  EXPECT_THAT(Pieces(SplitJson("Removed", false), text), ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(Pieces(SplitJson("Isolated", false), text),
              ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(Pieces(SplitJson("MergedWithPrevious", false), text),
              ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(Pieces(SplitJson("MergedWithNext", false), text),
              ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(Pieces(SplitJson("Contiguous", false), text),
              ElementsAre("the", "-", "final", "--", "countdown"));
  EXPECT_THAT(Pieces(SplitJson("Removed", true), text), ElementsAre("-", "-", "-"));
}

TEST(PreTokenizerTest, ByteLevelWithAndWithoutRegex) {
  EXPECT_THAT(Pieces(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})",
                     "Hello world's  end\n"),
              ElementsAre("Hello", "\u0120world", "'s", "\u0120", "\u0120end", "\u010a"));
  EXPECT_THAT(
      Pieces(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": false})", "a b"),
      ElementsAre("\u0120a\u0120b"));
  EXPECT_THAT(
      Pieces(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})", "\u00e9"),
      ElementsAre("\u00c3\u00a9"));
}

TEST(PreTokenizerTest, DigitsAndSequence) {
  EXPECT_THAT(Pieces(R"({"type": "Digits", "individual_digits": true})", "a123b"),
              ElementsAre("a", "1", "2", "3", "b"));
  EXPECT_THAT(Pieces(R"({"type": "Digits", "individual_digits": false})", "a123b4"),
              ElementsAre("a", "123", "b", "4"));
  EXPECT_THAT(Pieces(R"({"type": "Sequence", "pretokenizers": [
                        {"type": "WhitespaceSplit"},
                        {"type": "Digits", "individual_digits": true}]})",
                     " x12  y "),
              ElementsAre("x", "1", "2", "y"));
}

TEST(PreTokenizerTest, MetaspacePrependSchemes) {
  const char* first = R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": true})";
  EXPECT_THAT(Pieces(first, "Hey friend"), ElementsAre("▁Hey", "▁friend"));
  EXPECT_THAT(Pieces(first, "Hey friend", /*at_origin=*/false), ElementsAre("Hey", "▁friend"));
  EXPECT_THAT(Pieces(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never",
                      "split": false})",
                     "a b"),
              ElementsAre("a▁b"));
}

TEST(PreTokenizerTest, UnsupportedTypesAreNamed) {
  auto p = ParsePreTokenizer(Json::parse(R"({"type": "Whitespace"})"));
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(),
              ::testing::HasSubstr("pre_tokenizer type \"Whitespace\" is not supported"));
  EXPECT_FALSE(ParsePreTokenizer(Json::parse(R"({"type": "Split", "pattern": {"Regex": "a"},
                                                 "behavior": "Sideways"})"))
                   .ok());
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
