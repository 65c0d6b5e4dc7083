#include "common/metrics_http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"

namespace deepinfer {
namespace {

constexpr absl::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string ErrnoText(int err) { return std::strerror(err); }

// Milliseconds until `deadline` for poll(), at least 0.
int MillisUntil(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

enum class WaitResult { kReady, kTimeout, kWoken, kError };

// Waits for `events` on `fd`, or a byte on `wake_fd`, until `deadline`.
WaitResult WaitFor(int fd, short events, int wake_fd, absl::Time deadline) {
  while (true) {
    pollfd fds[2] = {{fd, events, 0}, {wake_fd, POLLIN, 0}};
    int n = poll(fds, 2, MillisUntil(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return WaitResult::kError;
    }
    if (fds[1].revents != 0) return WaitResult::kWoken;
    if (n == 0) {
      if (absl::Now() >= deadline) return WaitResult::kTimeout;
      continue;
    }
    return WaitResult::kReady;
  }
}

std::string Response(int code, absl::string_view reason, absl::string_view content_type,
                     absl::string_view body, bool head_only, absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n",
                                 extra_headers, "\r\n");
  if (!head_only) absl::StrAppend(&out, body);
  return out;
}

std::string PlainError(int code, absl::string_view reason, absl::string_view extra_headers = "") {
  return Response(code, reason, "text/plain; charset=utf-8", absl::StrCat(reason, "\n"),
                  /*head_only=*/false, extra_headers);
}

// RFC 9110 token characters, for the method.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

// The end of the request head ("\r\n\r\n", or "\n\n" from lenient clients), or npos.
size_t FindHeadEnd(const std::string& buf, size_t* terminator_len) {
  size_t crlf = buf.find("\r\n\r\n");
  size_t lf = buf.find("\n\n");
  if (crlf != std::string::npos && (lf == std::string::npos || crlf < lf)) {
    *terminator_len = 4;
    return crlf;
  }
  *terminator_len = 2;
  return lf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Create(
    const MetricsRegistry* registry, MetricsHttpServerOptions options) {
  if (registry == nullptr) {
    return absl::InvalidArgumentError("metrics http server: expected a registry, found null");
  }
  if (options.read_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration() || options.max_request_bytes < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics http server: expected positive timeouts and max_request_bytes >= 16, found "
        "read_timeout=",
        absl::FormatDuration(options.read_timeout),
        " write_timeout=", absl::FormatDuration(options.write_timeout),
        " max_request_bytes=", options.max_request_bytes));
  }
  absl::StatusOr<HostPort> hp =
      ParseHostPort(options.flag_name, options.listen_address, /*allow_port_zero=*/true);
  if (!hp.ok()) return hp.status();

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* addrs = nullptr;
  std::string port_text = std::to_string(hp->port);
  int gai = getaddrinfo(hp->host.c_str(), port_text.c_str(), &hints, &addrs);
  if (gai != 0) {
    return absl::UnavailableError(absl::StrCat("--", options.flag_name, ": cannot resolve \"",
                                               hp->host, "\": ", gai_strerror(gai)));
  }
  int listen_fd = -1;
  std::string last_error = "no addresses";
  for (addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      last_error = ErrnoText(errno);
      close(fd);
      continue;
    }
    listen_fd = fd;
    break;
  }
  freeaddrinfo(addrs);
  if (listen_fd < 0) {
    return absl::UnavailableError(absl::StrCat("--", options.flag_name, ": cannot listen on ",
                                               hp->ToString(), ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // Non-blocking so that a connection reset between poll() and accept() cannot block us.
  fcntl(listen_fd, F_SETFL, fcntl(listen_fd, F_GETFL) | O_NONBLOCK);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    int err = errno;
    close(listen_fd);
    return absl::UnavailableError(
        absl::StrCat("metrics http server: cannot create a pipe: ", ErrnoText(err)));
  }
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(
      registry, std::move(options), listen_fd, pipe_fds[0], pipe_fds[1], port));
}

MetricsHttpServer::MetricsHttpServer(const MetricsRegistry* registry,
                                     MetricsHttpServerOptions options, int listen_fd,
                                     int wake_read_fd, int wake_write_fd, int port)
    : registry_(registry),
      options_(std::move(options)),
      listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port) {}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  close(wake_read_fd_);
  close(wake_write_fd_);
}

