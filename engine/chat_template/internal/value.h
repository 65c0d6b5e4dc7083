// Runtime values of the chat-template interpreter, modelled on the Python objects Jinja2 works
// with: undefined, None, bool, int, float, str, list/tuple, dict (insertion ordered), a
// `namespace()` object and callables. Containers and strings are shared and immutable once
// built (Hugging Face renders templates in an immutable sandbox); only a namespace's attributes
// can be reassigned. Copying a Value is cheap (shared pointers).
//
// Thread-safety: a Value built during one render is used only by that render; immutable
// containers may be shared read-only across threads.
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_VALUE_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_VALUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine::jinja {

class Value;

// Deepest container nesting a value may have; deeper values are rejected (they could only come
// from hostile input and would make printing and destruction recurse without bound).
inline constexpr int kMaxValueDepth = 256;

// What Python object a List stands for. Jinja's filters return lazy generators and dict
// methods return views; they iterate like lists but are always truthy (generators), have no
// len() (generators), cannot be indexed, and json.dumps refuses them.
enum class ListKind : uint8_t { kList, kTuple, kGenerator, kDictItems, kDictKeys, kDictValues };

struct List {
  std::vector<Value> items;
  bool is_tuple = false;
  ListKind kind = ListKind::kList;
  int depth = 1;  // 1 + the deepest child container's depth.
  // A generator or dict view rather than a real list or tuple.
  bool lazy() const { return kind != ListKind::kList && kind != ListKind::kTuple; }
};

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // Insertion order, unique keys.
  int depth = 1;
  // The value for `key`, or nullptr.
  const Value* Find(const Value& key) const;
  const Value* FindStr(absl::string_view key) const;
};

// A Jinja `namespace()`: the only mutable object.
struct Namespace {
  Dict attrs;
};

// Anything callable: built-in globals, bound methods, macros, loop.cycle. The interpreter gives
// `kind` and `payload` their meaning.
struct Callable {
  int kind = 0;
  std::string name;
  std::shared_ptr<const void> payload;  // e.g. the macro's AST node (owned by the template).
  std::vector<Value> bound;             // e.g. the receiver of a bound method.
};

class Value {
 public:
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                    kCallable };

  Value() = default;  // Undefined.
  static Value Undefined(std::string name = "") {
    Value v;
    v.ptr_ = std::make_shared<const std::string>(std::move(name));
    return v;
  }
  static Value None() { return Value(Type::kNone); }
  static Value Bool(bool b) {
    Value v(Type::kBool);
    v.num_.i = b;
    return v;
  }
  static Value Int(int64_t i) {
    Value v(Type::kInt);
    v.num_.i = i;
    return v;
  }
  static Value Float(double d) {
    Value v(Type::kFloat);
    v.num_.d = d;
    return v;
  }
  static Value String(std::string s) {
    Value v(Type::kString);
    v.ptr_ = std::make_shared<const std::string>(std::move(s));
    return v;
  }
  // A markupsafe.Markup string (from the `safe`/`escape` filters): `+` and `%` with it
  // HTML-escape the plain operand, as in Jinja without autoescaping.
  static Value SafeString(std::string s) {
    Value v = String(std::move(s));
    v.num_.i = 1;
    return v;
  }
  // Fails if a child is nested deeper than kMaxValueDepth.
  static absl::StatusOr<Value> MakeList(std::vector<Value> items, bool is_tuple = false);
  // Any kind of list (see ListKind).
  static absl::StatusOr<Value> MakeLazy(std::vector<Value> items, ListKind kind);
  // `keys_unique` skips the duplicate-key check when the caller guarantees it.
  static absl::StatusOr<Value> MakeDict(std::vector<std::pair<Value, Value>> items,
                                        bool keys_unique = false);
  static Value MakeNamespace(Dict attrs) {
    Value v(Type::kNamespace);
    auto ns = std::make_shared<Namespace>();
    ns->attrs = std::move(attrs);
    v.ptr_ = std::move(ns);
    return v;
  }
  static Value MakeCallable(Callable c) {
    Value v(Type::kCallable);
    v.ptr_ = std::make_shared<const Callable>(std::move(c));
    return v;
  }
  // Converts JSON; objects keep their key order (use ordered_json: nlohmann::json sorts keys).
  static absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& j);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  // Python numbers: bool, int, float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_namespace() const { return type_ == Type::kNamespace; }
  bool is_callable() const { return type_ == Type::kCallable; }
  bool is_safe_string() const { return type_ == Type::kString && num_.i != 0; }

  bool as_bool() const { return num_.i != 0; }
  int64_t as_int() const { return num_.i; }  // Valid for bool and int.
  double as_double() const { return is_float() ? num_.d : static_cast<double>(num_.i); }
  const std::string& as_string() const { return *static_cast<const std::string*>(ptr_.get()); }
  const std::string& undefined_name() const;
  const List& as_list() const { return *static_cast<const List*>(ptr_.get()); }
  const Dict& as_dict() const { return *static_cast<const Dict*>(ptr_.get()); }
  Namespace& as_namespace() const {
    return *const_cast<Namespace*>(static_cast<const Namespace*>(ptr_.get()));
  }
  const Callable& as_callable() const { return *static_cast<const Callable*>(ptr_.get()); }
  int depth() const;  // Container nesting depth, 0 for scalars.

  // Python truthiness.
  bool Truthy() const;
  // Python `==` (1 == 1.0 == True; lists and dicts by content; undefined equals only undefined).
  bool Equals(const Value& other) const;
  // Python str(): what `{{ x }}` prints. Undefined prints as "".
  std::string Str() const;
  // Python repr(): how a value prints inside a list or dict.
  std::string Repr() const;
  // The Python type name, for error messages ("int", "str", "list", ...).
  const char* TypeName() const;

 private:
  explicit Value(Type t) : type_(t) {}

  Type type_ = Type::kUndefined;
  union {
    int64_t i;
    double d;
  } num_ = {0};
  // By type: the string, an undefined value's message, List, Dict, Namespace (the only
  // mutable one) or Callable.
  std::shared_ptr<const void> ptr_;
};

// Python's repr() of a float ("1.0", "1e+16", "0.0001", "1e-05", "inf", "nan").
std::string FormatPythonFloat(double d);

// Options of Hugging Face's `tojson` filter, which is
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
struct JsonOptions {
  bool ensure_ascii = false;
  bool has_indent = false;     // indent=None when false.
  std::string indent;          // The indent unit (an int indent is that many spaces).
  bool has_separators = false;
  std::string item_separator;  // Default ", " without indent, "," with indent.
  std::string key_separator;   // Default ": ".
  bool sort_keys = false;
};

// json.dumps with `options`. Fails for values JSON cannot hold (undefined, namespaces,
// callables) and for dict keys that are not str, int, float, bool or None.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// UTF-8 helpers: Python counts and slices strings by code point. Invalid bytes count as one
// code point each.
std::vector<size_t> CodePointOffsets(absl::string_view s);  // Start of each code point.
size_t CodePointCount(absl::string_view s);

}  // namespace deepinfer::engine::jinja

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_VALUE_H_
