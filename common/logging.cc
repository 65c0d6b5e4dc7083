#include "common/logging.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace deepinfer {

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(absl::string_view name,
                                                        absl::string_view flag_name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "trace") return spdlog::level::trace;
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warn" || lower == "warning") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  if (lower == "critical") return spdlog::level::critical;
  if (lower == "off") return spdlog::level::off;
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag_name, ": expected one of trace, debug, info, warn, error, ",
                   "critical, off; got \"", name, "\""));
}

absl::Status InitLogging(absl::string_view component, absl::string_view level) {
  DI_ASSIGN_OR_RETURN(spdlog::level::level_enum parsed, ParseLogLevel(level));
  auto logger = spdlog::stderr_color_mt(std::string(component));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %L %n[%P:%t] %v", spdlog::pattern_time_type::utc);
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace deepinfer
