#include "common/metrics_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace deepinfer::testutil {

absl::StatusOr<std::string> HttpGet(int port, absl::string_view path, absl::Duration timeout) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  timeval tv;
  tv.tv_sec = static_cast<time_t>(absl::ToInt64Seconds(timeout));
  tv.tv_usec =
      static_cast<suseconds_t>(absl::ToInt64Microseconds(timeout - absl::Seconds(tv.tv_sec)));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect to 127.0.0.1:", port, ": ", std::strerror(err)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  const std::string status_line = raw.substr(0, raw.find("\r\n"));
  if (end == std::string::npos || status_line.rfind("HTTP/1.1 200 ", 0) != 0) {
    return absl::InternalError(
        absl::StrCat("GET ", path, " on port ", port, ": got \"", status_line, "\""));
  }
  return raw.substr(end + 4);
}

std::optional<double> SampleValue(absl::string_view text, absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.size() <= series.size() || line.substr(0, series.size()) != series ||
        line[series.size()] != ' ') {
      continue;
    }
    absl::string_view value = line.substr(series.size() + 1);
    value = value.substr(0, value.find(' '));  // a timestamp may follow
    double out = 0;
    if (value == "+Inf") return HUGE_VAL;
    if (absl::SimpleAtod(value, &out)) return out;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace deepinfer::testutil
