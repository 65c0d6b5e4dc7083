#include "engine/chat_template/internal/builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/chat_template/internal/ops.h"

namespace deepinfer::engine::jinja {
namespace {

enum Filter : int {
  kAbs, kAttr, kCapitalize, kCount, kDefault, kDictsort, kEscape, kFirst, kFloat, kFormat,
  kIndent, kInt, kItems, kJoin, kLast, kLength, kList, kLower, kMap, kMax, kMin, kReject,
  kRejectattr, kReplace, kReverse, kRound, kSafe, kSelect, kSelectattr, kSort, kString, kSum,
  kTitle, kTojson, kTrim, kUnique, kUpper, kWordcount,
};

struct Named {
  const char* name;
  int id;
};

constexpr Named kFilters[] = {
    {"abs", kAbs},         {"attr", kAttr},         {"capitalize", kCapitalize},
    {"count", kCount},     {"d", kDefault},         {"default", kDefault},
    {"dictsort", kDictsort}, {"e", kEscape},        {"escape", kEscape},
    {"first", kFirst},     {"float", kFloat},       {"format", kFormat},
    {"indent", kIndent},   {"int", kInt},           {"items", kItems},
    {"join", kJoin},       {"last", kLast},         {"length", kLength},
    {"list", kList},       {"lower", kLower},       {"map", kMap},
    {"max", kMax},         {"min", kMin},           {"reject", kReject},
    {"rejectattr", kRejectattr}, {"replace", kReplace}, {"reverse", kReverse},
    {"round", kRound},     {"safe", kSafe},         {"select", kSelect},
    {"selectattr", kSelectattr}, {"sort", kSort},   {"string", kString},
    {"sum", kSum},         {"title", kTitle},       {"tojson", kTojson},
    {"trim", kTrim},       {"unique", kUnique},     {"upper", kUpper},
    {"wordcount", kWordcount},
};

enum Test : int {
  kTDefined, kTUndefined, kTNone, kTBoolean, kTFalse, kTTrue, kTInteger, kTFloat, kTNumber,
  kTString, kTMapping, kTIterable, kTSequence, kTCallable, kTSameas, kTEq, kTNe, kTLt, kTLe,
  kTGt, kTGe, kTIn, kTOdd, kTEven, kTDivisibleby, kTLower, kTUpper, kTEscaped,
};

constexpr Named kTests[] = {
    {"defined", kTDefined},   {"undefined", kTUndefined}, {"none", kTNone},
    {"boolean", kTBoolean},   {"false", kTFalse},         {"true", kTTrue},
    {"integer", kTInteger},   {"float", kTFloat},         {"number", kTNumber},
    {"string", kTString},     {"mapping", kTMapping},     {"iterable", kTIterable},
    {"sequence", kTSequence}, {"callable", kTCallable},   {"sameas", kTSameas},
    {"equalto", kTEq},        {"eq", kTEq},               {"==", kTEq},
    {"ne", kTNe},             {"!=", kTNe},               {"lt", kTLt},
    {"lessthan", kTLt},       {"<", kTLt},                {"le", kTLe},
    {"<=", kTLe},             {"gt", kTGt},               {"greaterthan", kTGt},
    {">", kTGt},              {"ge", kTGe},               {">=", kTGe},
    {"in", kTIn},             {"odd", kTOdd},             {"even", kTEven},
    {"divisibleby", kTDivisibleby}, {"lower", kTLower},   {"upper", kTUpper},
    {"escaped", kTEscaped},
};

bool IsIntLikeValue(const Value& v) { return v.is_int() || v.is_bool(); }

constexpr const char* kRaisedPayload = "deepinfer.chat_template/raise_exception";

// Python-style argument binding: positional arguments, then keywords by name.
struct Param {
  const char* name;
  Value dflt;  // Undefined means "not given".
};

absl::StatusOr<std::vector<Value>> Bind(absl::string_view fn, const CallArgs& a,
                                        std::initializer_list<Param> params) {
  std::vector<Value> out;
  for (const Param& p : params) out.push_back(p.dflt);
  if (a.args.size() > params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(fn, "() takes at most ", params.size(),
                                                   " arguments (", a.args.size(), " given)"));
  }
  for (size_t i = 0; i < a.args.size(); ++i) out[i] = a.args[i];
  for (const auto& [name, v] : a.kwargs) {
    size_t i = 0;
    for (const Param& p : params) {
      if (name == p.name) break;
      ++i;
    }
    if (i == params.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(fn, "() got an unexpected keyword argument '", name, "'"));
    }
    out[i] = v;
  }
  return out;
}

bool Given(const Value& v) { return !v.is_undefined(); }

absl::StatusOr<std::string> StringArg(const Value& v, absl::string_view what) {
  if (v.is_string()) return v.as_string();
  if (v.is_undefined()) return UndefinedError(v);
  return absl::InvalidArgumentError(absl::StrCat(what, " must be a string, not ", v.TypeName()));
}

absl::StatusOr<Value> ListOf(std::vector<Value> items) { return Value::MakeList(std::move(items)); }

// What Jinja's generator filters (map, select, unique, items, ...) return.
absl::StatusOr<Value> GeneratorOf(std::vector<Value> items) {
  return Value::MakeLazy(std::move(items), ListKind::kGenerator);
}