absl::Status MetricsHttpServer::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stopped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics http server: expected a fresh server, found it already ",
                     stopped_ ? "stopped" : "started"));
  }
  started_ = true;
  thread_ = std::thread([this] { AcceptLoop(); });
  return absl::OkStatus();
}

void MetricsHttpServer::Stop() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    thread = std::move(thread_);
  }
  char byte = 1;
  // The pipe is non-blocking and only ever gets this one byte; it cannot fail short of EBADF.
  (void)!write(wake_write_fd_, &byte, 1);
  if (thread.joinable()) thread.join();
  close(listen_fd_);
}

void MetricsHttpServer::AcceptLoop() {
  while (true) {
    WaitResult w = WaitFor(listen_fd_, POLLIN, wake_read_fd_, absl::InfiniteFuture());
    if (w == WaitResult::kWoken || w == WaitResult::kError) return;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // EAGAIN (client gone), EMFILE and friends: retry on the next poll.
    ServeConnection(fd);
    close(fd);
  }
}

void MetricsHttpServer::ServeConnection(int fd) {
  const absl::Time read_deadline = absl::Now() + options_.read_timeout;
  std::string buf;
  std::string response;
  char chunk[4096];
  while (response.empty()) {
    size_t terminator_len = 0;
    size_t end = FindHeadEnd(buf, &terminator_len);
    if (end != std::string::npos && end + terminator_len <= options_.max_request_bytes) {
      response = Respond(buf.substr(0, end));
      break;
    }
    if (buf.size() >= options_.max_request_bytes) {
      response = PlainError(431, "Request Header Fields Too Large");
      break;
    }
    WaitResult w = WaitFor(fd, POLLIN, wake_read_fd_, read_deadline);
    if (w == WaitResult::kWoken || w == WaitResult::kError) return;
    if (w == WaitResult::kTimeout) {
      response = PlainError(408, "Request Timeout");
      break;
    }
    size_t want = std::min(sizeof(chunk), options_.max_request_bytes - buf.size());
    ssize_t n = recv(fd, chunk, want, 0);
    if (n == 0) return;  // Client closed before a complete head: nobody to answer.
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return;
    }
    buf.append(chunk, static_cast<size_t>(n));
  }

  const absl::Time write_deadline = absl::Now() + options_.write_timeout;
  size_t sent = 0;
  while (sent < response.size()) {
    ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
    if (WaitFor(fd, POLLOUT, wake_read_fd_, write_deadline) != WaitResult::kReady) return;
  }
  // Closing with unread input makes the kernel send RST, which can destroy the response before
  // the client reads it; so half-close and drain briefly (bounded in time and bytes).
  shutdown(fd, SHUT_WR);
  const absl::Time drain_deadline = absl::Now() + absl::Milliseconds(100);
  for (size_t drained = 0; drained < (1 << 20);) {
    if (WaitFor(fd, POLLIN, wake_read_fd_, drain_deadline) != WaitResult::kReady) return;
    ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n == 0) return;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return;
    }
    drained += static_cast<size_t>(n);
  }
}

std::string MetricsHttpServer::Respond(const std::string& head) {
  std::vector<std::string> lines = absl::StrSplit(head, '\n');
  for (std::string& line : lines) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
  }
  std::vector<std::string> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty()) {
    return PlainError(400, "Bad Request");
  }
  const std::string& method = parts[0];
  const std::string& target = parts[1];
  const std::string& version = parts[2];
  if (!std::all_of(method.begin(), method.end(), IsTokenChar) || target[0] != '/' ||
      (version != "HTTP/1.1" && version != "HTTP/1.0")) {
    return PlainError(400, "Bad Request");
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos || colon == 0 ||
        !std::all_of(lines[i].begin(), lines[i].begin() + colon, IsTokenChar)) {
      return PlainError(400, "Bad Request");
    }
  }

  std::string path = target.substr(0, target.find('?'));
  if (path != "/metrics" && path != "/healthz") return PlainError(404, "Not Found");
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return PlainError(405, "Method Not Allowed", "Allow: GET, HEAD\r\n");
  }
  if (path == "/metrics") {
    if (options_.before_scrape) options_.before_scrape();
    return Response(200, "OK", kMetricsContentType, registry_->Serialize(), head_only);
  }
  if (options_.healthy && !options_.healthy()) {
    return Response(503, "Service Unavailable", "text/plain; charset=utf-8", "unhealthy\n",
                    head_only);
  }
  return Response(200, "OK", "text/plain; charset=utf-8", "ok\n", head_only);
}

}  // namespace deepinfer
