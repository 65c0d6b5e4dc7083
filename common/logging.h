// Process-wide logging set-up on spdlog (STYLE.md 14): one line per event, with the request id
// in every request-scoped line (callers format it in: "[req=...] ...").
//
// Thread-safety: InitLogging is called once from main() before threads start; spdlog's default
// logger is thread-safe afterwards.
#ifndef DEEPINFER_COMMON_LOGGING_H_
#define DEEPINFER_COMMON_LOGGING_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "spdlog/spdlog.h"

namespace deepinfer {

// Parses a level name: trace, debug, info, warn (or warning), error, critical, off.
// Invalid names give kInvalidArgument naming `flag_name` and the accepted values.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name,
                                                        absl::string_view flag_name = "log_level");

// Sets the default logger's level and a pattern with UTC time, level, process component and
// thread id, e.g. "2026-11-29T14:00:00.123Z I router[1234] message".
absl::Status InitLogging(absl::string_view component, absl::string_view level);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_LOGGING_H_