// Filters that return a string derived from a Markup input keep it Markup.
Value SameSafety(const Value& input, std::string s) {
  return input.is_safe_string() ? Value::SafeString(std::move(s)) : Value::String(std::move(s));
}

absl::StatusOr<Value> StringList(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.push_back(Value::String(p));
  return Value::MakeList(std::move(items));
}

// Jinja's make_attrgetter: "a.b.0" walks items/attributes.
absl::StatusOr<Value> GetPath(const Value& obj, const Value& attribute) {
  if (IsIntLikeValue(attribute)) return GetItem(obj, attribute);
  if (!attribute.is_string()) return GetItem(obj, attribute);
  Value cur = obj;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    Value key = Value::String(std::string(part));
    if (!part.empty() && std::all_of(part.begin(), part.end(),
                                     [](char c) { return c >= '0' && c <= '9'; })) {
      key = Value::Int(std::strtoll(std::string(part).c_str(), nullptr, 10));
    }
    auto next = GetItem(cur, key);
    if (!next.ok()) return next.status();
    cur = *std::move(next);
  }
  return cur;
}

// For case-insensitive sorting, unique, min/max: lowercased strings.
Value IgnoreCase(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(AsciiLower(v.as_string()));
  return v;
}

absl::Status SortValues(std::vector<Value>* keys, std::vector<Value>* values, bool reverse) {
  std::vector<size_t> order(keys->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (!error.ok()) return false;
    auto c = Compare((*keys)[x], (*keys)[y], "<");
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  if (!error.ok()) return error;
  std::vector<Value> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back((*values)[i]);
  *values = std::move(sorted);
  return absl::OkStatus();
}

std::vector<std::string> SplitLines(absl::string_view s, bool keepends) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      size_t end = i;
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      lines.emplace_back(s.substr(start, (keepends ? i + 1 : end) - start));
      start = i + 1;
    }
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

absl::StatusOr<std::string> StrFormat(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) {
      return absl::InvalidArgumentError("Single '{' encountered in format string");
    }
    std::string field = fmt.substr(i + 1, close - i - 1);
    bool repr = false;
    if (field.size() >= 2 && field[field.size() - 2] == '!') {
      repr = field.back() == 'r';
      field.resize(field.size() - 2);
    }
    if (field.find(':') != std::string::npos) {
      return absl::InvalidArgumentError("str.format: format specs are not supported");
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(),
                                     [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t index = field.empty() ? auto_index++ : std::strtoul(field.c_str(), nullptr, 10);
      if (index >= a.args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Replacement index ", index, " out of range for positional args tuple"));
      }
      v = &a.args[index];
    } else {
      for (const auto& [name, val] : a.kwargs) {
        if (name == field) v = &val;
      }
      if (v == nullptr) return absl::InvalidArgumentError(absl::StrCat("KeyError: '", field, "'"));
    }
    out += repr ? v->Repr() : v->Str();
    if (out.size() > kMaxStringBytes) return absl::InvalidArgumentError("format result too large");
    i = close;
  }
  return out;
}

absl::StatusOr<Value> RoundFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("round", a, {{"precision", Value::Int(0)}, {"method", Value::String("common")}});
  if (!p.ok()) return p.status();
  auto precision = ToInt((*p)[0], "round precision");
  if (!precision.ok()) return precision.status();
  auto method = StringArg((*p)[1], "round method");
  if (!method.ok()) return method.status();
  if (!v.is_number()) {
    if (v.is_undefined()) return UndefinedError(v);
    return absl::InvalidArgumentError(absl::StrCat("round: expected a number, not ", v.TypeName()));
  }
  const double x = v.as_double();
  const int64_t prec = std::clamp<int64_t>(*precision, -300, 300);
  if (*method == "common") {
    // Python's round(): half to even on the exact binary value, which "%.*f" also does.
    if (prec >= 0) {
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(prec, 100)), x);
      return Value::Float(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(-prec));
    return Value::Float(std::nearbyint(x / scale) * scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(prec));
  if (*method == "ceil") return Value::Float(std::ceil(x * scale) / scale);
  if (*method == "floor") return Value::Float(std::floor(x * scale) / scale);
  return absl::InvalidArgumentError("round: method must be 'common', 'ceil' or 'floor'");
}

absl::StatusOr<Value> TojsonFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("tojson", a,
                {{"ensure_ascii", Value::Bool(false)}, {"indent", Value::None()},
                 {"separators", Value::None()}, {"sort_keys", Value::Bool(false)}});
  if (!p.ok()) return p.status();
  JsonOptions o;
  o.ensure_ascii = (*p)[0].Truthy();
  const Value& indent = (*p)[1];
  if (indent.is_string()) {
    o.has_indent = true;
    o.indent = indent.as_string();
  } else if (indent.is_int()) {
    o.has_indent = true;
    o.indent = std::string(std::clamp<int64_t>(indent.as_int(), 0, 256), ' ');
  } else if (!indent.is_none() && !indent.is_undefined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tojson: indent must be an int, a string or None, not ", indent.TypeName()));
  }
  const Value& seps = (*p)[2];
  if (seps.is_list() && seps.as_list().items.size() == 2 && seps.as_list().items[0].is_string() &&
      seps.as_list().items[1].is_string()) {
    o.has_separators = true;
    o.item_separator = seps.as_list().items[0].as_string();
    o.key_separator = seps.as_list().items[1].as_string();
  } else if (!seps.is_none() && !seps.is_undefined()) {
    return absl::InvalidArgumentError("tojson: separators must be a pair of strings");
  }
  o.sort_keys = (*p)[3].Truthy();
  auto json = ToJson(v, o);
  if (!json.ok()) return json.status();
  return Value::String(*std::move(json));
}

