#include "engine/chat_template/internal/ops.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer::engine::jinja {
namespace {

absl::Status TypeError(absl::string_view msg) { return absl::InvalidArgumentError(msg); }

absl::Status OperandError(absl::string_view op, const Value& a, const Value& b) {
  return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                "' and '", b.TypeName(), "'"));
}

absl::Status Overflow() { return absl::InvalidArgumentError("integer overflow"); }

absl::Status TooLarge() {
  return absl::InvalidArgumentError(
      absl::StrCat("result larger than the limit of ", kMaxStringBytes, " bytes"));
}

bool IsIntLike(const Value& v) { return v.is_int() || v.is_bool(); }

std::string ObjectName(const Value& v) { return absl::StrCat(v.TypeName(), " object"); }

Value MissingAttr(const Value& obj, absl::string_view name) {
  return Value::Undefined(absl::StrCat("'", ObjectName(obj), "' has no attribute '", name, "'"));
}

Value MissingItem(const Value& obj, const Value& key) {
  if (key.is_string()) return MissingAttr(obj, key.as_string());
  return Value::Undefined(absl::StrCat("'", ObjectName(obj), "' has no element ", key.Repr()));
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(n) > kMaxStringBytes / s.size()) return TooLarge();
    std::string out;
    out.reserve(s.size() * n);
    for (int64_t i = 0; i < n; ++i) out += s;
    return seq.is_safe_string() ? Value::SafeString(std::move(out)) : Value::String(std::move(out));
  }
  const auto& items = seq.as_list().items;
  if (!items.empty() && static_cast<uint64_t>(n) > kMaxListItems / items.size()) {
    return absl::InvalidArgumentError("list larger than the item limit");
  }
  std::vector<Value> out;
  out.reserve(items.size() * n);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::MakeList(std::move(out), seq.as_list().is_tuple);
}

double PyFloatMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

constexpr absl::string_view kStringMethods[] = {
    "strip",   "lstrip",  "rstrip",  "split",        "rsplit",       "splitlines",
    "startswith", "endswith", "upper", "lower",     "replace",      "title",
    "capitalize", "swapcase", "find",  "rfind",     "count",        "join",
    "isdigit", "isalpha", "isalnum", "isspace",     "isupper",      "islower",
    "format",  "removeprefix", "removesuffix"};
constexpr absl::string_view kDictMethods[] = {"get", "items", "keys", "values"};
constexpr absl::string_view kListMethods[] = {"index", "count"};
constexpr absl::string_view kMutatingDictMethods[] = {"pop", "popitem", "update", "setdefault",
                                                      "clear"};
constexpr absl::string_view kMutatingListMethods[] = {"append", "extend", "insert", "pop",
                                                      "remove", "clear",  "sort",   "reverse"};

template <size_t N>
bool In(const absl::string_view (&table)[N], absl::string_view name) {
  return std::find(std::begin(table), std::end(table), name) != std::end(table);
}

}  // namespace

absl::Status UndefinedError(const Value& undefined) {
  const std::string& hint = undefined.undefined_name();
  return absl::InvalidArgumentError(hint.empty() ? "value is undefined" : hint);
}

bool HasMethod(const Value& receiver, absl::string_view name) {
  switch (receiver.type()) {
    case Value::Type::kString: return In(kStringMethods, name);
    case Value::Type::kDict: return In(kDictMethods, name) || In(kMutatingDictMethods, name);
    case Value::Type::kList:
      if (receiver.as_list().lazy()) return false;
      return In(kListMethods, name) ||
             (!receiver.as_list().is_tuple && In(kMutatingListMethods, name));
    default: return false;
  }
}

bool IsKnownMethodName(absl::string_view name) {
  return In(kStringMethods, name) || In(kDictMethods, name) || In(kListMethods, name) ||
         In(kMutatingDictMethods, name) || In(kMutatingListMethods, name);
}

