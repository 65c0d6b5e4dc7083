// A minimal HTTP/1.1 server for Prometheus scrapes and liveness probes, one per binary:
//
//   GET /metrics  200, Content-Type: text/plain; version=0.0.4; charset=utf-8, the registry's
//                 Serialize()
//   GET /healthz  200 "ok\n", or 503 "unhealthy\n" when options.healthy returns false
//   HEAD of either: the same status and headers, no body
//   other paths 404, other methods on those paths 405 (with Allow), malformed requests 400,
//   request head over max_request_bytes 431, a head not complete within read_timeout 408.
//
// One accept thread serves one request per connection (Connection: close), so a scrape costs
// one Serialize(). A slow or silent client holds the thread for at most read_timeout (plus
// write_timeout to send the answer); Stop() interrupts it at once.
//
// Thread-safety: all methods are thread-safe. Not copyable or movable (it owns a thread).
#ifndef DEEPINFER_COMMON_METRICS_HTTP_SERVER_H_
#define DEEPINFER_COMMON_METRICS_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace deepinfer {

struct MetricsHttpServerOptions {
  // "host:port" as common/flags.h ParseHostPort reads it; port 0 picks a free port.
  std::string listen_address = "127.0.0.1:0";
  // The flag the address came from, named in error messages.
  std::string flag_name = "metrics_listen";
  // Longest wait for a complete request head, from accept().
  absl::Duration read_timeout = absl::Seconds(5);
  // Longest wait for the response to drain to a client that does not read.
  absl::Duration write_timeout = absl::Seconds(5);
  // Largest request head (request line + headers + blank line), bytes.
  size_t max_request_bytes = 8192;
  // Answers /healthz; null means always healthy. Called on the server thread; must be
  // thread-safe and fast.
  std::function<bool()> healthy;
  // Called before each /metrics answer is serialized (also for HEAD), so gauges that mirror
  // state kept elsewhere (loads, queue depths) are fresh at scrape time. Runs on the server
  // thread; must be thread-safe and fast. Null: nothing runs.
  std::function<void()> before_scrape;
};

class MetricsHttpServer {
 public:
  // Binds and listens (no thread yet). `registry` is not owned and must outlive the server.
  // kInvalidArgument for a malformed address or options, kUnavailable when the address cannot
  // be resolved or bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Create(
      const MetricsRegistry* registry, MetricsHttpServerOptions options);

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;
  // Stops if still running.
  ~MetricsHttpServer();

  // Starts the accept thread. kFailedPrecondition if already started or stopped.
  absl::Status Start();

  // Closes the listening socket, aborts the connection in progress and joins the thread.
  // Idempotent; safe without Start().
  void Stop();

  // The bound port (the OS's choice when listening on port 0).
  int port() const { return port_; }

 private:
  MetricsHttpServer(const MetricsRegistry* registry, MetricsHttpServerOptions options,
                    int listen_fd, int wake_read_fd, int wake_write_fd, int port);

  void AcceptLoop();
  void ServeConnection(int fd);
  // The response for a complete, well-formed or malformed request head.
  std::string Respond(const std::string& head);

  const MetricsRegistry* const registry_;
  const MetricsHttpServerOptions options_;
  const int listen_fd_;
  // A pipe that Stop() writes to, waking poll() in the server thread.
  const int wake_read_fd_;
  const int wake_write_fd_;
  const int port_;

  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_METRICS_HTTP_SERVER_H_