// select/reject/selectattr/rejectattr.
absl::StatusOr<Value> SelectFilter(const Value& v, const CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (a.args.empty()) return absl::InvalidArgumentError("selectattr: missing attribute");
    attribute = a.args[next++];
  }
  int test = -1;
  CallArgs test_args;
  if (next < a.args.size()) {
    auto name = StringArg(a.args[next++], "test name");
    if (!name.ok()) return name.status();
    test = FindTest(*name);
    if (test < 0) {
      return absl::InvalidArgumentError(absl::StrCat("test \"", *name, "\" is not supported"));
    }
    test_args.args.assign(a.args.begin() + next, a.args.end());
    test_args.kwargs = a.kwargs;
  }
  if (!v.Truthy()) return GeneratorOf({});  // Jinja: `if seq: for item in seq`.
  auto items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<Value> out;
  for (const Value& item : *items) {
    Value subject = item;
    if (by_attr) {
      auto got = GetPath(item, attribute);
      if (!got.ok()) return got.status();
      subject = *std::move(got);
    }
    bool pass;
    if (test >= 0) {
      auto r = ApplyTest(test, subject, test_args);
      if (!r.ok()) return r.status();
      pass = *r;
    } else {
      pass = subject.Truthy();
    }
    if (pass == keep) out.push_back(item);
  }
  return GeneratorOf(std::move(out));
}

absl::StatusOr<Value> MapFilter(const Value& v, const CallArgs& a) {
  if (!v.Truthy()) return GeneratorOf({});  // Jinja: `if value: for item in value`.
  auto items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<Value> out;
  out.reserve(items->size());
  if (a.args.empty()) {
    Value attribute, dflt;
    for (const auto& [name, val] : a.kwargs) {
      if (name == "attribute") {
        attribute = val;
      } else if (name == "default") {
        dflt = val;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("map() got an unexpected keyword argument '", name, "'"));
      }
    }
    if (attribute.is_undefined()) return absl::InvalidArgumentError("map: missing attribute");
    for (const Value& item : *items) {
      auto got = GetPath(item, attribute);
      if (!got.ok()) return got.status();
      out.push_back(got->is_undefined() && Given(dflt) ? dflt : *std::move(got));
    }
    return GeneratorOf(std::move(out));
  }
  auto name = StringArg(a.args[0], "map filter name");
  if (!name.ok()) return name.status();
  const int filter = FindFilter(*name);
  if (filter < 0) {
    return absl::InvalidArgumentError(absl::StrCat("filter \"", *name, "\" is not supported"));
  }
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const Value& item : *items) {
    auto r = ApplyFilter(filter, item, rest);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return GeneratorOf(std::move(out));
}

absl::StatusOr<Value> SortFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("sort", a, {{"reverse", Value::Bool(false)}, {"case_sensitive", Value::Bool(false)},
                            {"attribute", Value::None()}});
  if (!p.ok()) return p.status();
  auto items = Iterate(v);
  if (!items.ok()) return items.status();
  std::vector<Value> keys;
  keys.reserve(items->size());
  for (const Value& item : *items) {
    Value key = item;
    if (!(*p)[2].is_none()) {
      auto got = GetPath(item, (*p)[2]);
      if (!got.ok()) return got.status();
      key = *std::move(got);
    }
    keys.push_back(IgnoreCase(key, (*p)[1].Truthy()));
  }
  auto st = SortValues(&keys, &*items, (*p)[0].Truthy());
  if (!st.ok()) return st;
  return ListOf(*std::move(items));
}

absl::StatusOr<Value> MinMaxFilter(const Value& v, const CallArgs& a, bool max) {
  auto p = Bind(max ? "max" : "min", a,
                {{"case_sensitive", Value::Bool(false)}, {"attribute", Value::None()}});
  if (!p.ok()) return p.status();
  auto items = Iterate(v);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const Value* best = nullptr;
  Value best_key;
  for (const Value& item : *items) {
    Value key = item;
    if (!(*p)[1].is_none()) {
      auto got = GetPath(item, (*p)[1]);
      if (!got.ok()) return got.status();
      key = *std::move(got);
    }
    key = IgnoreCase(key, (*p)[0].Truthy());
    if (best != nullptr) {
      auto c = Compare(key, best_key, max ? ">" : "<");
      if (!c.ok()) return c.status();
      if (max ? *c <= 0 : *c >= 0) continue;
    }
    best = &item;
    best_key = key;
  }
  return *best;
}

