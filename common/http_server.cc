#include "common/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/bind_executor.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl/context.hpp"
#include "boost/asio/ssl/error.hpp"
#include "boost/asio/ssl/stream.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/http/error.hpp"
#include "boost/beast/http/parser.hpp"
#include "boost/beast/http/read.hpp"
#include "boost/beast/http/string_body.hpp"
#include "common/flags.h"
#include "common/tls_files.h"
#include "spdlog/spdlog.h"

namespace deepinfer {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using boost::system::error_code;

std::string HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

std::string HttpReason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
  }
}

namespace {

class Session;

}  // namespace

class HttpServer::Impl : public std::enable_shared_from_this<HttpServer::Impl> {
 public:
  Impl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)), handler_(std::move(handler)), acceptor_(ioc_) {}

  absl::Status Bind();
  void Accept();
  void Stop();
  // TLS: the context new connections use (null when TLS is off), and the reload poll.
  std::shared_ptr<net::ssl::context> TlsContext() {
    absl::MutexLock lock(&mu_);
    return tls_context_;
  }
  void PollTls();

  const HttpServerOptions options_;
  const HttpHandler handler_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  int port_ = 0;
  std::vector<std::thread> threads_;
  std::atomic<int> connections_{0};
  std::atomic<bool> stopped_{false};
  absl::Mutex mu_;
  std::vector<std::weak_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<net::ssl::context> tls_context_ ABSL_GUARDED_BY(mu_);
  absl::Time tls_modified_ = absl::InfinitePast();  // on the poll timer's chain only
  std::optional<net::steady_timer> tls_timer_;
};

namespace {

std::chrono::steady_clock::duration ToSteady(absl::Duration d) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(absl::ToChronoNanoseconds(d));
}

// A server context holding `files`' pair: TLS 1.2 and 1.3 only.
absl::StatusOr<std::shared_ptr<net::ssl::context>> MakeTlsContext(const TlsFiles& files) {
  auto context = std::make_shared<net::ssl::context>(net::ssl::context::tls_server);
  error_code ec;
  context->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                           net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                           net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use,
                       ec);
  if (!ec) context->use_certificate_chain(net::buffer(files.cert_pem), ec);
  if (!ec) context->use_private_key(net::buffer(files.key_pem), net::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("tls_cert_file ", files.cert_file,
                                                   ", tls_key_file ", files.key_file, ": ",
                                                   ec.message()));
  }
  return context;
}