bool IsMutatingMethod(absl::string_view name) {
  return In(kMutatingDictMethods, name) || In(kMutatingListMethods, name);
}

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = IsIntLike(a) && IsIntLike(b);
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > kMaxStringBytes / 6) {
        if (a.as_string().size() + b.as_string().size() > kMaxStringBytes) return TooLarge();
      }
      if (a.is_safe_string() || b.is_safe_string()) {  // Markup escapes the plain operand.
        const std::string x = a.is_safe_string() ? a.as_string() : HtmlEscape(a.as_string());
        const std::string y = b.is_safe_string() ? b.as_string() : HtmlEscape(b.as_string());
        if (x.size() + y.size() > kMaxStringBytes) return TooLarge();
        return Value::SafeString(x + y);
      }
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && !a.as_list().lazy() && !b.as_list().lazy() &&
        a.as_list().is_tuple == b.as_list().is_tuple) {
      if (a.as_list().items.size() + b.as_list().items.size() > kMaxListItems) {
        return absl::InvalidArgumentError("list larger than the item limit");
      }
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::MakeList(std::move(items), a.as_list().is_tuple);
    }
    return OperandError(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_double() - b.as_double());
    return OperandError(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
      return Value::Int(r);
    }
    if (nums) return Value::Float(a.as_double() * b.as_double());
    auto repeatable = [](const Value& v) {
      return v.is_string() || (v.is_list() && !v.as_list().lazy());
    };
    if (repeatable(a) && IsIntLike(b)) return Repeat(a, b.as_int());
    if (repeatable(b) && IsIntLike(a)) return Repeat(b, a.as_int());
    return OperandError(op, a, b);
  }
  if (op == "/") {
    if (!nums) return OperandError(op, a, b);
    if (b.as_double() == 0) return absl::InvalidArgumentError("division by zero");
    return Value::Float(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!nums) return OperandError(op, a, b);
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return Overflow();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::Int(q);
    }
    if (b.as_double() == 0) return absl::InvalidArgumentError("float floor division by zero");
    return Value::Float(std::floor(a.as_double() / b.as_double()));
  }
  if (op == "%") {
    if (a.is_safe_string()) {  // Markup % args escapes the arguments.
      Value escaped = b;
      if (b.is_string() && !b.is_safe_string()) {
        escaped = Value::String(HtmlEscape(b.as_string()));
      } else if (b.is_list() && b.as_list().is_tuple) {
        std::vector<Value> items;
        for (const Value& x : b.as_list().items) {
          items.push_back(x.is_string() && !x.is_safe_string()
                              ? Value::String(HtmlEscape(x.as_string())) : x);
        }
        auto t = Value::MakeList(std::move(items), true);
        if (!t.ok()) return t.status();
        escaped = *std::move(t);
      }
      auto r = PercentFormat(a.as_string(), escaped);
      if (!r.ok()) return r.status();
      return Value::SafeString(r->as_string());
    }
    if (a.is_string()) return PercentFormat(a.as_string(), b);
    if (!nums) return OperandError(op, a, b);
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) return absl::InvalidArgumentError("integer division or modulo by zero");
      if (y == -1) return Value::Int(0);
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Int(m);
    }
    if (b.as_double() == 0) return absl::InvalidArgumentError("float modulo");
    return Value::Float(PyFloatMod(a.as_double(), b.as_double()));
  }
  if (op == "**") {
    if (!nums) return OperandError(op, a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), exp = b.as_int(), r = 1;
      while (exp > 0) {
        if (exp & 1) {
          if (__builtin_mul_overflow(r, base, &r)) return Overflow();
        }
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
      }
      return Value::Int(r);
    }
    if (a.as_double() == 0 && b.as_double() < 0) {
      return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
    }
    return Value::Float(std::pow(a.as_double(), b.as_double()));
  }
  return absl::InternalError(absl::StrCat("unknown operator ", op));
}