absl::StatusOr<Value> IndentFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("indent", a,
                {{"width", Value::Int(4)}, {"first", Value::Bool(false)}, {"blank", Value::Bool(false)}});
  if (!p.ok()) return p.status();
  std::string unit;
  if ((*p)[0].is_string()) {
    unit = (*p)[0].as_string();
  } else {
    auto w = ToInt((*p)[0], "indent width");
    if (!w.ok()) return w.status();
    unit = std::string(std::clamp<int64_t>(*w, 0, 1024), ' ');
  }
  const std::string s = v.Str() + "\n";
  std::vector<std::string> lines = SplitLines(s, false);
  std::string out;
  if ((*p)[2].Truthy()) {
    out = absl::StrJoin(lines, "\n" + unit);
  } else if (!lines.empty()) {
    out = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      out += "\n";
      if (!lines[i].empty()) out += unit;
      out += lines[i];
    }
  }
  if ((*p)[1].Truthy()) out = unit + out;
  if (out.size() > kMaxStringBytes) return absl::InvalidArgumentError("indent result too large");
  return Value::String(std::move(out));
}

absl::StatusOr<Value> IntFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("int", a, {{"default", Value::Int(0)}, {"base", Value::Int(10)}});
  if (!p.ok()) return p.status();
  if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return (*p)[0];
    return Value::Int(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    auto base = ToInt((*p)[1], "int base");
    if (!base.ok()) return base.status();
    std::string s = PyStrip(v.as_string(), Value::None(), true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty() && *base >= 2 && *base <= 36) {
      errno = 0;
      char* end = nullptr;
      const long long r = std::strtoll(s.c_str(), &end, static_cast<int>(*base));
      if (errno == 0 && end == s.c_str() + s.size()) return Value::Int(r);
      char* fend = nullptr;
      const double d = std::strtod(s.c_str(), &fend);
      if (fend == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
    }
  }
  return (*p)[0];
}

absl::StatusOr<Value> FloatFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("float", a, {{"default", Value::Float(0.0)}});
  if (!p.ok()) return p.status();
  if (v.is_number()) return Value::Float(v.as_double());
  if (v.is_string()) {
    const std::string s = PyStrip(v.as_string(), Value::None(), true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(d);
  }
  return (*p)[0];
}

absl::StatusOr<Value> DictsortFilter(const Value& v, const CallArgs& a) {
  auto p = Bind("dictsort", a, {{"case_sensitive", Value::Bool(false)},
                                {"by", Value::String("key")}, {"reverse", Value::Bool(false)}});
  if (!p.ok()) return p.status();
  if (!v.is_dict()) return absl::InvalidArgumentError("dictsort: expected a mapping");
  const bool by_value = (*p)[1].is_string() && (*p)[1].as_string() == "value";
  std::vector<Value> keys, pairs;
  for (const auto& [k, val] : v.as_dict().items) {
    keys.push_back(IgnoreCase(by_value ? val : k, (*p)[0].Truthy()));
    auto pair = Value::MakeList({k, val}, /*is_tuple=*/true);
    if (!pair.ok()) return pair.status();
    pairs.push_back(*std::move(pair));
  }
  auto st = SortValues(&keys, &pairs, (*p)[2].Truthy());
  if (!st.ok()) return st;
  return ListOf(std::move(pairs));
}

absl::StatusOr<Value> ItemsOf(const Value& v, ListKind kind) {
  if (v.is_undefined()) return Value::MakeLazy({}, kind);
  if (!v.is_dict()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Can only get item pairs from a mapping, not ", v.TypeName()));
  }
  std::vector<Value> pairs;
  pairs.reserve(v.as_dict().items.size());
  for (const auto& [k, val] : v.as_dict().items) {
    auto pair = Value::MakeList({k, val}, /*is_tuple=*/true);
    if (!pair.ok()) return pair.status();
    pairs.push_back(*std::move(pair));
  }
  return Value::MakeLazy(std::move(pairs), kind);
}

absl::StatusOr<Value> DictMethod(const Value& d, absl::string_view name, const CallArgs& a) {
  if (name == "get") {
    auto p = Bind("get", a, {{"key", Value()}, {"default", Value::None()}});
    if (!p.ok()) return p.status();
    if (const Value* v = d.as_dict().Find((*p)[0])) return *v;
    return (*p)[1];
  }
  if (!a.args.empty() || !a.kwargs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dict.", name, "() takes no arguments"));
  }
  if (name == "items") return ItemsOf(d, ListKind::kDictItems);
  std::vector<Value> out;
  for (const auto& [k, v] : d.as_dict().items) out.push_back(name == "keys" ? k : v);
  return Value::MakeLazy(std::move(out), name == "keys" ? ListKind::kDictKeys
                                                         : ListKind::kDictValues);
}