// One connection. Every member is touched only on the connection's strand (the socket's
// executor).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<HttpServer::Impl> server, tcp::socket socket,
          std::shared_ptr<net::ssl::context> tls_context)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        tls_context_(std::move(tls_context)),
        timer_(socket_.get_executor()) {
    if (tls_context_ != nullptr) tls_.emplace(socket_, *tls_context_);
    ++server_->connections_;
  }
  ~Session() { --server_->connections_; }

  template <typename F>
  void Post(F&& f) {
    net::post(socket_.get_executor(), std::forward<F>(f));
  }

  // With TLS, the handshake counts against the first request's read timeout.
  void Run() {
    if (!tls_.has_value()) return ReadHeader();
    read_timed_out_ = false;
    Arm(server_->options_.read_timeout, /*reading=*/true);
    tls_->async_handshake(net::ssl::stream_base::server,
                          [self = shared_from_this()](error_code ec) {
                            if (self->closed_) return;
                            if (ec) return self->Close();  // not TLS, or a refused certificate
                            self->ReadHeader();
                          });
  }

  // From the responder, on the strand: `generation` names the request it answers.
  void Respond(uint64_t generation, int status, HttpHeaders headers, std::string body) {
    if (!Current(generation) || response_started_) return;
    response_started_ = true;
    stream_ended_ = true;  // nothing more to write
    std::string out = StatusLine(status, headers);
    absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n");
    out += body;
    Enqueue(std::move(out), nullptr, /*last=*/true);
  }
  void StartStream(uint64_t generation, int status, HttpHeaders headers) {
    if (!Current(generation) || response_started_) return;
    response_started_ = true;
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the body is the connection's end
    std::string out = StatusLine(status, headers);
    if (chunked_) out += "Transfer-Encoding: chunked\r\n";
    out += "\r\n";
    Enqueue(std::move(out), nullptr, /*last=*/false);
  }
  void Write(uint64_t generation, std::string data, std::function<void(bool)> done) {
    if (!Current(generation) || !response_started_ || stream_ended_ || data.empty()) {
      if (done) done(Current(generation) && response_started_ && !stream_ended_);
      return;
    }
    if (chunked_) {
      std::string framed = absl::StrCat(absl::Hex(data.size()), "\r\n");
      framed += data;
      framed += "\r\n";
      data = std::move(framed);
    }
    Enqueue(std::move(data), std::move(done), /*last=*/false);
  }
  void EndStream(uint64_t generation) {
    if (!Current(generation) || !response_started_ || stream_ended_) return;
    stream_ended_ = true;
    Enqueue(chunked_ ? "0\r\n\r\n" : "", nullptr, /*last=*/true);
  }
  void OnClientGone(uint64_t generation, std::function<void()> on_gone) {
    if (generation != generation_) return;
    if (closed_) {
      on_gone();
      return;
    }
    on_gone_ = std::move(on_gone);
  }
  // Abandoned by its handler without an answer.
  void Abandoned(uint64_t generation) {
    if (Current(generation) && !response_started_) {
      Respond(generation, 500, {{"Content-Type", "text/plain"}}, "no response\n");
    } else if (Current(generation) && !stream_ended_) {
      Close();
    }
  }
  void Close() {
    if (closed_) return;
    closed_ = true;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    timer_.cancel();
    for (Pending& p : writes_) {
      if (p.done) p.done(false);
    }
    writes_.clear();
    if (on_gone_) {
      std::function<void()> f = std::move(on_gone_);
      on_gone_ = nullptr;
      f();
    }
  }

 private:
  struct Pending {
    std::string data;
    std::function<void(bool)> done;
    bool last = false;
  };

  bool Current(uint64_t generation) const {
    return !closed_ && in_request_ && generation == generation_;
  }

  std::string StatusLine(int status, const HttpHeaders& headers) {
    std::string out = absl::StrCat("HTTP/1.", version_ >= 11 ? "1" : "0", " ", status, " ",
                                   HttpReason(status), "\r\n");
    for (const auto& [k, v] : headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
    if (!keep_alive_) out += "Connection: close\r\n";
    else if (version_ < 11) out += "Connection: keep-alive\r\n";
    return out;
  }

  // Calls `f` with the stream requests and responses go through: the TLS stream or the socket.
  template <typename F>
  void WithStream(F&& f) {
    if (tls_.has_value()) {
      f(*tls_);
    } else {
      f(socket_);
    }
  }

  void Arm(absl::Duration d, bool reading) {
    const uint64_t seq = ++timer_seq_;
    timer_.expires_after(ToSteady(d));
    timer_.async_wait([self = shared_from_this(), seq, reading](error_code ec) {
      if (ec || seq != self->timer_seq_ || self->closed_) return;
      if (reading) {
        self->read_timed_out_ = true;
        error_code ignored;
        self->socket_.cancel(ignored);
      } else {
        self->Close();  // a client that does not read its response
      }
    });
  }
  void Disarm() {
    ++timer_seq_;
    timer_.cancel();
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(server_->options_.max_header_bytes));
    parser_->body_limit(server_->options_.max_body_bytes);
    read_timed_out_ = false;
    Arm(server_->options_.read_timeout, /*reading=*/true);
    WithStream([&](auto& stream) {
      http::async_read_header(stream, buffer_, *parser_,
                              [self = shared_from_this()](error_code ec, size_t) {
                                self->OnHeader(ec);
                              });
    });
  }

  void OnHeader(error_code ec) {
    if (closed_) return;
    if (ec) return OnReadError(ec);
    auto& req = parser_->get();
    if (absl::EqualsIgnoreCase(std::string(req[http::field::expect]), "100-continue") &&
        !parser_->is_done()) {
      auto cont = std::make_shared<std::string>(
          absl::StrCat("HTTP/1.", req.version() >= 11 ? "1" : "0", " 100 Continue\r\n\r\n"));
      WithStream([&](auto& stream) {
        net::async_write(stream, net::buffer(*cont),
                         [self = shared_from_this(), cont](error_code ec, size_t) {
                           if (ec) return self->Close();
                           self->ReadBody();
                         });
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    if (closed_) return;
    WithStream([&](auto& stream) {
      http::async_read(stream, buffer_, *parser_,
                       [self = shared_from_this()](error_code ec, size_t) { self->OnBody(ec); });
    });
  }

  void OnReadError(error_code ec) {
    const bool started = buffer_.size() > 0 || parser_->got_some();
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::ssl::error::stream_truncated) {
      return Close();
    }
    if (read_timed_out_) {
      if (!started) return Close();  // an idle keep-alive connection
      return ErrorAndClose(408, "request not received within the read timeout");
    }
    if (ec == http::error::body_limit) {
      return ErrorAndClose(413, absl::StrCat("request body over ",
                                             server_->options_.max_body_bytes, " bytes"));
    }
    if (ec == http::error::header_limit) {
      return ErrorAndClose(431, absl::StrCat("request headers over ",
                                             server_->options_.max_header_bytes, " bytes"));
    }
    if (ec == net::error::operation_aborted) return Close();
    ErrorAndClose(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }

  // A protocol-level error: a JSON body like the API's, then the connection closes.
  void ErrorAndClose(int status, absl::string_view message) {
    Disarm();
    keep_alive_ = false;
    version_ = 11;
    in_request_ = true;
    response_started_ = true;
    std::string body = absl::StrCat(R"({"error":{"message":")", message,
                                    R"(","type":"invalid_request_error","param":null,"code":null}})",
                                    "\n");
    std::string out = StatusLine(status, {{"Content-Type", "application/json"}});
    absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n", body);
    Enqueue(std::move(out), nullptr, /*last=*/true);
  }

  void OnBody(error_code ec) {
    if (closed_) return;
    if (ec) return OnReadError(ec);
    Disarm();
    http::request<http::string_body> msg = parser_->release();
    parser_.reset();
    HttpRequest request;
    request.method = std::string(msg.method_string());
    const std::string target(msg.target());
    const size_t q = target.find('?');
    request.path = target.substr(0, q);
    if (q != std::string::npos) request.query = target.substr(q + 1);
    for (const auto& field : msg) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request.body = std::move(msg.body());
    version_ = msg.version();
    keep_alive_ = msg.keep_alive();
    ++generation_;
    in_request_ = true;
    response_started_ = false;
    stream_ended_ = false;
    chunked_ = false;
    on_gone_ = nullptr;
    Watch(generation_);
    server_->handler_(std::move(request), MakeResponder());
  }

  // Watches the socket while the handler works: EOF or an error means the client left.
  void Watch(uint64_t generation) {
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this(), generation](error_code ec) {
                         if (self->closed_ || generation != self->generation_ ||
                             !self->in_request_ || ec == net::error::operation_aborted) {
                           return;
                         }
                         char c;
                         const ssize_t n = ::recv(self->socket_.native_handle(), &c, 1,
                                                  MSG_PEEK | MSG_DONTWAIT);
                         if (n > 0) return;  // a pipelined request: read after this response
                         if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
                           return self->Watch(generation);
                         }
                         self->Close();
                       });
  }

  std::shared_ptr<HttpResponder> MakeResponder();

  void Enqueue(std::string data, std::function<void(bool)> done, bool last) {
    writes_.push_back({std::move(data), std::move(done), last});
    if (!writing_) WriteNext();
  }
  void WriteNext() {
    if (closed_ || writes_.empty()) {
      writing_ = false;
      return;
    }
    writing_ = true;
    Arm(server_->options_.write_timeout, /*reading=*/false);
    WithStream([&](auto& stream) {
      net::async_write(stream, net::buffer(writes_.front().data),
                       [self = shared_from_this()](error_code ec, size_t) { self->OnWritten(ec); });
    });
  }
  void OnWritten(error_code ec) {
    writing_ = false;
    if (closed_) return;
    Disarm();
    Pending p = std::move(writes_.front());
    writes_.pop_front();
    if (ec) {
      if (p.done) p.done(false);
      return Close();
    }
    if (p.done) p.done(true);
    if (closed_) return;
    if (p.last) {
      in_request_ = false;
      on_gone_ = nullptr;
      if (!keep_alive_) return LingerClose();
      return ReadHeader();
    }
    WriteNext();
  }

  // Ends our side, then reads and drops what the client still sends (the rest of a refused
  // body) for up to a second before closing: closing with unread data would reset the connection
  // and could destroy the response before the client reads it.
  void LingerClose() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    Arm(absl::Seconds(1), /*reading=*/false);
    Drain();
  }
  void Drain() {
    if (closed_) return;
    socket_.async_read_some(net::buffer(scratch_), [self = shared_from_this()](error_code ec,
                                                                               size_t) {
      if (ec) return self->Close();
      self->Drain();
    });
  }

  const std::shared_ptr<HttpServer::Impl> server_;
  tcp::socket socket_;
  // TLS: the context this connection was accepted with (a reload swaps the server's, not this
  // one) and the stream over socket_. The close and drain paths use socket_ directly: nothing
  // sent after the response matters, so no TLS close_notify is exchanged.
  const std::shared_ptr<net::ssl::context> tls_context_;
  std::optional<net::ssl::stream<tcp::socket&>> tls_;
  char scratch_[16384];
  net::steady_timer timer_;
  uint64_t timer_seq_ = 0;
  bool read_timed_out_ = false;
  boost::beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t generation_ = 0;
  bool closed_ = false;
  bool in_request_ = false;
  bool response_started_ = false;
  bool stream_ended_ = false;
  bool chunked_ = false;
  bool keep_alive_ = true;
  unsigned version_ = 11;
  std::function<void()> on_gone_;
  std::deque<Pending> writes_;
  bool writing_ = false;
};

