#include "engine/tokenizer/internal/decoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace deepinfer::tokenizer::internal {
namespace {

using ::testing::ElementsAre;

// Decodes `tokens` and returns the text emitted after each token, then after Finish().
std::vector<std::string> Stream(const Decoder& d, const std::vector<std::string>& tokens) {
  DecodeStream stream(d);
  std::vector<std::string> out;
  for (const std::string& t : tokens) {
    std::string chunk;
    EXPECT_TRUE(stream.PushToken(t, &chunk).ok());
    out.push_back(chunk);
  }
  std::string rest;
  EXPECT_TRUE(stream.Finish(&rest).ok());
  out.push_back(rest);
  return out;
}

std::unique_ptr<Decoder> Parse(const char* json) {
  auto d = ParseDecoder(Json::parse(json));
  EXPECT_TRUE(d.ok()) << d.status();
  return std::move(*d);
}

TEST(DecoderTest, ByteLevelHoldsIncompleteCharacters) {
  auto d = Parse(R"({"type": "ByteLevel"})");
  // "é" is the bytes C3 A9, spelled "Ã" and "©" in the byte-level alphabet.
  EXPECT_THAT(Stream(*d, {"\u0120caf", "\u00c3", "\u00a9", "!"}),
              ElementsAre(" caf", "", "\u00e9", "!", ""));
  // An incomplete sequence at the end becomes one U+FFFD; a token outside the alphabet is
  // passed through as its own bytes.
  EXPECT_THAT(Stream(*d, {"a", "\u00c3"}), ElementsAre("a", "", "\ufffd"));
  EXPECT_THAT(Stream(*d, {"<|end|>", "\u4f60"}), ElementsAre("<|end|>", "\u4f60", ""));
}

TEST(DecoderTest, MistralSequence) {
  auto d = Parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  EXPECT_THAT(Stream(*d, {"▁Hello", "▁", "<0xE4>", "<0xBD>", "<0xA0>", "▁x"}),
              ElementsAre("Hello", " ", "", "", "", "\u4f60 x", ""));
  // Invalid byte runs become one U+FFFD per byte.
  EXPECT_THAT(Stream(*d, {"a", "<0xE4>", "<0x41>"}), ElementsAre("a", "", "", "\ufffd\ufffd"));
}

TEST(DecoderTest, StripHoldsBackTrailingCharacters) {
  auto d = Parse(R"({"type": "Sequence", "decoders": [{"type": "Fuse"},
      {"type": "Strip", "content": "x", "start": 2, "stop": 2}]})");
  EXPECT_THAT(Stream(*d, {"xxxa", "xx", "x", "bxx"}), ElementsAre("xa", "", "x", "xxb", ""));
}

TEST(DecoderTest, MetaspaceDropsReplacementInFirstTokenOnly) {
  auto d = Parse(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"})");
  EXPECT_THAT(Stream(*d, {"▁Hi▁", "▁there"}), ElementsAre("Hi", " there", ""));
  auto never = Parse(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"})");
  EXPECT_THAT(Stream(*never, {"▁Hi"}), ElementsAre(" Hi", ""));
}

TEST(DecoderTest, NoDecoderJoinsWithSpaces) {
  auto d = NewSpaceJoinDecoder();
  EXPECT_THAT(Stream(*d, {"a", "b", "c"}), ElementsAre("a", " b", " c", ""));
}

TEST(DecoderTest, UnsupportedTypesAreNamed) {
  auto d = ParseDecoder(Json::parse(R"({"type": "CTC"})"));
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), ::testing::HasSubstr("decoder type \"CTC\""));
  EXPECT_FALSE(ParseDecoder(Json::parse(R"({"type": "Strip", "content": "ab"})")).ok());
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