bool AllChars(const std::string& s, int (*pred)(int)) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!pred(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::StatusOr<Value> StringMethod(const std::string& s, absl::string_view name,
                                   const CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto p = Bind(name, a, {{"chars", Value::None()}});
    if (!p.ok()) return p.status();
    return Value::String(PyStrip(s, (*p)[0], name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    auto p = Bind(name, a, {{"sep", Value::None()}, {"maxsplit", Value::Int(-1)}});
    if (!p.ok()) return p.status();
    auto maxsplit = ToInt((*p)[1], "maxsplit");
    if (!maxsplit.ok()) return maxsplit.status();
    auto parts = PySplit(s, (*p)[0], *maxsplit, name == "rsplit");
    if (!parts.ok()) return parts.status();
    return StringList(*parts);
  }
  if (name == "splitlines") {
    auto p = Bind(name, a, {{"keepends", Value::Bool(false)}});
    if (!p.ok()) return p.status();
    return StringList(SplitLines(s, (*p)[0].Truthy()));
  }
  if (name == "startswith" || name == "endswith") {
    auto p = Bind(name, a, {{"prefix", Value()}});
    if (!p.ok()) return p.status();
    std::vector<Value> options;
    if ((*p)[0].is_list() && (*p)[0].as_list().is_tuple) {
      options = (*p)[0].as_list().items;
    } else {
      options.push_back((*p)[0]);
    }
    for (const Value& o : options) {
      auto str = StringArg(o, absl::StrCat(name, " argument"));
      if (!str.ok()) return str.status();
      const bool hit = name == "startswith" ? absl::StartsWith(s, *str) : absl::EndsWith(s, *str);
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "swapcase") {
    if (!a.args.empty() || !a.kwargs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("str.", name, "() takes no arguments"));
    }
    if (name == "upper") return Value::String(AsciiUpper(s));
    if (name == "lower") return Value::String(AsciiLower(s));
    if (name == "title") return Value::String(PyTitle(s));
    if (name == "capitalize") return Value::String(PyCapitalize(s));
    std::string out = s;
    for (char& c : out) {
      if (c >= 'a' && c <= 'z') {
        c = c - 'a' + 'A';
      } else if (c >= 'A' && c <= 'Z') {
        c = c - 'A' + 'a';
      }
    }
    return Value::String(std::move(out));
  }
  if (name == "replace") {
    auto p = Bind(name, a, {{"old", Value()}, {"new", Value()}, {"count", Value::Int(-1)}});
    if (!p.ok()) return p.status();
    auto from = StringArg((*p)[0], "replace old");
    if (!from.ok()) return from.status();
    auto to = StringArg((*p)[1], "replace new");
    if (!to.ok()) return to.status();
    auto count = ToInt((*p)[2], "replace count");
    if (!count.ok()) return count.status();
    auto r = PyReplace(s, *from, *to, *count);
    if (!r.ok()) return r.status();
    return Value::String(*std::move(r));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    auto p = Bind(name, a, {{"sub", Value()}});
    if (!p.ok()) return p.status();
    auto sub = StringArg((*p)[0], absl::StrCat(name, " argument"));
    if (!sub.ok()) return sub.status();
    if (name == "count") {
      if (sub->empty()) return Value::Int(static_cast<int64_t>(CodePointCount(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size())) {
        ++n;
      }
      return Value::Int(n);
    }
    const size_t at = name == "find" ? s.find(*sub) : s.rfind(*sub);
    if (at == std::string::npos) return Value::Int(-1);
    return Value::Int(static_cast<int64_t>(CodePointCount(absl::string_view(s).substr(0, at))));
  }
  if (name == "join") {
    auto p = Bind(name, a, {{"iterable", Value()}});
    if (!p.ok()) return p.status();
    auto items = Iterate((*p)[0]);
    if (!items.ok()) return items.status();
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      const Value& item = (*items)[i];
      if (!item.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence item ", i,
                                                       ": expected str instance, ",
                                                       item.TypeName(), " found"));
      }
      if (i > 0) out += s;
      out += item.as_string();
      if (out.size() > kMaxStringBytes) return absl::InvalidArgumentError("join result too large");
    }
    return Value::String(std::move(out));
  }
  if (name == "isdigit") return Value::Bool(AllChars(s, isdigit));
  if (name == "isalpha") return Value::Bool(AllChars(s, isalpha));
  if (name == "isalnum") return Value::Bool(AllChars(s, isalnum));
  if (name == "isspace") return Value::Bool(AllChars(s, isspace));
  if (name == "isupper" || name == "islower") {
    bool cased = false, ok = true;
    for (char c : s) {
      const bool up = c >= 'A' && c <= 'Z', low = c >= 'a' && c <= 'z';
      cased |= up || low;
      if (name == "isupper" ? low : up) ok = false;
    }
    return Value::Bool(cased && ok);
  }
  if (name == "format") {
    auto r = StrFormat(s, a);
    if (!r.ok()) return r.status();
    return Value::String(*std::move(r));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    auto p = Bind(name, a, {{"affix", Value()}});
    if (!p.ok()) return p.status();
    auto affix = StringArg((*p)[0], absl::StrCat(name, " argument"));
    if (!affix.ok()) return affix.status();
    if (name == "removeprefix" && absl::StartsWith(s, *affix)) {
      return Value::String(s.substr(affix->size()));
    }
    if (name == "removesuffix" && absl::EndsWith(s, *affix)) {
      return Value::String(s.substr(0, s.size() - affix->size()));
    }
    return Value::String(s);
  }
  return absl::InvalidArgumentError(absl::StrCat("'str' object has no method '", name, "'"));
}

}  // namespace

int FindFilter(absl::string_view name) {
  for (const Named& f : kFilters) {
    if (name == f.name) return f.id;
  }
  return -1;
}

int FindTest(absl::string_view name) {
  for (const Named& t : kTests) {
    if (name == t.name) return t.id;
  }
  return -1;
}

