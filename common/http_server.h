// A small asynchronous HTTP/1.1 server (Boost.Beast/Asio) for public APIs: a fixed pool of
// io_context threads serves every connection, so a long response (a Server-Sent Events stream)
// holds no thread while it waits for the data it relays.
//
// Contract, per connection:
//   - HTTP/1.1 keep-alive (and HTTP/1.0 without it); requests are answered in order, one at a
//     time (a pipelined request is read once the previous response is complete).
//   - A request must arrive whole (headers and body) within `read_timeout` of the connection
//     opening or of the previous response ending (the idle keep-alive wait counts too): a slow or
//     silent client gets 408 and the connection is closed (slowloris).
//   - Headers over `max_header_bytes` -> 431; a body over `max_body_bytes` -> 413 (refused from
//     Content-Length before the body is read); malformed HTTP -> 400 with the parser's reason.
//     Each of these closes the connection. At most `max_connections` are open: the next is
//     accepted and closed at once.
//   - Each write of a response must complete within `write_timeout` (a client that stops reading
//     is disconnected).
//   - While a handler works on a request, the connection is watched: when the client closes it
//     (EOF or error), the responder's client-gone callback runs once and every later write
//     fails. That is how a handler aborts work nobody waits for. With TLS a client that sends
//     a close_notify before closing is seen as gone only when a write to it fails (the watch
//     peeks at raw bytes, which it cannot tell from a pipelined request).
//   - With TLS (tls_cert_file), the handshake must also finish within `read_timeout`; a client
//     that does not speak TLS is disconnected without an answer.
//
// The handler runs on an io thread and must not block: it starts its work and answers later,
// from any thread, through the HttpResponder (exactly one of Respond, or StartStream + Write* +
// EndStream).
//
// Thread-safety: Start and Stop from one thread; HttpResponder methods from any thread.
//
// The workers' /metrics endpoint stays on common/metrics_http_server (a blocking, dependency-free
// server for scrapes only); this one is for client-facing APIs.
#ifndef DEEPINFER_COMMON_HTTP_SERVER_H_
#define DEEPINFER_COMMON_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace deepinfer {

struct HttpServerOptions {
  // "host:port"; port 0 picks a free port.
  std::string listen_address = "127.0.0.1:0";
  // io_context threads, >= 1.
  int threads = 2;
  size_t max_header_bytes = 16 << 10;
  size_t max_body_bytes = 32 << 20;
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(60);
  int max_connections = 10000;
  // TLS: both PEM files or neither (plaintext). Checked at Start (errors as LoadTlsFiles in
  // common/tls_files.h). Every `tls_reload_interval` the files' modification times are checked;
  // on a change both are re-read and, when they hold a matching pair, new connections get it
  // (open ones keep theirs); otherwise the previous pair stays and a warning is logged.
  std::string tls_cert_file;
  std::string tls_key_file;
  absl::Duration tls_reload_interval = absl::Seconds(10);
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::string query;   // after '?', without it; "" when none
  HttpHeaders headers;  // names as the client sent them
  std::string body;
  // The value of the first header named `name` (case-insensitive); "" when absent.
  std::string Header(absl::string_view name) const;
};

class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response with Content-Length. Ignored when the client is gone or a response already
  // started.
  virtual void Respond(int status, HttpHeaders headers, std::string body) = 0;
  // Starts a chunked response (e.g. text/event-stream); then Write any number of times (at most
  // one write outstanding: call the next from `done`) and EndStream once.
  virtual void StartStream(int status, HttpHeaders headers) = 0;
  // Queues `data` as one chunk; `done(true)` once written, `done(false)` when the client is gone
  // or the write failed or timed out (then nothing more is sent). `done` runs on an io thread.
  virtual void Write(std::string data, std::function<void(bool)> done) = 0;
  virtual void EndStream() = 0;
  // `on_gone` runs once (on an io thread, or at once when already gone) when the client closes
  // the connection before the response ended, or a write fails.
  virtual void OnClientGone(std::function<void()> on_gone) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

class HttpServer {
 public:
  // Binds and starts serving. kInvalidArgument for bad options or a malformed address,
  // kUnavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Stops accepting, closes every connection and joins the threads. Responders still held
  // elsewhere stay valid; their writes fail. Idempotent.
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// The reason phrase of an HTTP status ("Not Found"); "Unknown" for others.
std::string HttpReason(int status);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_HTTP_SERVER_H_
