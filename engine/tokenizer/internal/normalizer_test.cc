#include "engine/tokenizer/internal/normalizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace deepinfer::tokenizer::internal {
namespace {

std::string Normalized(const char* json, std::string text) {
  auto n = ParseNormalizer(Json::parse(json));
  EXPECT_TRUE(n.ok()) << n.status();
  if (!n.ok()) return "";
  EXPECT_TRUE((*n)->Normalize(&text).ok());
  return text;
}

TEST(NormalizerTest, MistralLegacySequence) {
  const char* json = R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})";
  EXPECT_EQ(Normalized(json, "Hello  world"), "▁Hello▁▁world");
  EXPECT_EQ(Normalized(json, ""), "");  // Prepend leaves empty text alone
}

TEST(NormalizerTest, NfcStripByteLevelAndRegexReplace) {
  EXPECT_EQ(Normalized(R"({"type": "NFC"})", "cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(Normalized(R"({"type": "Strip", "strip_left": true, "strip_right": true})",
                       "\u3000 x y \t\n"),
            "x y");
  EXPECT_EQ(Normalized(R"({"type": "Strip", "strip_left": false, "strip_right": true})", "  x  "),
            "  x");
  EXPECT_EQ(Normalized(R"({"type": "ByteLevel"})", "a b"), "a\u0120b");
  EXPECT_EQ(Normalized(R"({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})",
                       "a \t\n b"),
            "a b");
}

TEST(NormalizerTest, UnsupportedTypesAreNamed) {
  auto n = ParseNormalizer(Json::parse(R"({"type": "NFKC"})"));
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(n.status().message(), ::testing::HasSubstr("normalizer type \"NFKC\""));
  EXPECT_FALSE(ParseNormalizer(Json::parse(R"({"type": "Prepend"})")).ok());
  EXPECT_FALSE(ParseNormalizer(Json::parse(R"({"type": 3})")).ok());
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