absl::StatusOr<Value> ApplyFilter(int filter, const Value& v, const CallArgs& a) {
  auto no_args = [&](const char* name) -> absl::Status {
    if (!a.args.empty() || !a.kwargs.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("filter ", name, " takes no arguments"));
    }
    return absl::OkStatus();
  };
  switch (static_cast<Filter>(filter)) {
    case kAbs: {
      if (v.is_int() || v.is_bool()) {
        if (v.as_int() == INT64_MIN) return absl::InvalidArgumentError("integer overflow");
        return Value::Int(std::llabs(v.as_int()));
      }
      if (v.is_float()) return Value::Float(std::fabs(v.as_double()));
      if (v.is_undefined()) return UndefinedError(v);
      return absl::InvalidArgumentError(
          absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
    }
    case kAttr: {
      auto p = Bind("attr", a, {{"name", Value()}});
      if (!p.ok()) return p.status();
      auto name = StringArg((*p)[0], "attr name");
      if (!name.ok()) return name.status();
      if (v.is_undefined()) return UndefinedError(v);
      if (HasMethod(v, *name) || v.is_namespace()) return GetAttr(v, *name);
      return Value::Undefined(absl::StrCat("'", v.TypeName(), " object' has no attribute '",
                                           *name, "'"));
    }
    case kCapitalize:
      if (auto st = no_args("capitalize"); !st.ok()) return st;
      return SameSafety(v, PyCapitalize(v.Str()));
    case kCount:
    case kLength: {
      if (auto st = no_args("length"); !st.ok()) return st;
      auto n = Length(v);
      if (!n.ok()) return n.status();
      return Value::Int(*n);
    }
    case kDefault: {
      auto p = Bind("default", a, {{"default_value", Value::String("")},
                                   {"boolean", Value::Bool(false)}});
      if (!p.ok()) return p.status();
      if (v.is_undefined() || ((*p)[1].Truthy() && !v.Truthy())) return (*p)[0];
      return v;
    }
    case kDictsort: return DictsortFilter(v, a);
    case kEscape:
      if (auto st = no_args("escape"); !st.ok()) return st;
      if (v.is_safe_string()) return v;
      return Value::SafeString(HtmlEscape(v.Str()));
    case kFirst: {
      if (auto st = no_args("first"); !st.ok()) return st;
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      if (items->empty()) return Value::Undefined("No first item, sequence was empty.");
      return items->front();
    }
    case kLast: {
      if (auto st = no_args("last"); !st.ok()) return st;
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      if (items->empty()) return Value::Undefined("No last item, sequence was empty.");
      return items->back();
    }
    case kFloat: return FloatFilter(v, a);
    case kFormat: {
      if (!v.is_string()) {
        return absl::InvalidArgumentError("format filter needs a format string");
      }
      if (!a.kwargs.empty()) {
        std::vector<std::pair<Value, Value>> items;
        for (const auto& [k, val] : a.kwargs) items.emplace_back(Value::String(k), val);
        auto d = Value::MakeDict(std::move(items));
        if (!d.ok()) return d.status();
        return PercentFormat(v.as_string(), *d);
      }
      auto t = Value::MakeList(a.args, /*is_tuple=*/true);
      if (!t.ok()) return t.status();
      return PercentFormat(v.as_string(), *t);
    }
    case kIndent: return IndentFilter(v, a);
    case kInt: return IntFilter(v, a);
    case kItems:
      if (auto st = no_args("items"); !st.ok()) return st;
      return ItemsOf(v, ListKind::kGenerator);
    case kJoin: {
      auto p = Bind("join", a, {{"d", Value::String("")}, {"attribute", Value::None()}});
      if (!p.ok()) return p.status();
      const std::string sep = (*p)[0].Str();
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      std::string out;
      for (size_t i = 0; i < items->size(); ++i) {
        Value item = (*items)[i];
        if (!(*p)[1].is_none()) {
          auto got = GetPath(item, (*p)[1]);
          if (!got.ok()) return got.status();
          item = *std::move(got);
        }
        if (i > 0) out += sep;
        out += item.Str();
        if (out.size() > kMaxStringBytes) {
          return absl::InvalidArgumentError("join result too large");
        }
      }
      return Value::String(std::move(out));
    }
    case kList: {
      if (auto st = no_args("list"); !st.ok()) return st;
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      return ListOf(*std::move(items));
    }
    case kLower:
      if (auto st = no_args("lower"); !st.ok()) return st;
      return SameSafety(v, AsciiLower(v.Str()));
    case kUpper:
      if (auto st = no_args("upper"); !st.ok()) return st;
      return SameSafety(v, AsciiUpper(v.Str()));
    case kMap: return MapFilter(v, a);
    case kMax: return MinMaxFilter(v, a, true);
    case kMin: return MinMaxFilter(v, a, false);
    case kReject: return SelectFilter(v, a, false, false);
    case kRejectattr: return SelectFilter(v, a, true, false);
    case kSelect: return SelectFilter(v, a, false, true);
    case kSelectattr: return SelectFilter(v, a, true, true);
    case kReplace: {
      auto p = Bind("replace", a, {{"old", Value()}, {"new", Value()}, {"count", Value::None()}});
      if (!p.ok()) return p.status();
      auto from = StringArg((*p)[0], "replace old");
      if (!from.ok()) return from.status();
      auto to = StringArg((*p)[1], "replace new");
      if (!to.ok()) return to.status();
      int64_t count = -1;
      if (!(*p)[2].is_none()) {
        auto c = ToInt((*p)[2], "replace count");
        if (!c.ok()) return c.status();
        count = *c;
      }
      auto r = PyReplace(v.Str(), *from, *to, count);
      if (!r.ok()) return r.status();
      return Value::String(*std::move(r));
    }
    case kReverse: {
      if (auto st = no_args("reverse"); !st.ok()) return st;
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      std::reverse(items->begin(), items->end());
      if (v.is_string()) {
        std::string out;
        for (const Value& c : *items) out += c.as_string();
        return SameSafety(v, std::move(out));
      }
      return GeneratorOf(*std::move(items));  // reversed(): an iterator.
    }
    case kRound: return RoundFilter(v, a);
    case kSafe:
      if (auto st = no_args("safe"); !st.ok()) return st;
      return Value::SafeString(v.Str());
    case kSort: return SortFilter(v, a);
    case kString:
      if (auto st = no_args("string"); !st.ok()) return st;
      return Value::String(v.Str());
    case kSum: {
      auto p = Bind("sum", a, {{"attribute", Value::None()}, {"start", Value::Int(0)}});
      if (!p.ok()) return p.status();
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      Value total = (*p)[1];
      for (const Value& item : *items) {
        Value x = item;
        if (!(*p)[0].is_none()) {
          auto got = GetPath(item, (*p)[0]);
          if (!got.ok()) return got.status();
          x = *std::move(got);
        }
        auto sum = BinaryOp("+", total, x);
        if (!sum.ok()) return sum.status();
        total = *std::move(sum);
      }
      return total;
    }
    case kTitle: {
      if (auto st = no_args("title"); !st.ok()) return st;
      // Jinja's title filter capitalises each word after runs of [-\s({[<].
      const std::string s = v.Str();
      std::string out;
      bool word_start = true;
      for (char c : s) {
        const bool sep = c == '-' || IsPySpace(c) || c == '(' || c == '{' || c == '[' || c == '<';
        if (sep) {
          out.push_back(c);
          word_start = true;
        } else if (word_start) {
          out.push_back(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
          word_start = false;
        } else {
          out.push_back(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        }
      }
      return Value::String(std::move(out));
    }
    case kTojson: return TojsonFilter(v, a);
    case kTrim: {
      auto p = Bind("trim", a, {{"chars", Value::None()}});
      if (!p.ok()) return p.status();
      return SameSafety(v, PyStrip(v.Str(), (*p)[0], true, true));
    }
    case kUnique: {
      auto p = Bind("unique", a,
                    {{"case_sensitive", Value::Bool(false)}, {"attribute", Value::None()}});
      if (!p.ok()) return p.status();
      auto items = Iterate(v);
      if (!items.ok()) return items.status();
      std::vector<Value> out, seen;
      for (const Value& item : *items) {
        Value key = item;
        if (!(*p)[1].is_none()) {
          auto got = GetPath(item, (*p)[1]);
          if (!got.ok()) return got.status();
          key = *std::move(got);
        }
        key = IgnoreCase(key, (*p)[0].Truthy());
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(key); })) {
          continue;
        }
        seen.push_back(key);
        out.push_back(item);
      }
      return GeneratorOf(std::move(out));
    }
    case kWordcount: {
      if (auto st = no_args("wordcount"); !st.ok()) return st;
      const std::string s = v.Str();
      int64_t n = 0;
      bool in_word = false;
      for (char c : s) {
        const bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                       static_cast<unsigned char>(c) >= 0x80;
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::Int(n);
    }
  }
  return absl::InternalError(absl::StrCat("unknown filter id ", filter));
}

