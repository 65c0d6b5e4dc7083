#include "engine/chat_template/internal/ops.h"

#include "gtest/gtest.h"

namespace deepinfer::engine::jinja {
namespace {

Value S(const char* s) { return Value::String(s); }
Value I(int64_t i) { return Value::Int(i); }
Value L(std::vector<Value> v) { return *Value::MakeList(std::move(v)); }

TEST(OpsTest, Arithmetic) {
  EXPECT_EQ(BinaryOp("//", I(-7), I(2))->as_int(), -4);
  EXPECT_EQ(BinaryOp("%", I(-7), I(3))->as_int(), 2);
  EXPECT_EQ(BinaryOp("%", I(7), I(-3))->as_int(), -2);
  EXPECT_DOUBLE_EQ(BinaryOp("/", I(7), I(2))->as_double(), 3.5);
  EXPECT_TRUE(BinaryOp("/", I(4), I(2))->is_float());
  EXPECT_EQ(BinaryOp("**", I(2), I(10))->as_int(), 1024);
  EXPECT_DOUBLE_EQ(BinaryOp("**", I(2), I(-1))->as_double(), 0.5);
  EXPECT_EQ(BinaryOp("+", S("a"), S("b"))->as_string(), "ab");
  EXPECT_EQ(BinaryOp("*", S("ab"), I(2))->as_string(), "abab");
  EXPECT_EQ(BinaryOp("+", L({I(1)}), L({I(2)}))->Str(), "[1, 2]");
  EXPECT_FALSE(BinaryOp("/", I(1), I(0)).ok());
  EXPECT_FALSE(BinaryOp("%", I(1), I(0)).ok());
  EXPECT_FALSE(BinaryOp("+", S("a"), I(1)).ok());
  EXPECT_FALSE(BinaryOp("*", I(INT64_MAX), I(2)).ok());
  EXPECT_FALSE(BinaryOp("**", I(10), I(100)).ok());
  EXPECT_FALSE(BinaryOp("*", S("x"), I(int64_t{1} << 40)).ok());
  EXPECT_EQ(BinaryOp("+", Value::Undefined("'u' is undefined"), I(1)).status().message(),
            "'u' is undefined");
}

TEST(OpsTest, CompareAndContains) {
  EXPECT_LT(*Compare(I(1), Value::Float(1.5), "<"), 0);
  EXPECT_GT(*Compare(S("b"), S("a"), ">"), 0);
  EXPECT_LT(*Compare(L({I(1), I(2)}), L({I(1), I(3)}), "<"), 0);
  EXPECT_FALSE(Compare(I(1), S("a"), "<").ok());
  EXPECT_TRUE(*Contains(S("cat"), S("a")));
  EXPECT_TRUE(*Contains(L({I(1), I(2)}), Value::Float(2.0)));
  EXPECT_FALSE(*Contains(Value(), I(1)));
  EXPECT_FALSE(Contains(S("abc"), I(1)).ok());
  EXPECT_FALSE(Contains(Value::None(), I(1)).ok());
}

TEST(OpsTest, AttributesAndItems) {
  auto d = *Value::MakeDict({{S("role"), S("user")}, {S("items"), I(5)}});
  EXPECT_EQ(GetAttr(d, "role")->as_string(), "user");
  EXPECT_TRUE(GetAttr(d, "items")->is_callable());  // Methods first, as Python's getattr.
  EXPECT_EQ(GetItem(d, S("items"))->as_int(), 5);  // Items first for subscripts.
  EXPECT_TRUE(GetAttr(d, "nope")->is_undefined());
  EXPECT_TRUE(GetAttr(Value::None(), "x")->is_undefined());
  EXPECT_FALSE(GetAttr(Value::Undefined("'m' is undefined"), "x").ok());
  auto l = L({I(1), I(2), I(3)});
  EXPECT_EQ(GetItem(l, I(-1))->as_int(), 3);
  EXPECT_TRUE(GetItem(l, I(3))->is_undefined());
  EXPECT_EQ(GetItem(S("héllo"), I(1))->as_string(), "é");
}

TEST(OpsTest, Slices) {
  auto l = L({I(0), I(1), I(2), I(3), I(4)});
  const Value n = Value::None();
  EXPECT_EQ(GetSlice(l, I(1), n, n)->Str(), "[1, 2, 3, 4]");
  EXPECT_EQ(GetSlice(l, n, n, I(-1))->Str(), "[4, 3, 2, 1, 0]");
  EXPECT_EQ(GetSlice(l, I(-2), n, n)->Str(), "[3, 4]");
  EXPECT_EQ(GetSlice(l, n, n, I(2))->Str(), "[0, 2, 4]");
  EXPECT_EQ(GetSlice(l, I(10), n, n)->Str(), "[]");
  EXPECT_EQ(GetSlice(l, I(3), I(1), I(-1))->Str(), "[3, 2]");
  EXPECT_EQ(GetSlice(S("héllo"), n, n, I(-1))->as_string(), "olléh");
  EXPECT_FALSE(GetSlice(l, n, n, I(0)).ok());
}

TEST(OpsTest, StringHelpers) {
  EXPECT_EQ(PyStrip("  a b \n", Value::None(), true, true), "a b");
  EXPECT_EQ(PyStrip("xxaxx", S("x"), true, false), "axx");
  EXPECT_EQ(PyTitle("hello wORLD 2nd"), "Hello World 2Nd");
  EXPECT_EQ(PyCapitalize("hELLO"), "Hello");
  EXPECT_EQ(*PyReplace("aaa", "a", "b", 2), "bba");
  EXPECT_EQ(*PyReplace("ab", "", "-", -1), "-a-b-");
  auto parts = PySplit(" a  b ", Value::None(), -1, false);
  EXPECT_EQ(*parts, (std::vector<std::string>{"a", "b"}));
  parts = PySplit("a,b,,c", S(","), -1, false);
  EXPECT_EQ(*parts, (std::vector<std::string>{"a", "b", "", "c"}));
  parts = PySplit("a,b,c", S(","), 1, true);
  EXPECT_EQ(*parts, (std::vector<std::string>{"a,b", "c"}));
  EXPECT_FALSE(PySplit("a", S(""), -1, false).ok());
}

TEST(OpsTest, PercentFormat) {
  auto args = *Value::MakeList({S("Bob"), I(42)}, true);
  EXPECT_EQ(PercentFormat("%s is %d", args)->as_string(), "Bob is 42");
  EXPECT_EQ(PercentFormat("%05.1f%%", Value::Float(3.14159))->as_string(), "003.1%");
  EXPECT_FALSE(PercentFormat("%s %s", S("x")).ok());
  EXPECT_FALSE(PercentFormat("%d", S("x")).ok());
}

TEST(OpsTest, MethodTables) {
  EXPECT_TRUE(HasMethod(S("x"), "strip"));
  EXPECT_FALSE(HasMethod(S("x"), "get"));
  EXPECT_TRUE(HasMethod(L({}), "append"));
  EXPECT_TRUE(IsMutatingMethod("append"));
  EXPECT_TRUE(IsKnownMethodName("startswith"));
  EXPECT_FALSE(IsKnownMethodName("frobnicate"));
}

}  // namespace
}  // namespace deepinfer::engine::jinja
