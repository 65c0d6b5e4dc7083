#include "engine/tokenizer/internal/regex.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace deepinfer::tokenizer::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::vector<std::string> Matches(const Regex& re, const std::string& text) {
  std::vector<std::pair<size_t, size_t>> m;
  EXPECT_TRUE(re.FindAll(text, &m).ok());
  std::vector<std::string> out;
  for (auto [b, e] : m) out.push_back(text.substr(b, e - b));
  return out;
}

constexpr char kLlama3[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(RegexTest, Llama3PatternWithLookAheadAndUnicodeClasses) {
  auto re = Regex::Create(kLlama3);
  ASSERT_TRUE(re.ok()) << re.status();
  EXPECT_THAT(
      Matches(**re, "I'M here  12345 caf\u00e9!\n\n  x"),
      ElementsAre("I", "'M", " here", " ", " ", "123", "45", " caf\u00e9", "!\n\n", " ", " x"));
  EXPECT_THAT(Matches(**re, "\u4f60\u597d\uff0c\u4e16\u754c"),
              ElementsAre("\u4f60\u597d", "\uff0c\u4e16\u754c"));
}

TEST(RegexTest, LongWhitespaceRunsDoNotExhaustTheStack) {
  auto re = Regex::Create(kLlama3);
  ASSERT_TRUE(re.ok());
  const std::string text = std::string(8000000, ' ') + "x" + std::string(100000, '\n');
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll(text, &m).ok());
  EXPECT_THAT(m, ElementsAre(Pair(0, 7999999), Pair(7999999, 8000001), Pair(8000001, 8100001)));
}

TEST(RegexTest, LiteralEscapesMetacharacters) {
  auto re = Regex::CreateLiteral("a.b*(c)");
  ASSERT_TRUE(re.ok());
  EXPECT_THAT(Matches(**re, "xa.b*(c)yaXbbc"), ElementsAre("a.b*(c)"));
}

TEST(RegexTest, EmptyMatchesAdvanceByOneCodePoint) {
  auto re = Regex::Create("x*");
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll("\u00e9x", &m).ok());
  EXPECT_THAT(m, ElementsAre(Pair(0, 0), Pair(2, 3), Pair(3, 3)));
}

TEST(RegexTest, InvalidPatternNamesIt) {
  auto re = Regex::Create("([a-");
  ASSERT_FALSE(re.ok());
  EXPECT_EQ(re.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(re.status().message(), HasSubstr("([a-"));
}

TEST(RegexTest, SharedAcrossThreads) {
  auto re = Regex::Create(kLlama3);
  ASSERT_TRUE(re.ok());
  std::vector<std::thread> threads;
  std::vector<int> counts(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) counts[t] += Matches(**re, "one two three 4567").size();
    });
  }
  for (auto& th : threads) th.join();
  for (int c : counts) EXPECT_EQ(c, 200 * 6);  // one, two, three, " ", 456, 7
}

}  // namespace
}  // namespace deepinfer::tokenizer::internal
