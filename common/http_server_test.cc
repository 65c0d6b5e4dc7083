#include "common/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

// A raw TCP client: tests see exactly the bytes a client gets.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    timeval tv{.tv_sec = 5, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawClient() { Close(); }
  bool connected() const { return connected_; }
  void Send(const std::string& data) { (void)::send(fd_, data.data(), data.size(), MSG_NOSIGNAL); }
  // Reads until `until` appears in what was received, EOF or a 5 s timeout.
  std::string ReadUntil(absl::string_view until) {
    char buf[4096];
    while (!absl::StrContains(received_, until)) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      received_.append(buf, static_cast<size_t>(n));
    }
    std::string out;
    const size_t at = received_.find(std::string(until));
    if (at == std::string::npos) {
      out.swap(received_);
    } else {
      out = received_.substr(0, at + until.size());
      received_.erase(0, at + until.size());
    }
    return out;
  }
  // True when the server closed the connection (EOF) within 5 s.
  bool ClosedByServer() {
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string received_;
};

std::unique_ptr<HttpServer> StartEcho(HttpServerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      options, [](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        responder->Respond(200, {{"Content-Type", "text/plain"}},
                           absl::StrCat(request.method, " ", request.path, " q=", request.query,
                                        " body=", request.body));
      });
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

TEST(HttpServerTest, KeepAliveServesRequestsInOrderOnOneConnection) {
  std::unique_ptr<HttpServer> server = StartEcho();
  ASSERT_NE(server, nullptr);
  RawClient client(server->port());
  ASSERT_TRUE(client.connected());
  // Two pipelined requests, then a third after the answers.
  client.Send("GET /a?x=1 HTTP/1.1\r\nHost: h\r\n\r\nPOST /b HTTP/1.1\r\nHost: h\r\n"
              "Content-Length: 5\r\n\r\nhello");
  const std::string first = client.ReadUntil("q=x=1 body=");
  EXPECT_TRUE(absl::StartsWith(first, "HTTP/1.1 200 OK\r\n")) << first;
  EXPECT_TRUE(absl::StrContains(first, "GET /a q=x=1 body=")) << first;
  EXPECT_TRUE(absl::StrContains(client.ReadUntil("body=hello"), "POST /b q= body=hello"));
  client.Send("GET /c HTTP/1.1\r\nHost: h\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(client.ReadUntil("body="), "GET /c"));
}

TEST(HttpServerTest, MalformedRequestsGetAClear4xxAndTheServerKeepsServing) {
  HttpServerOptions options;
  options.max_body_bytes = 100;
  options.max_header_bytes = 1024;
  std::unique_ptr<HttpServer> server = StartEcho(options);
  ASSERT_NE(server, nullptr);
  struct Case {
    std::string request;
    std::string status_line;
  };
  const Case cases[] = {
      {"NOT HTTP AT ALL\r\n\r\n", "HTTP/1.1 400 Bad Request"},
      {"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", "HTTP/1.1 413 Payload Too Large"},
      {absl::StrCat("GET / HTTP/1.1\r\nX-Big: ", std::string(2000, 'a'), "\r\n\r\n"),
       "HTTP/1.1 431 Request Header Fields Too Large"},
      {"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", "HTTP/1.1 400 Bad Request"},
  };
  for (const Case& c : cases) {
    RawClient client(server->port());
    ASSERT_TRUE(client.connected());
    client.Send(c.request);
    const std::string response = client.ReadUntil("}}\n");
    EXPECT_TRUE(absl::StartsWith(response, c.status_line)) << c.request << " -> " << response;
    EXPECT_TRUE(absl::StrContains(response, R"({"error":{"message":)")) << response;
    EXPECT_TRUE(client.ClosedByServer());
  }
  RawClient client(server->port());
  client.Send("GET /still HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(client.ReadUntil("body="), "200 OK"));
}

TEST(HttpServerTest, SlowClientsGet408AndIdleOnesAreClosed) {
  HttpServerOptions options;
  options.read_timeout = absl::Milliseconds(300);
  std::unique_ptr<HttpServer> server = StartEcho(options);
  ASSERT_NE(server, nullptr);
  RawClient slow(server->port());
  slow.Send("GET / HTTP/1.1\r\nHost: h\r\n");  // headers never end
  const absl::Time start = absl::Now();
  const std::string response = slow.ReadUntil("}}\n");
  EXPECT_TRUE(absl::StartsWith(response, "HTTP/1.1 408 Request Timeout")) << response;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  RawClient idle(server->port());
  EXPECT_TRUE(idle.ClosedByServer());
}

TEST(HttpServerTest, StreamsChunksAndReportsAClientThatLeaves) {
  absl::Notification gone;
  std::shared_ptr<HttpResponder> held;
  absl::Notification started;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(
      {}, [&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        if (request.path == "/stream") {
          responder->StartStream(200, {{"Content-Type", "text/event-stream"}});
          responder->Write("data: 1\n\n", [responder](bool ok) {
            if (ok) responder->Write("data: 2\n\n", [responder](bool) { responder->EndStream(); });
          });
          return;
        }
        // /hang: never answers until the client leaves.
        responder->OnClientGone([&] { gone.Notify(); });
        held = responder;
        started.Notify();
      });
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient client((*server)->port());
  client.Send("GET /stream HTTP/1.1\r\n\r\n");
  const std::string stream = client.ReadUntil("0\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(stream, "Transfer-Encoding: chunked")) << stream;
  EXPECT_TRUE(absl::StrContains(stream, "9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"))
      << stream;

  RawClient leaver((*server)->port());
  leaver.Send("GET /hang HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(5)));
  leaver.Close();
  EXPECT_TRUE(gone.WaitForNotificationWithTimeout(absl::Seconds(5)));
  absl::Notification failed;
  held->Write("late", [&](bool ok) {
    if (!ok) failed.Notify();
  });
  EXPECT_TRUE(failed.WaitForNotificationWithTimeout(absl::Seconds(5)));
  held.reset();
}

}  // namespace
}  // namespace deepinfer
