// Test helpers for Prometheus endpoints: fetch /metrics over real HTTP and read one sample.
//
// Thread-safety: pure functions (each call opens its own connection).
#ifndef DEEPINFER_COMMON_METRICS_TEST_UTIL_H_
#define DEEPINFER_COMMON_METRICS_TEST_UTIL_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace deepinfer::testutil {

// GET `path` from 127.0.0.1:`port` (HTTP/1.1, Connection: close) and return the body of a 200
// answer. kUnavailable when the connection fails, kInternal for another status or a malformed
// answer (the status line quoted).
absl::StatusOr<std::string> HttpGet(int port, absl::string_view path = "/metrics",
                                    absl::Duration timeout = absl::Seconds(5));

// The value of the sample whose series is exactly `series` (the metric name plus its label set
// as serialized, e.g. `deepinfer_requests_total{outcome="ok"}`) in the text exposition `text`;
// nullopt when there is none.
std::optional<double> SampleValue(absl::string_view text, absl::string_view series);

}  // namespace deepinfer::testutil

#endif  // DEEPINFER_COMMON_METRICS_TEST_UTIL_H_