absl::StatusOr<Value> UnaryOp(absl::string_view op, const Value& a) {
  if (a.is_undefined()) return UndefinedError(a);
  if (IsIntLike(a)) {
    if (op == "+") return Value::Int(a.as_int());
    if (a.as_int() == INT64_MIN) return Overflow();
    return Value::Int(-a.as_int());
  }
  if (a.is_float()) return Value::Float(op == "+" ? a.as_double() : -a.as_double());
  return TypeError(absl::StrCat("bad operand type for unary ", op, ": '", a.TypeName(), "'"));
}

absl::StatusOr<int> Compare(const Value& a, const Value& b, absl::string_view op) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    if (IsIntLike(a) && IsIntLike(b)) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && !a.as_list().lazy() && !b.as_list().lazy() &&
      a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i].Equals(y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return TypeError(absl::StrCat("'", op, "' not supported between instances of '", a.TypeName(),
                                "' and '", b.TypeName(), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) return UndefinedError(item);
        return TypeError(absl::StrCat("'in <string>' requires string as left operand, not ",
                                      item.TypeName()));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::kList:
      for (const Value& v : container.as_list().items) {
        if (v.Equals(item)) return true;
      }
      return false;
    case Value::Type::kDict: return container.as_dict().Find(item) != nullptr;
    case Value::Type::kUndefined: return false;
    default:
      return TypeError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (HasMethod(obj, name)) {
    Callable c;
    c.kind = kBoundMethod;
    c.name = std::string(name);
    c.bound.push_back(obj);
    return Value::MakeCallable(std::move(c));
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().FindStr(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.as_namespace().attrs.FindStr(name)) return *v;
  }
  return MissingAttr(obj, name);
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().Find(key)) return *v;
  } else if (obj.is_list() && IsIntLike(key) && !obj.as_list().lazy()) {
    const auto& items = obj.as_list().items;
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[i];
    return MissingItem(obj, key);
  } else if (obj.is_string() && IsIntLike(key)) {
    const std::string& s = obj.as_string();
    const std::vector<size_t> offsets = CodePointOffsets(s);
    int64_t i = key.as_int();
    if (i < 0) i += static_cast<int64_t>(offsets.size());
    if (i >= 0 && i < static_cast<int64_t>(offsets.size())) {
      const size_t end = i + 1 < static_cast<int64_t>(offsets.size()) ? offsets[i + 1] : s.size();
      return Value::String(s.substr(offsets[i], end - offsets[i]));
    }
    return MissingItem(obj, key);
  }
  if (key.is_string()) return GetAttr(obj, key.as_string());
  return MissingItem(obj, key);
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto bound = [](const Value& v, const char* what) -> absl::StatusOr<std::optional<int64_t>> {
    if (v.is_none() || v.is_undefined()) return std::optional<int64_t>();
    if (!IsIntLike(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("slice ", what, " must be an integer or None, not ", v.TypeName()));
    }
    return std::optional<int64_t>(v.as_int());
  };
  auto b0 = bound(start, "start");
  if (!b0.ok()) return b0.status();
  auto b1 = bound(stop, "stop");
  if (!b1.ok()) return b1.status();
  auto b2 = bound(step, "step");
  if (!b2.ok()) return b2.status();
  const int64_t st = b2->value_or(1);
  if (st == 0) return absl::InvalidArgumentError("slice step cannot be zero");

  std::vector<size_t> offsets;
  int64_t n;
  if (obj.is_string()) {
    offsets = CodePointOffsets(obj.as_string());
    n = static_cast<int64_t>(offsets.size());
  } else if (obj.is_list() && !obj.as_list().lazy()) {
    n = static_cast<int64_t>(obj.as_list().items.size());
  } else {
    return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
  }
  // Python's slice.indices().
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) -> int64_t {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = clamp(*b0, st < 0 ? n - 1 : 0);
  const int64_t hi = clamp(*b1, st < 0 ? -1 : n);
  std::vector<int64_t> picks;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) picks.push_back(i);
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    std::string out;
    for (int64_t i : picks) {
      const size_t end = i + 1 < n ? offsets[i + 1] : s.size();
      out.append(s, offsets[i], end - offsets[i]);
    }
    return Value::String(std::move(out));
  }
  std::vector<Value> out;
  out.reserve(picks.size());
  for (int64_t i : picks) out.push_back(obj.as_list().items[i]);
  return Value::MakeList(std::move(out), obj.as_list().is_tuple);
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kList: return v.as_list().items;
    case Value::Type::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& [k, val] : v.as_dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Type::kString: {
      const std::string& s = v.as_string();
      const std::vector<size_t> offsets = CodePointOffsets(s);
      std::vector<Value> chars;
      chars.reserve(offsets.size());
      for (size_t i = 0; i < offsets.size(); ++i) {
        const size_t end = i + 1 < offsets.size() ? offsets[i + 1] : s.size();
        chars.push_back(Value::String(s.substr(offsets[i], end - offsets[i])));
      }
      return chars;
    }
    case Value::Type::kUndefined: return std::vector<Value>();
    default:
      return TypeError(absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.type()) {
    case Value::Type::kString: return static_cast<int64_t>(CodePointCount(v.as_string()));
    case Value::Type::kList:
      if (v.as_list().kind == ListKind::kGenerator) {
        return TypeError("object of type 'generator' has no len()");
      }
      return static_cast<int64_t>(v.as_list().items.size());
    case Value::Type::kDict: return static_cast<int64_t>(v.as_dict().items.size());
    case Value::Type::kUndefined: return 0;
    default: return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

absl::StatusOr<int64_t> ToInt(const Value& v, absl::string_view what) {
  if (IsIntLike(v)) return v.as_int();
  if (v.is_undefined()) return UndefinedError(v);
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be an integer, not ", v.TypeName()));
}

absl::StatusOr<Value> PercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_list() && args.as_list().is_tuple) {
    positional = args.as_list().items;
  } else {
    if (args.is_dict()) mapping = &args;
    positional.push_back(args);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return absl::InvalidArgumentError("incomplete format");
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos || mapping == nullptr) {
        return absl::InvalidArgumentError("format requires a mapping");
      }
      const Value* v = mapping->as_dict().FindStr(fmt.substr(i + 1, close - i - 1));
      if (v == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("format key '", fmt.substr(i + 1, close - i - 1), "' not found"));
      }
      arg = v;
      used_mapping = true;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
      spec.push_back(fmt[i++]);
    }
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
      spec.push_back(fmt[i++]);
    }
    if (i < fmt.size() && fmt[i] == '.') {
      spec.push_back(fmt[i++]);
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        spec.push_back(fmt[i++]);
      }
    }
    if (i >= fmt.size()) return absl::InvalidArgumentError("incomplete format");
    const char conv = fmt[i];
    if (conv == '%' && spec == "%") {
      out.push_back('%');
      continue;
    }
    if (arg == nullptr) {
      if (next >= positional.size()) {
        return absl::InvalidArgumentError("not enough arguments for format string");
      }
      arg = &positional[next++];
    }
    if (spec.size() > 12) return absl::InvalidArgumentError("format spec too long");
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        spec.push_back('s');
        const std::string s = conv == 's' ? arg->Str() : arg->Repr();
        if (spec == "%s") {
          out += s;
        } else {
          std::snprintf(buf, sizeof(buf), spec.c_str(), s.substr(0, 256).c_str());
          out += buf;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!arg->is_number()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "%", std::string(1, conv), " format: a real number is required, not ",
              arg->TypeName()));
        }
        const long long v = arg->is_float() ? static_cast<long long>(arg->as_double())
                                            : static_cast<long long>(arg->as_int());
        spec += "ll";
        spec.push_back(conv == 'i' ? 'd' : conv);
        std::snprintf(buf, sizeof(buf), spec.c_str(), v);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg->is_number()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "%", std::string(1, conv), " format: a real number is required, not ",
              arg->TypeName()));
        }
        spec.push_back(conv);
        std::snprintf(buf, sizeof(buf), spec.c_str(), arg->as_double());
        out += buf;
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported format character '", std::string(1, conv), "'"));
    }
    if (out.size() > kMaxStringBytes) return TooLarge();
  }
  if (!used_mapping && mapping == nullptr && next < positional.size()) {
    return absl::InvalidArgumentError("not all arguments converted during string formatting");
  }
  return Value::String(std::move(out));
}

