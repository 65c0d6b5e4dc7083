#include "common/flags.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

absl::Status Invalid(absl::string_view flag_name, absl::string_view expected,
                     absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag_name, ": expected ", expected, "; got \"", value, "\""));
}

}  // namespace

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view flag_name, absl::string_view value,
                                       bool allow_port_zero) {
  constexpr absl::string_view kExpected = "host:port, [ipv6]:port or :port";
  HostPort out;
  absl::string_view port_text;
  if (!value.empty() && value.front() == '[') {
    const size_t close = value.find(']');
    if (close == absl::string_view::npos || close + 1 >= value.size() || value[close + 1] != ':') {
      return Invalid(flag_name, kExpected, value);
    }
    out.host = std::string(value.substr(1, close - 1));
    port_text = value.substr(close + 2);
  } else {
    const size_t colon = value.rfind(':');
    if (colon == absl::string_view::npos) return Invalid(flag_name, kExpected, value);
    out.host = std::string(value.substr(0, colon));
    if (out.host.find(':') != std::string::npos) {
      return Invalid(flag_name, "IPv6 hosts in brackets, [ipv6]:port", value);
    }
    port_text = value.substr(colon + 1);
  }
  if (out.host.empty()) out.host = "0.0.0.0";
  uint32_t port = 0;
  if (port_text.empty() || !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return Invalid(flag_name, "a port in 0..65535", value);
  }
  if (port == 0 && !allow_port_zero) {
    return Invalid(flag_name, "a port in 1..65535", value);
  }
  out.port = static_cast<uint16_t>(port);
  return out;
}

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view flag_name, absl::string_view value) {
  constexpr absl::string_view kExpected =
      "a byte count with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)";
  size_t digits = 0;
  while (digits < value.size() && absl::ascii_isdigit(static_cast<unsigned char>(value[digits]))) {
    ++digits;
  }
  uint64_t number = 0;
  if (digits == 0 || !absl::SimpleAtoi(value.substr(0, digits), &number)) {
    return Invalid(flag_name, kExpected, value);
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value.substr(digits)));
  uint64_t scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "kib") scale = 1ull << 10;
  else if (unit == "mib") scale = 1ull << 20;
  else if (unit == "gib") scale = 1ull << 30;
  else if (unit == "tib") scale = 1ull << 40;
  else if (unit == "kb") scale = 1000ull;
  else if (unit == "mb") scale = 1000ull * 1000;
  else if (unit == "gb") scale = 1000ull * 1000 * 1000;
  else if (unit == "tb") scale = 1000ull * 1000 * 1000 * 1000;
  else return Invalid(flag_name, kExpected, value);
  if (number > std::numeric_limits<uint64_t>::max() / scale) {
    return Invalid(flag_name, "a size below 2^64 bytes", value);
  }
  return number * scale;
}

}  // namespace deepinfer
