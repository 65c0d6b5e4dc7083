#include "engine/chat_template/internal/lexer.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::engine::jinja {
namespace {

// Concatenated text tokens: what the template prints around its tags.
std::string Texts(absl::string_view src) {
  auto toks = Tokenize(src);
  EXPECT_TRUE(toks.ok()) << toks.status();
  std::string out;
  for (const Token& t : *toks) {
    if (t.type == TokenType::kText) out += "[" + t.text + "]";
  }
  return out;
}

TEST(LexerTest, TrimAndLstripBlocks) {
  EXPECT_EQ(Texts("a\n  {% if x %}\n  b\n  {% endif %}\nc"), "[a\n][  b\n][c]");
  EXPECT_EQ(Texts("  {{ x }}\n"), "[  ]");  // Variables are not lstripped; last \n dropped.
  EXPECT_EQ(Texts("x  {% if %}"), "[x  ]");  // Only at the start of a line.
  EXPECT_EQ(Texts("a {%- if %} b"), "[a][ b]");
  EXPECT_EQ(Texts("{% if -%}  \n b"), "[b]");
  EXPECT_EQ(Texts("  {%+ if %}"), "[  ]");
  EXPECT_EQ(Texts("{% if +%}\nb"), "[\nb]");
  EXPECT_EQ(Texts("a{# c #}\nb"), "[a][b]");
  EXPECT_EQ(Texts("a\r\nb\rc\n"), "[a\nb\nc]");
}

TEST(LexerTest, RawBlocks) {
  EXPECT_EQ(Texts("{% raw %}{{ x }}{% endraw %}"), "[{{ x }}]");
  EXPECT_EQ(Texts("{% raw %}\na\n  {% endraw %}\nb"), "[\na\n][b]");
}

TEST(LexerTest, TagTokens) {
  auto toks = Tokenize("{{ a.b[0] | f('s\\n', 1.5e3, 2_000) ~ x.0 }}");
  ASSERT_TRUE(toks.ok()) << toks.status();
  std::vector<std::string> got;
  for (const Token& t : *toks) got.push_back(t.text);
  const std::vector<std::string> want = {"", "a", ".", "b", "[", "0", "]", "|", "f", "(", "s\n",
                                         ",", "1.5e3", ",", "2000", ")", "~", "x", ".", "0", ")",
                                         ""};
  ASSERT_GE(got.size(), 20u);
  EXPECT_EQ((*toks)[10].type, TokenType::kString);
  EXPECT_EQ((*toks)[12].type, TokenType::kFloat);
  EXPECT_DOUBLE_EQ((*toks)[12].float_value, 1500.0);
  EXPECT_EQ((*toks)[14].int_value, 2000);
  EXPECT_EQ((*toks)[19].type, TokenType::kInt);  // x.0 is item access, not a float.
}

TEST(LexerTest, StringEscapes) {
  auto toks = Tokenize("{{ 'a\\x41\\u00e9\\U0001F600\\101\\q\\\\' }}");
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ((*toks)[1].text, "aAé😀A\\q\\");
}

TEST(LexerTest, DictLiteralBracesDoNotCloseTags) {
  auto toks = Tokenize("{{ {'a': {'b': 1}} }}");
  ASSERT_TRUE(toks.ok()) << toks.status();
  EXPECT_EQ(toks->back().type, TokenType::kEof);
  EXPECT_EQ((*toks)[toks->size() - 2].type, TokenType::kVarEnd);
}

TEST(LexerTest, LineNumbers) {
  auto toks = Tokenize("a\nb\n{{ x\n + y }}");
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ((*toks)[1].line, 3);
  EXPECT_EQ((*toks)[3].line, 4);  // '+'
}

TEST(LexerTest, Errors) {
  EXPECT_FALSE(Tokenize("{{ x").ok());
  EXPECT_FALSE(Tokenize("{% if").ok());
  EXPECT_FALSE(Tokenize("{# x").ok());
  EXPECT_FALSE(Tokenize("{{ 'x }}").ok());
  EXPECT_FALSE(Tokenize("{{ x ) }}").ok());
  EXPECT_FALSE(Tokenize("{{ x @ y }}").ok());
  EXPECT_FALSE(Tokenize("{% raw %}x").ok());
  EXPECT_FALSE(Tokenize("{{ '\\x4' }}").ok());
  EXPECT_FALSE(Tokenize("{{ 99999999999999999999 }}").ok());
  auto st = Tokenize("a\n\n{{ x @ y }}");
  EXPECT_EQ(st.status().message(), "chat template line 3: unexpected character '@'");
}

}  // namespace
}  // namespace deepinfer::engine::jinja
