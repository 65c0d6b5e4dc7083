// Parsers for values that several binaries take as flags. Each returns kInvalidArgument with a
// message naming the flag, what was expected and what was found; binaries print it and exit 2.
#ifndef DEEPINFER_COMMON_FLAGS_H_
#define DEEPINFER_COMMON_FLAGS_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace deepinfer {

struct HostPort {
  std::string host;  // IPv4 literal, hostname, or IPv6 literal without brackets.
  uint16_t port = 0;  // 0 means "let the OS choose" (listen addresses only).

  // "host:port", with brackets around IPv6 literals: a gRPC target or listen address.
  std::string ToString() const;
};

// "host:port", "[v6]:port" or ":port" (host defaults to 0.0.0.0). Port 0..65535; 0 only when
// `allow_port_zero` (listen addresses).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view flag_name, absl::string_view value,
                                       bool allow_port_zero);

// Byte sizes: a non-negative integer with an optional unit B, KiB, MiB, GiB, TiB (powers of
// 1024) or KB, MB, GB, TB (powers of 1000); case-insensitive, e.g. "512MiB", "4GB", "1048576".
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view flag_name, absl::string_view value);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_FLAGS_H_