class Responder final : public HttpResponder {
 public:
  Responder(std::shared_ptr<Session> session, uint64_t generation)
      : session_(std::move(session)), generation_(generation) {}
  ~Responder() override {
    session_->Post([s = session_, g = generation_] { s->Abandoned(g); });
  }
  void Respond(int status, HttpHeaders headers, std::string body) override {
    session_->Post([s = session_, g = generation_, status, h = std::move(headers),
                    b = std::move(body)]() mutable { s->Respond(g, status, std::move(h), std::move(b)); });
  }
  void StartStream(int status, HttpHeaders headers) override {
    session_->Post([s = session_, g = generation_, status, h = std::move(headers)]() mutable {
      s->StartStream(g, status, std::move(h));
    });
  }
  void Write(std::string data, std::function<void(bool)> done) override {
    session_->Post([s = session_, g = generation_, d = std::move(data),
                    f = std::move(done)]() mutable { s->Write(g, std::move(d), std::move(f)); });
  }
  void EndStream() override {
    session_->Post([s = session_, g = generation_] { s->EndStream(g); });
  }
  void OnClientGone(std::function<void()> on_gone) override {
    session_->Post([s = session_, g = generation_, f = std::move(on_gone)]() mutable {
      s->OnClientGone(g, std::move(f));
    });
  }