absl::StatusOr<bool> ApplyTest(int test, const Value& v, const CallArgs& a) {
  auto arg = [&]() -> absl::StatusOr<Value> {
    if (a.args.size() != 1 || !a.kwargs.empty()) {
      return absl::InvalidArgumentError("test takes exactly one argument");
    }
    return a.args[0];
  };
  switch (static_cast<Test>(test)) {
    case kTDefined: return !v.is_undefined();
    case kTUndefined: return v.is_undefined();
    case kTNone: return v.is_none();
    case kTBoolean: return v.is_bool();
    case kTFalse: return v.is_bool() && !v.as_bool();
    case kTTrue: return v.is_bool() && v.as_bool();
    case kTInteger: return v.is_int();
    case kTFloat: return v.is_float();
    case kTNumber: return v.is_number();
    case kTString: return v.is_string();
    case kTMapping: return v.is_dict();
    case kTIterable:
      return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    case kTSequence:
      return v.is_string() || (v.is_list() && !v.as_list().lazy()) || v.is_dict() ||
             v.is_undefined();
    case kTCallable: return v.is_callable();
    case kTSameas: {
      auto other = arg();
      if (!other.ok()) return other.status();
      if (v.type() != other->type()) return false;
      if (v.is_none() || v.is_bool() || v.is_undefined()) return v.Equals(*other);
      if (v.is_int()) return v.as_int() == other->as_int();
      return false;
    }
    case kTEq:
    case kTNe: {
      auto other = arg();
      if (!other.ok()) return other.status();
      return v.Equals(*other) == (test == kTEq);
    }
    case kTLt:
    case kTLe:
    case kTGt:
    case kTGe: {
      auto other = arg();
      if (!other.ok()) return other.status();
      auto c = Compare(v, *other, test == kTLt ? "<" : test == kTLe ? "<=" : test == kTGt ? ">" : ">=");
      if (!c.ok()) return c.status();
      return test == kTLt ? *c < 0 : test == kTLe ? *c <= 0 : test == kTGt ? *c > 0 : *c >= 0;
    }
    case kTIn: {
      auto other = arg();
      if (!other.ok()) return other.status();
      return Contains(*other, v);
    }
    case kTOdd:
    case kTEven: {
      auto n = ToInt(v, "odd/even test value");
      if (!n.ok()) return n.status();
      return (((*n % 2) + 2) % 2 == 1) == (test == kTOdd);
    }
    case kTDivisibleby: {
      auto other = arg();
      if (!other.ok()) return other.status();
      auto n = ToInt(v, "divisibleby value");
      if (!n.ok()) return n.status();
      auto d = ToInt(*other, "divisibleby argument");
      if (!d.ok()) return d.status();
      if (*d == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
      if (*d == -1) return true;
      return *n % *d == 0;
    }
    case kTLower:
    case kTUpper: {
      CallArgs none;
      auto r = StringMethod(v.Str(), test == kTLower ? "islower" : "isupper", none);
      if (!r.ok()) return r.status();
      return r->as_bool();
    }
    case kTEscaped: return false;
  }
  return absl::InternalError(absl::StrCat("unknown test id ", test));
}

absl::StatusOr<Value> CallMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& a) {
  if (IsMutatingMethod(name) && (receiver.is_list() || receiver.is_dict())) {
    return absl::InvalidArgumentError(absl::StrCat("access to attribute '", name, "' of '",
                                                   receiver.TypeName(),
                                                   "' object is unsafe."));
  }
  if (receiver.is_string()) {
    auto r = StringMethod(receiver.as_string(), name, a);
    if (r.ok() && receiver.is_safe_string() && r->is_string()) {
      return Value::SafeString(r->as_string());
    }
    return r;
  }
  if (receiver.is_dict()) return DictMethod(receiver, name, a);
  if (receiver.is_list()) {
    auto p = Bind(name, a, {{"value", Value()}});
    if (!p.ok()) return p.status();
    const auto& items = receiver.as_list().items;
    int64_t count = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].Equals((*p)[0])) continue;
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++count;
    }
    if (name == "index") {
      return absl::InvalidArgumentError(absl::StrCat((*p)[0].Repr(), " is not in list"));
    }
    return Value::Int(count);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", receiver.TypeName(), "' object has no method '", name, "'"));
}

