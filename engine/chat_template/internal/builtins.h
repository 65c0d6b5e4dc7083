// Jinja2's built-in filters and tests, Python's str/dict/list methods, and the globals Hugging
// Face templates call (range, namespace, dict, raise_exception, strftime_now), with the
// semantics of Jinja 3.1 and of transformers' overrides (its `tojson`).
//
// Filters and tests are looked up by name once, when the template is parsed; unknown names are
// rejected there, so rendering never meets an unknown one.
//
// Thread-safety: stateless functions.
#ifndef DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_BUILTINS_H_
#define DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_BUILTINS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/chat_template/internal/value.h"

namespace deepinfer::engine::jinja {

// Evaluated call arguments.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// Filter/test id for `name`, or -1 when not supported.
int FindFilter(absl::string_view name);
int FindTest(absl::string_view name);

// `input | filter(args)`.
absl::StatusOr<Value> ApplyFilter(int filter, const Value& input, const CallArgs& args);
// `input is test(args)`.
absl::StatusOr<bool> ApplyTest(int test, const Value& input, const CallArgs& args);

// Calls bound method `name` of `receiver` (ops.h HasMethod decides which exist).
absl::StatusOr<Value> CallMethod(const Value& receiver, absl::string_view name,
                                 const CallArgs& args);

// Global functions other than macros. `now` is used by strftime_now.
bool IsGlobalFunction(absl::string_view name);
absl::StatusOr<Value> CallGlobal(absl::string_view name, const CallArgs& args, absl::Time now);

// The status raise_exception(msg) produces; ChatTemplate passes it through unchanged.
absl::Status RaiseException(absl::string_view message);
// Whether `status` came from raise_exception().
bool IsRaisedException(const absl::Status& status);

// Sandbox limit on range() sizes, as Jinja's sandbox (MAX_RANGE).
inline constexpr int64_t kMaxRange = 100000;

}  // namespace deepinfer::engine::jinja

#endif  // DEEPINFER_ENGINE_CHAT_TEMPLATE_INTERNAL_BUILTINS_H_
