// Python semantics of the operators and accesses Jinja2 compiles templates to: arithmetic,
// comparison, membership, `obj.attr` / `obj[key]` / slicing (Jinja's sandboxed getattr and
// getitem), iteration, and the string helpers the filters and methods share.
//
// Errors are kInvalidArgument with Python's wording where it helps ("unsupported operand
// type(s) for -: 'str' and 'int'"). Using an undefined value where Jinja raises UndefinedError
// fails with that undefined value's message ("'foo' is undefined").
//
// Thread-safety: stateless functions.
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_OPS_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_OPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/chat_template/internal/value.h"

namespace deepinfer::engine::jinja {

// Largest string or list any operation may build (hostile templates double strings in loops).
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 22;

// Kinds of Callable values.
enum CallableKind : int {
  kGlobalFunction = 1,  // name = "range", "namespace", ...
  kBoundMethod = 2,     // name = method, bound[0] = receiver.
  kMacro = 3,           // payload = the macro's AST node.
  kLoopCycle = 4,       // bound[0] = loop.index0.
};

// The error Jinja raises when an undefined value is used where a real one is needed.
absl::Status UndefinedError(const Value& undefined);

// Binary operator `op` in {"+", "-", "*", "/", "//", "%", "**"}.
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b);
// Unary "-" or "+".
absl::StatusOr<Value> UnaryOp(absl::string_view op, const Value& a);
// Python ordering: <0, 0, >0. Fails for unorderable types ("'<' not supported between ...").
absl::StatusOr<int> Compare(const Value& a, const Value& b, absl::string_view op);
// Python `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// `obj.name`: a bound method when the type has one by that name (as Python's getattr finds
// methods before Jinja falls back to items), else a dict item / namespace attribute, else
// undefined. Undefined `obj` fails.
absl::StatusOr<Value> GetAttr(const Value& obj, absl::string_view name);
// `obj[key]`: item first, then attribute for string keys, else undefined. Undefined `obj` fails.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]` on strings (by code point) and lists; unset bounds are None.
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step);

// What `for x in v` iterates: list items, dict keys, string code points; undefined is empty.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
// Python len(); undefined has length 0.
absl::StatusOr<int64_t> Length(const Value& v);

// Method names by receiver type, as Python's getattr would find them. Mutating list and dict
// methods are included: calling them fails as in Hugging Face's immutable sandbox.
bool HasMethod(const Value& receiver, absl::string_view name);
// Whether any supported type has a method `name` (for load-time checks of `x.name(...)`).
bool IsKnownMethodName(absl::string_view name);
// Whether calling method `name` would mutate its receiver (refused by the sandbox).
bool IsMutatingMethod(absl::string_view name);

// Converts a Value to an int index argument ("x must be an integer").
absl::StatusOr<int64_t> ToInt(const Value& v, absl::string_view what);

// Python `fmt % args` ("%s", "%d", "%r", "%f", "%(name)s", ...).
absl::StatusOr<Value> PercentFormat(const std::string& fmt, const Value& args);

// markupsafe.escape: & < > " ' as HTML entities.
std::string HtmlEscape(absl::string_view s);

// String helpers with Python's ASCII behaviour.
bool IsPySpace(char c);
std::string PyStrip(absl::string_view s, const Value& chars, bool left, bool right);
std::string AsciiUpper(absl::string_view s);
std::string AsciiLower(absl::string_view s);
std::string PyTitle(absl::string_view s);       // str.title()
std::string PyCapitalize(absl::string_view s);  // str.capitalize()
// str.replace(old, new, count); count < 0 replaces all.
absl::StatusOr<std::string> PyReplace(absl::string_view s, absl::string_view from,
                                      absl::string_view to, int64_t count);
// str.split(sep, maxsplit) / rsplit; sep = None splits on whitespace runs.
absl::StatusOr<std::vector<std::string>> PySplit(absl::string_view s, const Value& sep,
                                                 int64_t maxsplit, bool from_right);

}  // namespace deepinfer::engine::jinja

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_OPS_H_
