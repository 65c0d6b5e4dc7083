#include "engine/chat_template/internal/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"

namespace deepinfer::engine::jinja {
namespace {

int ChildDepth(const Value& v) { return v.depth(); }

absl::Status DepthError() {
  return absl::InvalidArgumentError(
      absl::StrCat("value nesting deeper than ", kMaxValueDepth, " levels"));
}

// Decodes the code point at s[i], sets *len to its byte length (1 for invalid bytes).
uint32_t DecodeUtf8(absl::string_view s, size_t i, size_t* len) {
  const unsigned char c = s[i];
  int n = 0;
  uint32_t cp = 0;
  if (c < 0x80) {
    *len = 1;
    return c;
  } else if ((c & 0xE0) == 0xC0) {
    n = 1;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 2;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 3;
    cp = c & 0x07;
  } else {
    *len = 1;
    return 0xFFFD;
  }
  for (int k = 1; k <= n; ++k) {
    if (i + k >= s.size()) {
      *len = 1;
      return 0xFFFD;
    }
    const unsigned char cc = s[i + k];
    if ((cc & 0xC0) != 0x80) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  *len = n + 1;
  return cp;
}

void AppendHex(std::string* out, const char* prefix, uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%0*x", digits, v);
  absl::StrAppend(out, prefix, buf);
}

std::string ReprString(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const uint32_t cp = DecodeUtf8(s, i, &len);
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xA0) || cp == 0xAD) {
      AppendHex(&out, "\\x", cp, 2);
    } else if ((cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 ||
               cp == 0xFEFF) {
      AppendHex(&out, "\\u", cp, 4);
    } else {
      out.append(s.data() + i, len);
    }
    i += len;
  }
  out += quote;
  return out;
}

void AppendJsonString(std::string* out, absl::string_view s, bool ensure_ascii) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20) {
            AppendHex(out, "\\u", c, 4);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp = DecodeUtf8(s, i, &len);
    if (!ensure_ascii) {
      out->append(s.data() + i, len);
    } else if (cp >= 0x10000) {
      cp -= 0x10000;
      AppendHex(out, "\\u", 0xD800 + (cp >> 10), 4);
      AppendHex(out, "\\u", 0xDC00 + (cp & 0x3FF), 4);
    } else {
      AppendHex(out, "\\u", cp, 4);
    }
    i += len;
  }
  out->push_back('"');
}

absl::StatusOr<std::string> JsonKey(const Value& k) {
  switch (k.type()) {
    case Value::Type::kString: return k.as_string();
    case Value::Type::kInt: return absl::StrCat(k.as_int());
    case Value::Type::kBool: return std::string(k.as_bool() ? "true" : "false");
    case Value::Type::kNone: return std::string("null");
    case Value::Type::kFloat: return FormatPythonFloat(k.as_double());
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "tojson: keys must be str, int, float, bool or None, not ", k.TypeName()));
  }
}

absl::Status AppendJson(std::string* out, const Value& v, const JsonOptions& o, int level) {
  const std::string item_sep = o.has_separators ? o.item_separator : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) out->append(o.indent);
  };
  switch (v.type()) {
    case Value::Type::kNone: *out += "null"; return absl::OkStatus();
    case Value::Type::kBool: *out += v.as_bool() ? "true" : "false"; return absl::OkStatus();
    case Value::Type::kInt: absl::StrAppend(out, v.as_int()); return absl::OkStatus();
    case Value::Type::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FormatPythonFloat(d);
      }
      return absl::OkStatus();
    }
    case Value::Type::kString: AppendJsonString(out, v.as_string(), o.ensure_ascii);
      return absl::OkStatus();
    case Value::Type::kList: {
      if (v.as_list().lazy()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
      }
      const auto& items = v.as_list().items;
      if (items.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        if (o.has_indent) newline(level + 1);
        auto st = AppendJson(out, items[i], o, level + 1);
        if (!st.ok()) return st;
      }
      if (o.has_indent) newline(level);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Type::kDict: {
      const auto& items = v.as_dict().items;
      if (items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      entries.reserve(items.size());
      for (const auto& [k, val] : items) {
        auto key = JsonKey(k);
        if (!key.ok()) return key.status();
        entries.emplace_back(*std::move(key), &val);
      }
      if (o.sort_keys) {
        for (const auto& [k, val] : items) {
          if (!k.is_string()) {
            return absl::InvalidArgumentError("tojson: sort_keys needs all keys to be strings");
          }
        }
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) *out += item_sep;
        if (o.has_indent) newline(level + 1);
        AppendJsonString(out, entries[i].first, o.ensure_ascii);
        *out += key_sep;
        auto st = AppendJson(out, *entries[i].second, o, level + 1);
        if (!st.ok()) return st;
      }
      if (o.has_indent) newline(level);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Type::kUndefined:
      return absl::InvalidArgumentError("tojson: Object of type Undefined is not JSON serializable");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
  }
}

}  // namespace

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (k.Equals(key)) return &v;
  }
  return nullptr;
}

