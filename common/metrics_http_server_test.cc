#include "common/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

// A connected TCP socket to 127.0.0.1:port with a 5 s receive timeout, or -1.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += n;
  }
  return true;
}

// Everything the server sends until it closes (or the 5 s receive timeout).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, n);
  }
  return out;
}

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // Lower-case names.
  std::string body;
  std::string raw;
};

HttpResponse Parse(const std::string& raw) {
  HttpResponse r;
  r.raw = raw;
  size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status_line.size() < 2 || status_line[0] != "HTTP/1.1" ||
      !absl::SimpleAtoi(status_line[1], &r.status)) {
    return r;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string value = lines[i].substr(colon + 1);
    r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(value));
  }
  r.body = raw.substr(end + 4);
  return r;
}

HttpResponse Exchange(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return {};
  SendAll(fd, request);
  HttpResponse r = Parse(ReadAll(fd));
  close(fd);
  return r;
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void StartServer(MetricsHttpServerOptions options = {}) {
    server_ = MetricsHttpServer::Create(&registry_, std::move(options)).value();
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->port(), 0);
  }

  MetricsRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, ServesMetrics) {
  Counter* c = registry_.AddCounter("deepinfer_requests_total", "Requests.").value();
  c->Increment(3);
  StartServer();
  HttpResponse r = Exchange(server_->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, registry_.Serialize());
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_NE(r.body.find("deepinfer_requests_total 3\n"), std::string::npos) << r.body;

  // Live values: a later scrape sees the update; query strings are ignored.
  c->Increment();
  r = Exchange(server_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("deepinfer_requests_total 4\n"), std::string::npos) << r.body;

  // HEAD: headers without a body.
  r = Exchange(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(r.headers["content-length"], std::to_string(registry_.Serialize().size()));
}

TEST_F(MetricsHttpServerTest, BeforeScrapeRefreshesGaugesOnEveryMetricsRequest) {
  Gauge* g = registry_.AddGauge("deepinfer_queue_depth", "Queue.").value();
  std::atomic<int> calls{0};
  MetricsHttpServerOptions options;
  options.before_scrape = [&] { g->Set(++calls); };
  StartServer(options);
  HttpResponse r = Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_NE(r.body.find("deepinfer_queue_depth 1\n"), std::string::npos) << r.body;
  r = Exchange(server_->port(), "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_NE(r.body.find("deepinfer_queue_depth 2\n"), std::string::npos) << r.body;
  // Other paths do not run it.
  Exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(MetricsHttpServerTest, Healthz) {
  std::atomic<bool> healthy{true};
  MetricsHttpServerOptions options;
  options.healthy = [&] { return healthy.load(); };
  StartServer(options);
  HttpResponse r = Exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  healthy = false;
  r = Exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 503);
}

TEST_F(MetricsHttpServerTest, NotFoundAndMethodNotAllowed) {
  StartServer();
  EXPECT_EQ(Exchange(server_->port(), "GET / HTTP/1.1\r\n\r\n").status, 404);
  EXPECT_EQ(Exchange(server_->port(), "GET /metricsx HTTP/1.1\r\n\r\n").status, 404);
  HttpResponse r = Exchange(server_->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "GET, HEAD");
  EXPECT_EQ(Exchange(server_->port(), "DELETE /healthz HTTP/1.1\r\n\r\n").status, 405);
}

TEST_F(MetricsHttpServerTest, MalformedRequests) {
  StartServer();
  for (const char* request : {
           "GARBAGE\r\n\r\n",
           "GET /metrics\r\n\r\n",
           "GET /metrics HTTP/1.1 extra\r\n\r\n",
           "GET metrics HTTP/1.1\r\n\r\n",
           "GET /metrics HTTP/2.0\r\n\r\n",
           "G(T /metrics HTTP/1.1\r\n\r\n",
           "GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
           "GET /metrics HTTP/1.1\r\n: empty name\r\n\r\n",
           "\r\n\r\n",
       }) {
    EXPECT_EQ(Exchange(server_->port(), request).status, 400) << request;
  }
  // Still healthy afterwards.
  EXPECT_EQ(Exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n").status, 200);
}

TEST_F(MetricsHttpServerTest, RequestSizeLimit) {
  MetricsHttpServerOptions options;
  options.max_request_bytes = 1024;
  StartServer(options);
  std::string big = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(4000, 'a') + "\r\n\r\n";
  EXPECT_EQ(Exchange(server_->port(), big).status, 431);
  std::string fits = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(900, 'a') + "\r\n\r\n";
  EXPECT_EQ(Exchange(server_->port(), fits).status, 200);
}

TEST_F(MetricsHttpServerTest, SilentClientTimesOutAndOthersAreServed) {
  MetricsHttpServerOptions options;
  options.read_timeout = absl::Milliseconds(200);
  StartServer(options);

  int silent = Connect(server_->port());
  ASSERT_GE(silent, 0);
  int partial = Connect(server_->port());
  ASSERT_GE(partial, 0);
  ASSERT_TRUE(SendAll(partial, "GET /metr"));  // Never finishes.

  absl::Time start = absl::Now();
  HttpResponse r = Exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.status, 200);
  // Served after at most the two stalled clients' timeouts (with slack for a loaded machine).
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));

  EXPECT_EQ(Parse(ReadAll(silent)).status, 408);
  EXPECT_EQ(Parse(ReadAll(partial)).status, 408);
  close(silent);
  close(partial);
}

TEST_F(MetricsHttpServerTest, ClientThatHangsUpIsHarmless) {
  StartServer();
  int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /met");
  close(fd);
  EXPECT_EQ(Exchange(server_->port(), "GET /healthz HTTP/1.1\r\n\r\n").status, 200);
}

TEST_F(MetricsHttpServerTest, StopInterruptsSlowClientAndRefusesNewConnections) {
  MetricsHttpServerOptions options;
  options.read_timeout = absl::Seconds(30);
  StartServer(options);
  int port = server_->port();
  int silent = Connect(port);
  ASSERT_GE(silent, 0);
  absl::SleepFor(absl::Milliseconds(50));  // Let the server pick it up.
  absl::Time start = absl::Now();
  server_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  server_->Stop();  // Idempotent.
  close(silent);
  EXPECT_LT(Connect(port), 0);
  EXPECT_EQ(server_->Start().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(MetricsHttpServerCreateTest, Errors) {
  MetricsRegistry registry;
  MetricsHttpServerOptions options;
  options.listen_address = "127.0.0.1";
  absl::Status s = MetricsHttpServer::Create(&registry, options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("metrics_listen"), absl::string_view::npos) << s;

  EXPECT_EQ(MetricsHttpServer::Create(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A port already in use.
  auto first = MetricsHttpServer::Create(&registry, {}).value();
  options.listen_address = "127.0.0.1:" + std::to_string(first->port());
  EXPECT_EQ(MetricsHttpServer::Create(&registry, options).status().code(),
            absl::StatusCode::kUnavailable);

  // Start twice.
  ASSERT_TRUE(first->Start().ok());
  EXPECT_EQ(first->Start().code(), absl::StatusCode::kFailedPrecondition);
  // Destruction without Stop() stops it.
}

TEST(MetricsHttpServerCreateTest, StopWithoutStart) {
  MetricsRegistry registry;
  auto server = MetricsHttpServer::Create(&registry, {}).value();
  server->Stop();
}

}  // namespace
}  // namespace deepinfer