std::string HtmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

bool IsPySpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= '\x1c' && c <= '\x1f');
}

std::string PyStrip(absl::string_view s, const Value& chars, bool left, bool right) {
  const bool custom = chars.is_string();
  auto strip = [&](char c) {
    return custom ? chars.as_string().find(c) != std::string::npos : IsPySpace(c);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && strip(s[b])) ++b;
  }
  if (right) {
    while (e > b && strip(s[e - 1])) --e;
  }
  return std::string(s.substr(b, e - b));
}

std::string AsciiUpper(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = c - 'a' + 'A';
  }
  return out;
}

std::string AsciiLower(absl::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = c - 'A' + 'a';
  }
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z';
    const bool upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = c - 'a' + 'A';
    if (upper && prev_cased) c = c - 'A' + 'a';
    prev_cased = lower || upper || (static_cast<unsigned char>(c) >= 0x80);
  }
  return out;
}

std::string PyCapitalize(absl::string_view s) {
  std::string out = AsciiLower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = out[0] - 'a' + 'A';
  return out;
}

absl::StatusOr<std::string> PyReplace(absl::string_view s, absl::string_view from,
                                      absl::string_view to, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (from.empty()) {
    const std::vector<size_t> offsets = CodePointOffsets(s);
    for (size_t i = 0; i <= offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(to.data(), to.size());
        ++done;
      }
      if (i < offsets.size()) {
        const size_t end = i + 1 < offsets.size() ? offsets[i + 1] : s.size();
        out.append(s.data() + offsets[i], end - offsets[i]);
      }
      if (out.size() > kMaxStringBytes) return TooLarge();
    }
    return out;
  }
  size_t pos = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, pos);
    if (at == absl::string_view::npos) break;
    out.append(s.data() + pos, at - pos);
    out.append(to.data(), to.size());
    pos = at + from.size();
    ++done;
    if (out.size() > kMaxStringBytes) return TooLarge();
  }
  out.append(s.data() + pos, s.size() - pos);
  if (out.size() > kMaxStringBytes) return TooLarge();
  return out;
}