const Value* Dict::FindStr(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

absl::StatusOr<Value> Value::MakeList(std::vector<Value> items, bool is_tuple) {
  return MakeLazy(std::move(items), is_tuple ? ListKind::kTuple : ListKind::kList);
}

absl::StatusOr<Value> Value::MakeLazy(std::vector<Value> items, ListKind kind) {
  auto list = std::make_shared<List>();
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, ChildDepth(v));
  if (depth + 1 > kMaxValueDepth) return DepthError();
  list->depth = depth + 1;
  list->items = std::move(items);
  list->is_tuple = kind == ListKind::kTuple;
  list->kind = kind;
  Value v(Type::kList);
  v.ptr_ = std::move(list);
  return v;
}

absl::StatusOr<Value> Value::MakeDict(std::vector<std::pair<Value, Value>> items,
                                      bool keys_unique) {
  auto dict = std::make_shared<Dict>();
  int depth = 0;
  if (keys_unique) {
    for (const auto& [k, val] : items) depth = std::max({depth, ChildDepth(k), ChildDepth(val)});
    dict->items = std::move(items);
    items.clear();
  }
  for (auto& [k, val] : items) {
    depth = std::max({depth, ChildDepth(k), ChildDepth(val)});
    bool replaced = false;
    for (auto& [ek, ev] : dict->items) {
      if (ek.Equals(k)) {  // Python keeps the first key's position and the last value.
        ev = std::move(val);
        replaced = true;
        break;
      }
    }
    if (!replaced) dict->items.emplace_back(std::move(k), std::move(val));
  }
  if (depth + 1 > kMaxValueDepth) return DepthError();
  dict->depth = depth + 1;
  Value v(Type::kDict);
  v.ptr_ = std::move(dict);
  return v;
}

namespace {

absl::StatusOr<Value> FromJsonImpl(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxValueDepth) return DepthError();
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        auto v = FromJsonImpl(e, depth + 1);
        if (!v.ok()) return v.status();
        items.push_back(*std::move(v));
      }
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        auto v = FromJsonImpl(it.value(), depth + 1);
        if (!v.ok()) return v.status();
        items.emplace_back(Value::String(it.key()), *std::move(v));
      }
      return Value::MakeDict(std::move(items), /*keys_unique=*/true);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported JSON value of type ", j.type_name()));
  }
}

}  // namespace

absl::StatusOr<Value> Value::FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j, 0); }

const std::string& Value::undefined_name() const {
  static const std::string* const kEmpty = new std::string();
  return ptr_ ? as_string() : *kEmpty;
}

int Value::depth() const {
  if (type_ == Type::kList) return as_list().depth;
  if (type_ == Type::kDict) return as_dict().depth;
  return 0;
}

bool Value::Truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone: return false;
    case Type::kBool:
    case Type::kInt: return num_.i != 0;
    case Type::kFloat: return num_.d != 0;
    case Type::kString: return !as_string().empty();
    case Type::kList:
      return as_list().kind == ListKind::kGenerator || !as_list().items.empty();
    case Type::kDict: return !as_dict().items.empty();
    default: return true;
  }
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_double() == other.as_double();
    return num_.i == other.num_.i;
  }
  if (type_ != other.type_) return false;
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone: return true;
    case Type::kString: return as_string() == other.as_string();
    case Type::kList: {
      const auto& a = as_list().items;
      const auto& b = other.as_list().items;
      if (as_list().lazy() || other.as_list().lazy()) return ptr_ == other.ptr_;
      if (as_list().is_tuple != other.as_list().is_tuple || a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].Equals(b[i])) return false;
      }
      return true;
    }
    case Type::kDict: {
      if (as_dict().items.size() != other.as_dict().items.size()) return false;
      for (const auto& [k, v] : as_dict().items) {
        const Value* ov = other.as_dict().Find(k);
        if (ov == nullptr || !v.Equals(*ov)) return false;
      }
      return true;
    }
    case Type::kNamespace:
    case Type::kCallable: return ptr_ == other.ptr_;
    default: return false;
  }
}

std::string Value::Str() const {
  switch (type_) {
    case Type::kUndefined: return "";
    case Type::kString: return as_string();
    default: return Repr();
  }
}

