#include "engine/chat_template/internal/value.h"

#include "gtest/gtest.h"

namespace deepinfer::engine::jinja {
namespace {

Value L(std::vector<Value> items, bool tuple = false) { return *Value::MakeList(items, tuple); }

TEST(ValueTest, PythonStrAndRepr) {
  EXPECT_EQ(Value::None().Str(), "None");
  EXPECT_EQ(Value::Bool(true).Str(), "True");
  EXPECT_EQ(Value::Int(-3).Str(), "-3");
  EXPECT_EQ(Value::String("it's").Repr(), "\"it's\"");
  EXPECT_EQ(Value::String("a'\"b").Repr(), "'a\\'\"b'");
  EXPECT_EQ(Value::String("x\n\t\\").Repr(), "'x\\n\\t\\\\'");
  EXPECT_EQ(Value::String("é").Repr(), "'é'");
  EXPECT_EQ(L({Value::Int(1), Value::String("a"), Value::None()}).Str(), "[1, 'a', None]");
  EXPECT_EQ(L({Value::Int(1)}, true).Str(), "(1,)");
  EXPECT_EQ(Value().Str(), "");
  auto d = Value::MakeDict({{Value::String("k"), Value::Float(1.0)}});
  EXPECT_EQ(d->Str(), "{'k': 1.0}");
}

TEST(ValueTest, PythonFloatFormat) {
  EXPECT_EQ(FormatPythonFloat(1.0), "1.0");
  EXPECT_EQ(FormatPythonFloat(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatPythonFloat(1e16), "1e+16");
  EXPECT_EQ(FormatPythonFloat(1e15), "1000000000000000.0");
  EXPECT_EQ(FormatPythonFloat(0.0001), "0.0001");
  EXPECT_EQ(FormatPythonFloat(0.00001), "1e-05");
  EXPECT_EQ(FormatPythonFloat(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(FormatPythonFloat(123456.789), "123456.789");
  EXPECT_EQ(FormatPythonFloat(1.5e300), "1.5e+300");
}

TEST(ValueTest, EqualityAndTruthiness) {
  EXPECT_TRUE(Value::Int(1).Equals(Value::Float(1.0)));
  EXPECT_TRUE(Value::Bool(true).Equals(Value::Int(1)));
  EXPECT_FALSE(Value::String("1").Equals(Value::Int(1)));
  EXPECT_FALSE(L({Value::Int(1)}).Equals(L({Value::Int(1)}, true)));
  EXPECT_TRUE(Value().Equals(Value::Undefined("x")));
  EXPECT_FALSE(Value::String("").Truthy());
  EXPECT_FALSE(L({}).Truthy());
  EXPECT_TRUE(L({Value::None()}).Truthy());
  EXPECT_FALSE(Value::Float(0.0).Truthy());
}

TEST(ValueTest, DictKeepsOrderAndLastValue) {
  auto d = Value::MakeDict({{Value::String("b"), Value::Int(1)},
                            {Value::String("a"), Value::Int(2)},
                            {Value::String("b"), Value::Int(3)}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->Str(), "{'b': 3, 'a': 2}");
  EXPECT_EQ(d->as_dict().Find(Value::String("a"))->as_int(), 2);
  EXPECT_EQ(d->as_dict().Find(Value::String("zz")), nullptr);
}

TEST(ValueTest, FromJsonKeepsKeyOrder) {
  auto j = nlohmann::ordered_json::parse(R"({"z": 1, "a": [true, null, 2.5, "s"], "m": {}})");
  auto v = Value::FromJson(j);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->Str(), "{'z': 1, 'a': [True, None, 2.5, 's'], 'm': {}}");
}

TEST(ValueTest, DepthLimit) {
  Value v = L({});
  for (int i = 1; i < kMaxValueDepth; ++i) v = L({v});
  EXPECT_EQ(v.depth(), kMaxValueDepth);
  EXPECT_FALSE(Value::MakeList({v}).ok());
}

TEST(ValueTest, ToJsonLikePythonJsonDumps) {
  auto v = Value::FromJson(nlohmann::ordered_json::parse(
      R"({"name": "f", "args": {"x": [1, 2.0], "y": null}, "s": "é\n\u0001\""})"));
  ASSERT_TRUE(v.ok());
  JsonOptions o;
  EXPECT_EQ(*ToJson(*v, o),
            "{\"name\": \"f\", \"args\": {\"x\": [1, 2.0], \"y\": null}, \"s\": \"é\\n\\u0001\\\"\"}");
  o.has_indent = true;
  o.indent = "  ";
  EXPECT_EQ(*ToJson(*Value::MakeList({Value::Int(1), L({})}), o), "[\n  1,\n  []\n]");
  JsonOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(*ToJson(Value::String("é😀"), ascii), "\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_FALSE(ToJson(Value(), o).ok());
}

TEST(ValueTest, CodePoints) {
  EXPECT_EQ(CodePointCount("héllo"), 5u);
  EXPECT_EQ(CodePointCount("\xff\xfe"), 2u);  // Invalid bytes count one each.
  EXPECT_EQ(CodePointOffsets("aé b").size(), 4u);
}

}  // namespace
}  // namespace deepinfer::engine::jinja