 private:
  const std::shared_ptr<Session> session_;
  const uint64_t generation_;
};

std::shared_ptr<HttpResponder> Session::MakeResponder() {
  return std::make_shared<Responder>(shared_from_this(), generation_);
}

}  // namespace

absl::Status HttpServer::Impl::Bind() {
  absl::StatusOr<HostPort> hp =
      ParseHostPort("listen_address", options_.listen_address, /*allow_port_zero=*/true);
  if (!hp.ok()) return hp.status();
  error_code ec;
  std::string host = hp->host == "localhost" ? "127.0.0.1" : hp->host;
  const net::ip::address address = net::ip::make_address(host, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen_address: expected an IP address literal or localhost; got \"", hp->host, "\""));
  }
  const tcp::endpoint endpoint(address, hp->port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.listen_address, ": ", ec.message()));
  }
  port_ = acceptor_.local_endpoint().port();
  return absl::OkStatus();
}

void HttpServer::Impl::Accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [self = shared_from_this()](error_code ec,
                                                                            tcp::socket socket) {
    if (self->stopped_) return;
    if (!ec) {
      if (self->connections_.load() >= self->options_.max_connections) {
        error_code ignored;
        socket.close(ignored);
      } else {
        error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto session = std::make_shared<Session>(self, std::move(socket), self->TlsContext());
        {
          absl::MutexLock lock(&self->mu_);
          auto& v = self->sessions_;
          if (v.size() > 64 && v.size() > 2 * static_cast<size_t>(self->connections_.load())) {
            v.erase(std::remove_if(v.begin(), v.end(),
                                   [](const std::weak_ptr<Session>& w) { return w.expired(); }),
                    v.end());
          }
          v.push_back(session);
        }
        session->Post([session] { session->Run(); });
      }
    }
    self->Accept();
  });
}

