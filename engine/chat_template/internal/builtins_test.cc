#include "engine/chat_template/internal/builtins.h"

#include "gtest/gtest.h"

namespace deepinfer::engine::jinja {
namespace {

Value S(const char* s) { return Value::String(s); }
Value I(int64_t i) { return Value::Int(i); }
Value L(std::vector<Value> v) { return *Value::MakeList(std::move(v)); }

// Generators and views printed as the list they would produce.
std::string AsList(const absl::StatusOr<Value>& v) {
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return "";
  return Value::MakeList(v->as_list().items)->Str();
}

absl::StatusOr<Value> F(const char* name, const Value& v, CallArgs a = {}) {
  const int id = FindFilter(name);
  EXPECT_GE(id, 0) << name;
  return ApplyFilter(id, v, a);
}

bool T(const char* name, const Value& v, std::vector<Value> args = {}) {
  CallArgs a;
  a.args = std::move(args);
  auto r = ApplyTest(FindTest(name), v, a);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() && *r;
}

TEST(BuiltinsTest, Lookup) {
  EXPECT_GE(FindFilter("tojson"), 0);
  EXPECT_EQ(FindFilter("d"), FindFilter("default"));
  EXPECT_EQ(FindFilter("wordwrap"), -1);
  EXPECT_GE(FindTest("divisibleby"), 0);
  EXPECT_EQ(FindTest("frob"), -1);
  EXPECT_TRUE(IsGlobalFunction("raise_exception"));
  EXPECT_FALSE(IsGlobalFunction("lipsum"));
}

TEST(BuiltinsTest, Filters) {
  EXPECT_EQ(F("trim", S("  x "))->as_string(), "x");
  EXPECT_EQ(F("length", S("héllo"))->as_int(), 5);
  EXPECT_EQ(F("length", Value())->as_int(), 0);
  EXPECT_FALSE(F("length", I(3)).ok());
  EXPECT_EQ(F("default", Value(), {{S("d")}, {}})->as_string(), "d");
  EXPECT_EQ(F("default", S(""), {{S("d"), Value::Bool(true)}, {}})->as_string(), "d");
  EXPECT_EQ(F("join", L({I(1), S("a")}), {{S("-")}, {}})->as_string(), "1-a");
  EXPECT_EQ(F("first", L({}))->is_undefined(), true);
  EXPECT_EQ(F("int", S("4.7"))->as_int(), 4);
  EXPECT_EQ(F("int", S("zz"))->as_int(), 0);
  EXPECT_EQ(F("string", Value::None())->as_string(), "None");
  EXPECT_EQ(F("sort", L({I(3), I(1), I(2)}))->Str(), "[1, 2, 3]");
  EXPECT_EQ(F("sort", L({S("b"), S("A")}))->Str(), "['A', 'b']");
  EXPECT_EQ(AsList(F("unique", L({S("a"), S("A"), S("b")}))), "['a', 'b']");
  EXPECT_EQ(F("unique", L({}))->Str(), "<generator object>");
  EXPECT_TRUE(F("unique", L({}))->Truthy());  // Generators are always true.
  EXPECT_FALSE(F("length", *F("unique", L({}))).ok());
  EXPECT_EQ(F("safe", S("<b>"))->is_safe_string(), true);
  EXPECT_EQ(F("escape", S("<b>"))->as_string(), "&lt;b&gt;");
  EXPECT_EQ(F("escape", *F("safe", S("<b>")))->as_string(), "<b>");
  EXPECT_EQ(F("indent", S("a\nb\n\nc"), {{I(2)}, {}})->as_string(), "a\n  b\n\n  c");
  EXPECT_EQ(F("round", Value::Float(2.5))->Str(), "2.0");
  EXPECT_EQ(F("round", Value::Float(2.675), {{I(2)}, {}})->Str(), "2.67");
}

TEST(BuiltinsTest, Tojson) {
  auto d = *Value::MakeDict({{S("b"), I(1)}, {S("a"), L({I(1), Value::None()})}});
  EXPECT_EQ(F("tojson", d)->as_string(), "{\"b\": 1, \"a\": [1, null]}");
  CallArgs indent;
  indent.kwargs.emplace_back("indent", I(2));
  EXPECT_EQ(F("tojson", d, indent)->as_string(),
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    null\n  ]\n}");
  CallArgs sorted;
  sorted.kwargs.emplace_back("sort_keys", Value::Bool(true));
  EXPECT_EQ(F("tojson", d, sorted)->as_string(), "{\"a\": [1, null], \"b\": 1}");
  CallArgs bad;
  bad.kwargs.emplace_back("nope", I(1));
  EXPECT_FALSE(F("tojson", d, bad).ok());
}

TEST(BuiltinsTest, SelectAndMap) {
  auto users = L({*Value::MakeDict({{S("name"), S("a")}, {S("admin"), Value::Bool(true)}}),
                  *Value::MakeDict({{S("name"), S("b")}})});
  CallArgs attr;
  attr.kwargs.emplace_back("attribute", S("name"));
  EXPECT_EQ(AsList(F("map", users, attr)), "['a', 'b']");
  EXPECT_EQ(AsList(F("map", Value::None(), attr)), "[]");  // Jinja maps nothing over falsy input.
  EXPECT_EQ(F("selectattr", users, {{S("admin")}, {}})->as_list().items.size(), 1u);
  EXPECT_EQ(F("rejectattr", users, {{S("admin")}, {}})->as_list().items.size(), 1u);
  EXPECT_EQ(AsList(F("selectattr", users, {{S("name"), S("equalto"), S("b")}, {}})),
            "[{'name': 'b'}]");
  EXPECT_EQ(AsList(F("select", L({I(1), I(2), I(3)}), {{S("odd")}, {}})), "[1, 3]");
  EXPECT_EQ(AsList(F("select", Value::None())), "[]");
  EXPECT_FALSE(F("select", L({I(1)}), {{S("nosuchtest")}, {}}).ok());
}

TEST(BuiltinsTest, Tests) {
  EXPECT_TRUE(T("defined", I(1)));
  EXPECT_FALSE(T("defined", Value()));
  EXPECT_TRUE(T("none", Value::None()));
  EXPECT_TRUE(T("number", Value::Bool(true)));
  EXPECT_FALSE(T("integer", Value::Bool(true)));
  EXPECT_TRUE(T("iterable", Value()));
  EXPECT_FALSE(T("iterable", I(1)));
  EXPECT_TRUE(T("divisibleby", I(9), {I(3)}));
  EXPECT_TRUE(T("in", I(2), {L({I(1), I(2)})}));
  EXPECT_TRUE(T("sameas", Value::None(), {Value::None()}));
  EXPECT_TRUE(T("lower", S("abc")));
}

TEST(BuiltinsTest, Methods) {
  CallArgs sep;
  sep.args.push_back(S(","));
  EXPECT_EQ(CallMethod(S("a,b"), "split", sep)->Str(), "['a', 'b']");
  EXPECT_EQ(CallMethod(S(" x "), "strip", {})->as_string(), "x");
  CallArgs two;
  two.args = {I(1), S("x")};
  EXPECT_EQ(CallMethod(S("{}-{}"), "format", two)->as_string(), "1-x");
  auto d = *Value::MakeDict({{S("k"), I(1)}});
  CallArgs key;
  key.args = {S("missing"), S("dflt")};
  EXPECT_EQ(CallMethod(d, "get", key)->as_string(), "dflt");
  EXPECT_EQ(CallMethod(d, "items", {})->Str(), "dict_items([('k', 1)])");
  EXPECT_EQ(CallMethod(d, "keys", {})->Str(), "dict_keys(['k'])");
  CallArgs one;
  one.args = {I(2)};
  auto st = CallMethod(L({}), "append", one);
  EXPECT_EQ(st.status().message(), "access to attribute 'append' of 'list' object is unsafe.");
}

TEST(BuiltinsTest, Globals) {
  const absl::Time now = absl::FromUnixSeconds(0);
  CallArgs three;
  three.args = {I(3)};
  EXPECT_EQ(CallGlobal("range", three, now)->Str(), "[0, 1, 2]");
  CallArgs big;
  big.args = {I(kMaxRange + 1)};
  EXPECT_FALSE(CallGlobal("range", big, now).ok());
  CallArgs msg;
  msg.args = {S("no system role")};
  auto raised = CallGlobal("raise_exception", msg, now);
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().message(), "no system role");
  EXPECT_TRUE(IsRaisedException(raised.status()));
  CallArgs kw;
  kw.kwargs.emplace_back("a", I(1));
  auto ns = CallGlobal("namespace", kw, now);
  ASSERT_TRUE(ns.ok());
  EXPECT_TRUE(ns->is_namespace());
}

}  // namespace
}  // namespace deepinfer::engine::jinja
