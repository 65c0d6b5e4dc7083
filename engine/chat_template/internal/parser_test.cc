#include "engine/chat_template/internal/parser.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace deepinfer::engine::jinja {
namespace {

const Expr& OutputExpr(const Template& t, size_t i = 0) { return *t.body[i]->expr; }

TEST(ParserTest, Precedence) {
  // a ~ b|upper: the filter binds to b only.
  auto t = Parse("{{ a ~ b|upper }}");
  ASSERT_TRUE(t.ok()) << t.status();
  const Expr& e = OutputExpr(**t);
  ASSERT_EQ(e.kind, Expr::Kind::kConcat);
  EXPECT_EQ(e.args[1]->kind, Expr::Kind::kFilter);
  // not x is defined == not (x is defined).
  t = Parse("{{ not x is defined }}");
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(OutputExpr(**t).kind, Expr::Kind::kNot);
  EXPECT_EQ(OutputExpr(**t).args[0]->kind, Expr::Kind::kTest);
  // 1 + 2 * 3.
  t = Parse("{{ 1 + 2 * 3 }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(OutputExpr(**t).name, "+");
  EXPECT_EQ(OutputExpr(**t).args[1]->name, "*");
  // -x|abs applies the filter to -x.
  t = Parse("{{ -x|abs }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(OutputExpr(**t).kind, Expr::Kind::kFilter);
}

TEST(ParserTest, Statements) {
  auto t = Parse(
      "{% for k, v in d.items() if v %}{{ k }}{% else %}none{% endfor %}"
      "{% set ns.x = 1 %}{% set a, b = 1, 2 %}{% macro m(a, b=2) %}{% endmacro %}"
      "{% if a %}{% elif b %}{% else %}{% endif %}");
  ASSERT_TRUE(t.ok()) << t.status();
  const Body& body = (*t)->body;
  ASSERT_EQ(body.size(), 5u);
  EXPECT_EQ(body[0]->kind, Node::Kind::kFor);
  EXPECT_TRUE(body[0]->unpack);
  EXPECT_NE(body[0]->filter, nullptr);
  EXPECT_EQ(body[0]->else_body.size(), 1u);
  EXPECT_EQ(body[1]->attr, "x");
  EXPECT_TRUE(body[2]->unpack);
  EXPECT_EQ(body[3]->params.size(), 2u);
  EXPECT_EQ(body[4]->conds.size(), 2u);
}

TEST(ParserTest, Slices) {
  auto t = Parse("{{ a[1:] }}{{ a[::-1] }}{{ a[:2] }}{{ a[0] }}");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(OutputExpr(**t, 0).kind, Expr::Kind::kSlice);
  EXPECT_EQ(OutputExpr(**t, 1).args[3]->kind, Expr::Kind::kNeg);
  EXPECT_EQ(OutputExpr(**t, 2).args[1], nullptr);
  EXPECT_EQ(OutputExpr(**t, 3).kind, Expr::Kind::kGetItem);
}

TEST(ParserTest, RejectsWithLine) {
  auto t = Parse("a\n{{ x|nosuch }}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "chat template line 2: filter \"nosuch\" is not supported");
  t = Parse("{{ undefined_fn(1) }}");
  EXPECT_TRUE(absl::StrContains(t.status().message(), "function \"undefined_fn\""));
  // A macro defined later in the template may be called.
  EXPECT_TRUE(Parse("{{ m() }}{% macro m() %}{% endmacro %}").ok());
  EXPECT_FALSE(Parse("{{ 1 + }}").ok());
  EXPECT_FALSE(Parse("{% for x %}{% endfor %}").ok());
  EXPECT_FALSE(Parse("{% if x %}{% endfor %}").ok());
  EXPECT_FALSE(Parse("{% continue %}").ok());
  EXPECT_FALSE(Parse("{% for x in y %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}").ok());
}

}  // namespace
}  // namespace deepinfer::engine::jinja