void HttpServer::Impl::PollTls() {
  tls_timer_->expires_after(ToSteady(options_.tls_reload_interval));
  tls_timer_->async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->stopped_) return;
    const HttpServerOptions& o = self->options_;
    absl::StatusOr<absl::Time> modified = TlsFilesModified(o.tls_cert_file, o.tls_key_file);
    if (modified.ok() && *modified != self->tls_modified_) {
      absl::StatusOr<TlsFiles> files = LoadTlsFiles(o.tls_cert_file, o.tls_key_file);
      absl::StatusOr<std::shared_ptr<net::ssl::context>> context =
          files.ok() ? MakeTlsContext(*files) : files.status();
      if (context.ok()) {
        self->tls_modified_ = *modified;
        absl::MutexLock lock(&self->mu_);
        self->tls_context_ = std::move(*context);
        spdlog::info("HTTP API: reloaded the TLS certificate from {}", o.tls_cert_file);
      } else {
        // Half-replaced files (the key written, the certificate not yet) look like this too:
        // keep serving the old pair and look again next time.
        spdlog::warn("HTTP API: keeping the previous TLS certificate: {}",
                     context.status().ToString());
      }
    }
    self->PollTls();
  });
}

void HttpServer::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  net::post(acceptor_.get_executor(), [self = shared_from_this()] {
    error_code ignored;
    self->acceptor_.close(ignored);
  });
  std::vector<std::weak_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions.swap(sessions_);
  }
  for (const std::weak_ptr<Session>& w : sessions) {
    if (std::shared_ptr<Session> s = w.lock()) s->Post([s] { s->Close(); });
  }
  // Closing runs the client-gone callbacks; give their owners a moment to let go.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (connections_.load() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  if (tls_timer_.has_value()) {
    net::post(ioc_, [self = shared_from_this()] { self->tls_timer_->cancel(); });
  }
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                             HttpHandler handler) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads: expected >= 1; got ", options.threads));
  }
  if (options.read_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("read_timeout and write_timeout: expected > 0");
  }
  if (handler == nullptr) return absl::InvalidArgumentError("handler: expected non-null");
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (tls && options.tls_reload_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("tls_reload_interval: expected > 0");
  }
  auto impl = std::make_shared<Impl>(std::move(options), std::move(handler));
  if (tls) {
    const HttpServerOptions& o = impl->options_;
    absl::StatusOr<absl::Time> modified = TlsFilesModified(o.tls_cert_file, o.tls_key_file);
    absl::StatusOr<TlsFiles> files = LoadTlsFiles(o.tls_cert_file, o.tls_key_file);
    if (!files.ok()) return files.status();
    if (!modified.ok()) return modified.status();
    absl::StatusOr<std::shared_ptr<net::ssl::context>> context = MakeTlsContext(*files);
    if (!context.ok()) return context.status();
    impl->tls_modified_ = *modified;
    {
      absl::MutexLock lock(&impl->mu_);
      impl->tls_context_ = std::move(*context);
    }
    impl->tls_timer_.emplace(impl->ioc_);
    impl->PollTls();
  }
  if (absl::Status s = impl->Bind(); !s.ok()) return s;
  impl->Accept();
  for (int i = 0; i < impl->options_.threads; ++i) {
    impl->threads_.emplace_back([ioc = &impl->ioc_] { ioc->run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port_; }

void HttpServer::Stop() { impl_->Stop(); }

}  // namespace deepinfer