bool IsGlobalFunction(absl::string_view name) {
  return name == "range" || name == "namespace" || name == "dict" ||
         name == "raise_exception" || name == "strftime_now";
}

absl::Status RaiseException(absl::string_view message) {
  absl::Status st = absl::InvalidArgumentError(message);
  st.SetPayload(kRaisedPayload, absl::Cord("1"));
  return st;
}

bool IsRaisedException(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

absl::StatusOr<Value> CallGlobal(absl::string_view name, const CallArgs& a, absl::Time now) {
  if (name == "range") {
    if (!a.kwargs.empty() || a.args.empty() || a.args.size() > 3) {
      return absl::InvalidArgumentError("range() takes 1 to 3 integer arguments");
    }
    std::vector<int64_t> n;
    for (const Value& v : a.args) {
      auto i = ToInt(v, "range argument");
      if (!i.ok()) return i.status();
      n.push_back(*i);
    }
    int64_t start = 0, stop = n[0], step = 1;
    if (n.size() >= 2) {
      start = n[0];
      stop = n[1];
    }
    if (n.size() == 3) step = n[2];
    if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
    const double count = step > 0 ? std::ceil((static_cast<double>(stop) - start) / step)
                                  : std::ceil((static_cast<double>(start) - stop) / -step);
    if (count > kMaxRange) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ")."));
    }
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      items.push_back(Value::Int(i));
    }
    return ListOf(std::move(items));
  }
  if (name == "namespace" || name == "dict") {
    std::vector<std::pair<Value, Value>> items;
    if (a.args.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, "() takes at most 1 positional argument"));
    }
    if (a.args.size() == 1) {
      if (!a.args[0].is_dict()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, "() positional argument must be a mapping, not ",
                         a.args[0].TypeName()));
      }
      items = a.args[0].as_dict().items;
    }
    for (const auto& [k, v] : a.kwargs) items.emplace_back(Value::String(k), v);
    auto d = Value::MakeDict(std::move(items));
    if (!d.ok()) return d.status();
    if (name == "dict") return d;
    return Value::MakeNamespace(d->as_dict());
  }
  if (name == "raise_exception") {
    if (a.args.size() != 1) return RaiseException("raise_exception() takes one argument");
    return RaiseException(a.args[0].Str());
  }
  if (name == "strftime_now") {
    if (a.args.size() != 1 || !a.args[0].is_string()) {
      return absl::InvalidArgumentError("strftime_now() takes one format string");
    }
    return Value::String(absl::FormatTime(a.args[0].as_string(), now, absl::LocalTimeZone()));
  }
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a function"));
}

}  // namespace deepinfer::engine::jinja
