#include "engine/tokenizer/internal/utf8.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace deepinfer::tokenizer::internal {
namespace {

using ::testing::HasSubstr;

TEST(Utf8Test, ValidateAcceptsWellFormedText) {
  EXPECT_TRUE(ValidateUtf8("").ok());
  EXPECT_TRUE(ValidateUtf8("plain ascii text that is longer than eight bytes").ok());
  EXPECT_TRUE(ValidateUtf8("caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80").ok());
  EXPECT_TRUE(ValidateUtf8("\xF4\x8F\xBF\xBF").ok());  // U+10FFFF
}

TEST(Utf8Test, ValidateReportsOffsetOfFirstBadSequence) {
  struct Case {
    std::string text;
    std::string offset;
  };
  for (const Case& c : {Case{"abcdefghij\x80", "offset 10"}, Case{"\xC0\x80", "offset 0"},
                        Case{"ab\xED\xA0\x80", "offset 2"}, Case{"abc\xF4\x90\x80\x80", "offset 3"},
                        Case{"x\xE4\xBD", "offset 1"}, Case{"\xFF", "offset 0"}}) {
    absl::Status s = ValidateUtf8(c.text);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.offset));
  }
}

TEST(Utf8Test, LossyMatchesRustFromUtf8Lossy) {
  // Expected values are what Rust's String::from_utf8_lossy returns (maximal subparts).
  EXPECT_EQ(Utf8Lossy("a\xE4\xBD"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Utf8Lossy("\xE4\xBD"), "\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(Utf8Test, StreamDecoderHoldsBackIncompleteSequences) {
  Utf8StreamDecoder d;
  std::string out;
  d.Append("ok \xF0\x9F", &out);
  EXPECT_EQ(out, "ok ");
  EXPECT_TRUE(d.has_pending());
  d.Append("\x98", &out);
  EXPECT_EQ(out, "ok ");
  d.Append("\x80!", &out);
  EXPECT_EQ(out, "ok \xF0\x9F\x98\x80!");
  d.Append("\xE4\xBD", &out);
  d.Append("x", &out);  // breaks the sequence: one U+FFFD, then x
  EXPECT_EQ(out, "ok \xF0\x9F\x98\x80!\xEF\xBF\xBDx");
  d.Append("\xC3", &out);
  d.Finish(&out);
  EXPECT_EQ(out, "ok \xF0\x9F\x98\x80!\xEF\xBF\xBDx\xEF\xBF\xBD");
  EXPECT_FALSE(d.has_pending());
}

TEST(Utf8Test, ByteLevelAlphabetIsTheGpt2One) {
  const auto& table = ByteToUnicodeUtf8();
  EXPECT_EQ(table[' '], "\xC4\xA0");   // Ġ
  EXPECT_EQ(table['\n'], "\xC4\x8A");  // Ċ
  EXPECT_EQ(table['a'], "a");
  EXPECT_EQ(table[0xAD], "\xC5\x83");  // the one byte inside 0xA1..0xFF that is remapped
  for (int b = 0; b < 256; ++b) {
    size_t pos = 0;
    EXPECT_EQ(UnicodeToByte(NextCodePoint(table[b], pos)), b);
  }
  EXPECT_EQ(UnicodeToByte(0x4F60), -1);
}

TEST(Utf8Test, WhitespaceIsUnicodeWhiteSpace) {
  for (char32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00A0', U'\u2003',
                     U'\u3000', U'\u2029'}) {
    EXPECT_TRUE(IsUnicodeWhitespace(c)) << static_cast<int>(c);
  }
  for (char32_t c : {U'a', U'\u200B', U'\u180E', U'_', U'\0'}) {
    EXPECT_FALSE(IsUnicodeWhitespace(c)) << static_cast<int>(c);
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