namespace {
// Containers whose Repr is in progress on this thread: a container that holds itself (a namespace
// attribute set to the namespace, or to a list holding it; the sandbox keeps lists and dicts
// from being mutated) prints as Python prints a recursive container, "[...]" / "{...}", instead
// of recursing until the stack runs out.
thread_local std::vector<const void*> repr_in_progress;

class ReprGuard {
 public:
  // nullptr (a scalar): no-op.
  explicit ReprGuard(const void* container) {
    if (container == nullptr) return;
    for (const void* p : repr_in_progress) cycle_ = cycle_ || p == container;
    pushed_ = !cycle_;
    if (pushed_) repr_in_progress.push_back(container);
  }
  ~ReprGuard() {
    if (pushed_) repr_in_progress.pop_back();
  }
  ReprGuard(const ReprGuard&) = delete;
  ReprGuard& operator=(const ReprGuard&) = delete;
  bool cycle() const { return cycle_; }

 private:
  bool cycle_ = false;
  bool pushed_ = false;
};
}  // namespace

std::string Value::Repr() const {
  const bool container = type_ == Type::kList || type_ == Type::kDict || type_ == Type::kNamespace;
  ReprGuard guard(container ? ptr_.get() : nullptr);
  if (container && guard.cycle()) {
    if (type_ == Type::kList) return as_list().is_tuple ? "(...)" : "[...]";
    return type_ == Type::kDict ? "{...}" : "<Namespace {...}>";
  }
  switch (type_) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "None";
    case Type::kBool: return num_.i ? "True" : "False";
    case Type::kInt: return absl::StrCat(num_.i);
    case Type::kFloat: return FormatPythonFloat(num_.d);
    case Type::kString: return ReprString(as_string());
    case Type::kList: {
      if (as_list().kind == ListKind::kGenerator) return "<generator object>";
      std::string out = as_list().lazy() ? absl::StrCat(TypeName(), "([") : "";
      if (as_list().lazy()) {
        for (size_t i = 0; i < as_list().items.size(); ++i) {
          if (i > 0) out += ", ";
          out += as_list().items[i].Repr();
        }
        return out + "])";
      }
      out = as_list().is_tuple ? "(" : "[";
      for (size_t i = 0; i < as_list().items.size(); ++i) {
        if (i > 0) out += ", ";
        out += as_list().items[i].Repr();
      }
      if (as_list().is_tuple && as_list().items.size() == 1) out += ",";
      out += as_list().is_tuple ? ")" : "]";
      return out;
    }
    case Type::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < as_dict().items.size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, as_dict().items[i].first.Repr(), ": ", as_dict().items[i].second.Repr());
      }
      return out + "}";
    }
    case Type::kNamespace: {
      std::string out = "<Namespace {";
      for (size_t i = 0; i < as_namespace().attrs.items.size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, as_namespace().attrs.items[i].first.Repr(), ": ",
                        as_namespace().attrs.items[i].second.Repr());
      }
      return out + "}>";
    }
    case Type::kCallable: return absl::StrCat("<function ", as_callable().name, ">");
  }
  return "";
}

const char* Value::TypeName() const {
  switch (type_) {
    case Type::kUndefined: return "Undefined";
    case Type::kNone: return "NoneType";
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "str";
    case Type::kList:
      switch (as_list().kind) {
        case ListKind::kList: return "list";
        case ListKind::kTuple: return "tuple";
        case ListKind::kGenerator: return "generator";
        case ListKind::kDictItems: return "dict_items";
        case ListKind::kDictKeys: return "dict_keys";
        case ListKind::kDictValues: return "dict_values";
      }
      return "list";
    case Type::kDict: return "dict";
    case Type::kNamespace: return "Namespace";
    case Type::kCallable: return "function";
  }
  return "object";
}

std::string FormatPythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci looks like "-1.2345e+05": split sign, digits and exponent.
  std::string sign;
  size_t pos = 0;
  if (sci[0] == '-') {
    sign = "-";
    pos = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp = std::atoi(sci.c_str() + e + 1);
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return sign + mant + ebuf;
}

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  auto st = AppendJson(&out, v, options, 0);
  if (!st.ok()) return st;
  return out;
}

std::vector<size_t> CodePointOffsets(absl::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    out.push_back(i);
    size_t len;
    DecodeUtf8(s, i, &len);
    i += len;
  }
  return out;
}

size_t CodePointCount(absl::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    DecodeUtf8(s, i, &len);
    i += len;
    ++n;
  }
  return n;
}

}  // namespace deepinfer::engine::jinja