absl::StatusOr<std::vector<std::string>> PySplit(absl::string_view s, const Value& sep,
                                                 int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < s.size() && IsPySpace(s[i])) ++i;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
          size_t e = s.size();
          while (e > i && IsPySpace(s[e - 1])) --e;
          parts.emplace_back(s.substr(i, e - i));
          break;
        }
        size_t j = i;
        while (j < s.size() && !IsPySpace(s[j])) ++j;
        parts.emplace_back(s.substr(i, j - i));
        i = j;
      }
    } else {
      size_t e = s.size();
      while (true) {
        while (e > 0 && IsPySpace(s[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
          size_t b = 0;
          while (b < e && IsPySpace(s[b])) ++b;
          parts.emplace_back(s.substr(b, e - b));
          break;
        }
        size_t b = e;
        while (b > 0 && !IsPySpace(s[b - 1])) --b;
        parts.emplace_back(s.substr(b, e - b));
        e = b;
      }
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  if (!sep.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be str or None, not ", sep.TypeName()));
  }
  const std::string& d = sep.as_string();
  if (d.empty()) return absl::InvalidArgumentError("empty separator");
  if (!from_right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(d, pos);
      if (at == absl::string_view::npos) break;
      parts.emplace_back(s.substr(pos, at - pos));
      pos = at + d.size();
    }
    parts.emplace_back(s.substr(pos));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < d.size()) break;
      const size_t at = s.rfind(d, end - d.size());
      if (at == absl::string_view::npos) break;
      parts.emplace_back(s.substr(at + d.size(), end - at - d.size()));
      end = at;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

}  // namespace deepinfer::engine::jinja
