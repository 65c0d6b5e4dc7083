// K8sScaler against a real HTTP/1.1 server on 127.0.0.1 that implements the Deployment scale
// subresource as the Kubernetes API server does (bearer token, merge-patch, metav1.Status
// errors), with injectable failures and delays.
#include "router/k8s_scaler.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer::router {
namespace {

using ::testing::HasSubstr;

constexpr char kNamespace[] = "infer-ns";
constexpr char kToken[] = "test-token-1";

struct RecordedRequest {
  std::string method;
  std::string path;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// A one-connection-at-a-time HTTP/1.1 server implementing
// /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale (GET, PATCH merge-patch).
class FakeApiServer {
 public:
  FakeApiServer() = default;
  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;
  ~FakeApiServer() { Stop(); }

  void Start() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(listen_fd_, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    ASSERT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ASSERT_EQ(listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    ASSERT_EQ(pipe2(wake_, O_CLOEXEC), 0);
    thread_ = std::thread([this] { Loop(); });
  }

  void Stop() {
    if (!thread_.joinable()) return;
    char byte = 1;
    (void)!write(wake_[1], &byte, 1);
    thread_.join();
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }

  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }

  void SetDeployment(const std::string& name, int replicas) {
    absl::MutexLock lock(&mu_);
    replicas_[name] = replicas;
  }
  int Replicas(const std::string& name) {
    absl::MutexLock lock(&mu_);
    return replicas_.at(name);
  }
  void SetToken(const std::string& token) {
    absl::MutexLock lock(&mu_);
    token_ = token;
  }
  // Every request for `name` gets `code` with `body` (a metav1.Status when body is empty).
  void Force(const std::string& name, int code, std::string body = "") {
    absl::MutexLock lock(&mu_);
    forced_[name] = {code, std::move(body)};
  }
  // Every answer waits this long first (interrupted by Stop).
  void SetDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }
  std::vector<RecordedRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  // Waits for `fd` to be readable; false when woken by Stop().
  bool WaitReadable(int fd, int timeout_ms) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int n = poll(fds, 2, timeout_ms);
    return n > 0 && fds[1].revents == 0;
  }

  void Loop() {
    while (WaitReadable(listen_fd_, -1)) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      Serve(fd);
      close(fd);
    }
  }

  void Serve(int fd) {
    std::string buf;
    char chunk[4096];
    size_t head_end;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!WaitReadable(fd, 5000)) return;
      ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return;
      buf.append(chunk, n);
    }
    RecordedRequest req;
    std::vector<std::string> lines = absl::StrSplit(buf.substr(0, head_end), "\r\n");
    std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
    if (first.size() != 3) return;
    req.method = first[0];
    req.path = first[1];
    for (size_t i = 1; i < lines.size(); ++i) {
      size_t colon = lines[i].find(':');
      if (colon == std::string::npos) continue;
      req.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    size_t content_length = 0;
    if (req.headers.count("content-length") &&
        !absl::SimpleAtoi(req.headers["content-length"], &content_length)) {
      return;
    }
    req.body = buf.substr(head_end + 4);
    while (req.body.size() < content_length) {
      if (!WaitReadable(fd, 5000)) return;
      ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return;
      req.body.append(chunk, n);
    }
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(req);
      delay = delay_;
    }
    if (delay > absl::ZeroDuration() &&
        !WaitReadable(wake_[0], static_cast<int>(absl::ToInt64Milliseconds(delay)))) {
      // Woken by Stop() (the wake pipe is readable) or the delay passed: answer only in the
      // latter case.
      pollfd p = {wake_[0], POLLIN, 0};
      if (poll(&p, 1, 0) > 0) return;
    }
    auto [code, body] = Handle(req);
    std::string response = absl::StrCat(
        "HTTP/1.1 ", code, " X\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
        "\r\nConnection: close\r\n\r\n", body);
    size_t sent = 0;
    while (sent < response.size()) {
      ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += n;
    }
  }

  static std::pair<int, std::string> Status(int code, const std::string& reason,
                                            const std::string& message) {
    nlohmann::json j = {{"kind", "Status"},   {"apiVersion", "v1"}, {"status", "Failure"},
                        {"message", message}, {"reason", reason},   {"code", code}};
    return {code, j.dump()};
  }

  std::pair<int, std::string> Handle(const RecordedRequest& req) {
    absl::MutexLock lock(&mu_);
    const std::string prefix =
        absl::StrCat("/apis/apps/v1/namespaces/", kNamespace, "/deployments/");
    if (!absl::StartsWith(req.path, prefix) || !absl::EndsWith(req.path, "/scale")) {
      return Status(404, "NotFound", "the server could not find the requested resource");
    }
    std::string name =
        req.path.substr(prefix.size(), req.path.size() - prefix.size() - std::strlen("/scale"));
    auto auth = req.headers.find("authorization");
    if (auth == req.headers.end() || auth->second != absl::StrCat("Bearer ", token_)) {
      return Status(401, "Unauthorized", "Unauthorized");
    }
    if (auto f = forced_.find(name); f != forced_.end()) {
      if (!f->second.second.empty()) return f->second;
      return Status(
          f->second.first, "Forced",
          absl::StrCat("forced ", f->second.first, " for deployments.apps \"", name, "\""));
    }
    auto it = replicas_.find(name);
    if (it == replicas_.end()) {
      return Status(404, "NotFound", absl::StrCat("deployments.apps \"", name, "\" not found"));
    }
    if (req.method == "PATCH") {
      auto ct = req.headers.find("content-type");
      if (ct == req.headers.end() || ct->second != "application/merge-patch+json") {
        return Status(415, "UnsupportedMediaType", "expected a merge patch");
      }
      nlohmann::json patch = nlohmann::json::parse(req.body, nullptr, false);
      if (!patch.is_object() || patch.size() != 1 || !patch.contains("spec") ||
          !patch["spec"].is_object() || patch["spec"].size() != 1 ||
          !patch["spec"].contains("replicas") || !patch["spec"]["replicas"].is_number_integer()) {
        return Status(400, "BadRequest", absl::StrCat("unexpected patch ", req.body));
      }
      it->second = patch["spec"]["replicas"].get<int>();
    } else if (req.method != "GET") {
      return Status(405, "MethodNotAllowed", req.method);
    }
    nlohmann::json scale = {{"kind", "Scale"},
                            {"apiVersion", "autoscaling/v1"},
                            {"metadata", {{"name", name}, {"namespace", kNamespace}}},
                            {"status", {{"replicas", it->second}, {"selector", "app=x"}}}};
    // Like the API server, omit spec.replicas when it is 0.
    scale["spec"] = nlohmann::json::object();
    if (it->second != 0) scale["spec"]["replicas"] = it->second;
    return {200, scale.dump()};
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::map<std::string, int> replicas_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_) = kToken;
  std::map<std::string, std::pair<int, std::string>> forced_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedRequest> requests_ ABSL_GUARDED_BY(mu_);
};

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
  return path;
}

class K8sScalerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.Start();
    server_.SetDeployment("deepinfer-prefill", 2);
    server_.SetDeployment("deepinfer-decode", 1);
    token_path_ = WriteTempFile("token", absl::StrCat(kToken, "\n"));
  }

  K8sScalerOptions Options() {
    K8sScalerOptions o;
    o.api_server = server_.url();
    o.token_path = token_path_;
    o.k8s_namespace = kNamespace;
    o.deployments = {{Pool::kPrefill, "deepinfer-prefill"}, {Pool::kDecode, "deepinfer-decode"}};
    o.timeout = absl::Seconds(5);
    return o;
  }

  std::unique_ptr<K8sScaler> Scaler(K8sScalerOptions options) {
    absl::StatusOr<std::unique_ptr<K8sScaler>> s = K8sScaler::Create(std::move(options));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  FakeApiServer server_;
  std::string token_path_;
};

TEST_F(K8sScalerTest, GetAndPatchTheScaleSubresource) {
  std::unique_ptr<K8sScaler> scaler = Scaler(Options());
  ASSERT_NE(scaler, nullptr);
  EXPECT_EQ(*scaler->GetReplicas(Pool::kPrefill), 2);
  EXPECT_EQ(*scaler->GetReplicas(Pool::kDecode), 1);
  ASSERT_TRUE(scaler->SetReplicas(Pool::kDecode, 5).ok());
  EXPECT_EQ(server_.Replicas("deepinfer-decode"), 5);
  EXPECT_EQ(server_.Replicas("deepinfer-prefill"), 2);
  EXPECT_EQ(*scaler->GetReplicas(Pool::kDecode), 5);
  // Scale to zero: the API server then omits spec.replicas.
  ASSERT_TRUE(scaler->SetReplicas(Pool::kPrefill, 0).ok());
  EXPECT_EQ(*scaler->GetReplicas(Pool::kPrefill), 0);

  std::vector<RecordedRequest> requests = server_.requests();
  ASSERT_EQ(requests.size(), 6u);
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[0].path,
            "/apis/apps/v1/namespaces/infer-ns/deployments/deepinfer-prefill/scale");
  EXPECT_EQ(requests[0].headers["authorization"], "Bearer test-token-1");
  EXPECT_EQ(requests[0].headers["accept"], "application/json");
  EXPECT_TRUE(requests[0].body.empty());
  const RecordedRequest& patch = requests[2];
  EXPECT_EQ(patch.method, "PATCH");
  EXPECT_EQ(patch.path, "/apis/apps/v1/namespaces/infer-ns/deployments/deepinfer-decode/scale");
  EXPECT_EQ(patch.headers.at("authorization"), "Bearer test-token-1");
  EXPECT_EQ(patch.headers.at("content-type"), "application/merge-patch+json");
  EXPECT_EQ(nlohmann::json::parse(patch.body), nlohmann::json::parse(R"({"spec":{"replicas":5}})"));
  EXPECT_EQ(nlohmann::json::parse(requests[4].body),
            nlohmann::json::parse(R"({"spec":{"replicas":0}})"));
}

TEST_F(K8sScalerTest, TokenIsReReadOnEveryRequest) {
  std::unique_ptr<K8sScaler> scaler = Scaler(Options());
  ASSERT_NE(scaler, nullptr);
  ASSERT_TRUE(scaler->GetReplicas(Pool::kDecode).ok());
  // The API server moves to a rotated token; until the file has it, requests are refused.
  server_.SetToken("rotated-token-2");
  absl::StatusOr<int> refused = scaler->GetReplicas(Pool::kDecode);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.status().message(), HasSubstr("deployment infer-ns/deepinfer-decode"));
  WriteTempFile("token", "rotated-token-2");
  EXPECT_EQ(*scaler->GetReplicas(Pool::kDecode), 1);
}

TEST_F(K8sScalerTest, MissingTokenFileIsFailedPrecondition) {
  K8sScalerOptions o = Options();
  o.token_path = absl::StrCat(::testing::TempDir(), "/no-such-token");
  std::unique_ptr<K8sScaler> scaler = Scaler(o);
  ASSERT_NE(scaler, nullptr);
  absl::Status s = scaler->SetReplicas(Pool::kPrefill, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("deployment infer-ns/deepinfer-prefill (pool prefill)"));
  EXPECT_THAT(s.message(), HasSubstr("no-such-token"));
  EXPECT_TRUE(server_.requests().empty());
}

TEST_F(K8sScalerTest, HttpErrorsMapToStatusCodesNamingTheDeployment) {
  std::unique_ptr<K8sScaler> scaler = Scaler(Options());
  ASSERT_NE(scaler, nullptr);
  const std::vector<std::pair<int, absl::StatusCode>> cases = {
      {400, absl::StatusCode::kInvalidArgument}, {403, absl::StatusCode::kPermissionDenied},
      {404, absl::StatusCode::kNotFound},        {409, absl::StatusCode::kAborted},
      {422, absl::StatusCode::kInvalidArgument}, {429, absl::StatusCode::kResourceExhausted},
      {500, absl::StatusCode::kUnavailable},     {503, absl::StatusCode::kUnavailable},
      {418, absl::StatusCode::kUnknown},
  };
  for (const auto& [http, code] : cases) {
    SCOPED_TRACE(http);
    server_.Force("deepinfer-decode", http);
    absl::StatusOr<int> get = scaler->GetReplicas(Pool::kDecode);
    absl::Status set = scaler->SetReplicas(Pool::kDecode, 4);
    for (const absl::Status& s : {get.status(), set}) {
      EXPECT_EQ(s.code(), code) << s;
      EXPECT_THAT(s.message(), HasSubstr("deployment infer-ns/deepinfer-decode (pool decode)"));
      EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("HTTP ", http)));
      // The API server's own explanation is passed on.
      EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("forced ", http, " for deployments.apps")));
    }
  }
  EXPECT_THAT(scaler->SetReplicas(Pool::kDecode, 4).message(), HasSubstr("PATCH http://"));
  // The other pool is unaffected, and nothing was changed.
  EXPECT_EQ(*scaler->GetReplicas(Pool::kPrefill), 2);
  EXPECT_EQ(server_.Replicas("deepinfer-decode"), 1);
}

TEST_F(K8sScalerTest, MissingDeploymentIsNotFound) {
  K8sScalerOptions o = Options();
  o.deployments[Pool::kEncoder] = "deepinfer-encoder";
  std::unique_ptr<K8sScaler> scaler = Scaler(o);
  ASSERT_NE(scaler, nullptr);
  absl::Status s = scaler->SetReplicas(Pool::kEncoder, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("deployment infer-ns/deepinfer-encoder (pool encoder)"));
  EXPECT_THAT(s.message(), HasSubstr("deployments.apps \"deepinfer-encoder\" not found"));
}

TEST_F(K8sScalerTest, UnconfiguredPoolAndNegativeCountSendNothing) {
  K8sScalerOptions o = Options();
  o.deployments.erase(Pool::kPrefill);
  std::unique_ptr<K8sScaler> scaler = Scaler(o);
  ASSERT_NE(scaler, nullptr);
  absl::StatusOr<int> get = scaler->GetReplicas(Pool::kPrefill);
  EXPECT_EQ(get.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(get.status().message(), HasSubstr("pool prefill"));
  absl::Status negative = scaler->SetReplicas(Pool::kDecode, -2);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(),
              HasSubstr("deployment infer-ns/deepinfer-decode (pool decode): replicas: expected "
                        ">= 0, got -2"));
  EXPECT_TRUE(server_.requests().empty());
}

TEST_F(K8sScalerTest, AnswerThatIsNotAScaleIsInternal) {
  std::unique_ptr<K8sScaler> scaler = Scaler(Options());
  ASSERT_NE(scaler, nullptr);
  server_.Force("deepinfer-decode", 200, R"({"kind":"Deployment"})");
  absl::StatusOr<int> get = scaler->GetReplicas(Pool::kDecode);
  EXPECT_EQ(get.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(get.status().message(), HasSubstr("deployment infer-ns/deepinfer-decode"));
  // A patch answered with a different spec.replicas: someone else changed it.
  server_.Force("deepinfer-decode", 200, R"({"kind":"Scale","spec":{"replicas":7}})");
  absl::Status set = scaler->SetReplicas(Pool::kDecode, 3);
  EXPECT_EQ(set.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(set.message(), HasSubstr("asked for 3 replicas"));
}

TEST_F(K8sScalerTest, ConnectionRefusedIsUnavailable) {
  // A bound socket that does not listen refuses connections.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  K8sScalerOptions o = Options();
  o.api_server = absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port));
  std::unique_ptr<K8sScaler> scaler = Scaler(o);
  ASSERT_NE(scaler, nullptr);
  absl::Status s = scaler->SetReplicas(Pool::kPrefill, 3);
  close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("deployment infer-ns/deepinfer-prefill (pool prefill)"));
}

TEST_F(K8sScalerTest, SlowApiServerIsDeadlineExceeded) {
  K8sScalerOptions o = Options();
  o.timeout = absl::Milliseconds(200);
  std::unique_ptr<K8sScaler> scaler = Scaler(o);
  ASSERT_NE(scaler, nullptr);
  server_.SetDelay(absl::Seconds(3));
  const absl::Time start = absl::Now();
  absl::StatusOr<int> get = scaler->GetReplicas(Pool::kDecode);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(get.status().code(), absl::StatusCode::kDeadlineExceeded) << get.status();
  EXPECT_THAT(get.status().message(), HasSubstr("deployment infer-ns/deepinfer-decode"));
  EXPECT_LT(took, absl::Seconds(2));
  server_.Stop();  // Interrupts the delayed answer.
}

TEST_F(K8sScalerTest, HttpsWithAnUnusableCaFailsAsUnavailable) {
  K8sScalerOptions o = Options();
  // The peer speaks plain HTTP and the CA bundle is not a certificate: no TLS session.
  o.api_server =
      absl::StrCat("https://127.0.0.1:", absl::StripPrefix(server_.url(), "http://127.0.0.1:"));
  o.ca_path = WriteTempFile("ca.crt", "not a certificate\n");
  std::unique_ptr<K8sScaler> scaler = Scaler(o);
  ASSERT_NE(scaler, nullptr);
  absl::StatusOr<int> get = scaler->GetReplicas(Pool::kPrefill);
  EXPECT_EQ(get.status().code(), absl::StatusCode::kUnavailable) << get.status();
  EXPECT_THAT(get.status().message(), HasSubstr("deployment infer-ns/deepinfer-prefill"));
}

TEST(K8sScalerCreateTest, InClusterDefaultsFromEnvironmentAndFiles) {
  std::string ca = WriteTempFile("incluster-ca.crt", "-----BEGIN CERTIFICATE-----\n");
  std::string ns = WriteTempFile("incluster-namespace", "team-a\n");
  ASSERT_EQ(setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1), 0);
  ASSERT_EQ(setenv("KUBERNETES_SERVICE_PORT", "443", 1), 0);
  K8sScalerOptions o;
  o.ca_path = ca;
  o.namespace_path = ns;
  o.deployments = {{Pool::kDecode, "deepinfer-decode"}};
  absl::StatusOr<std::unique_ptr<K8sScaler>> s = K8sScaler::Create(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->options().api_server, "https://[fd00::1]:443");
  EXPECT_EQ((*s)->options().k8s_namespace, "team-a");
  EXPECT_EQ(*(*s)->ScaleUrl(Pool::kDecode),
            "https://[fd00::1]:443/apis/apps/v1/namespaces/team-a/deployments/deepinfer-decode/"
            "scale");

  ASSERT_EQ(setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1), 0);
  s = K8sScaler::Create(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->options().api_server, "https://10.96.0.1:443");

  ASSERT_EQ(unsetenv("KUBERNETES_SERVICE_HOST"), 0);
  s = K8sScaler::Create(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("KUBERNETES_SERVICE_HOST"));
  unsetenv("KUBERNETES_SERVICE_PORT");
}

TEST(K8sScalerCreateTest, RejectsBadOptionsNamingTheField) {
  K8sScalerOptions good;
  good.api_server = "http://127.0.0.1:1";
  good.k8s_namespace = "ns";
  good.deployments = {{Pool::kDecode, "deepinfer-decode"}};
  ASSERT_TRUE(K8sScaler::Create(good).ok());

  auto expect = [](K8sScalerOptions o, absl::StatusCode code, absl::string_view text) {
    absl::StatusOr<std::unique_ptr<K8sScaler>> s = K8sScaler::Create(std::move(o));
    EXPECT_EQ(s.status().code(), code) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr(text));
  };
  K8sScalerOptions o = good;
  o.deployments[Pool::kPrefill] = "Prefill_1";
  expect(o, absl::StatusCode::kInvalidArgument,
         "deployments[prefill]: expected a DNS-1123 subdomain, got \"Prefill_1\"");
  o = good;
  o.deployments.clear();
  expect(o, absl::StatusCode::kInvalidArgument, "deployments: expected at least one pool");
  o = good;
  o.k8s_namespace = "a/b";
  expect(o, absl::StatusCode::kInvalidArgument, "k8s_namespace: expected a DNS-1123 label");
  o = good;
  o.api_server = "http://host:1/api";
  expect(o, absl::StatusCode::kInvalidArgument, "api_server: expected");
  o = good;
  o.api_server = "ftp://host";
  expect(o, absl::StatusCode::kInvalidArgument, "api_server: expected");
  o = good;
  o.timeout = absl::ZeroDuration();
  expect(o, absl::StatusCode::kInvalidArgument, "timeout: expected");
  o = good;
  o.api_server = "https://10.0.0.1:443";
  o.ca_path = "/nonexistent/ca.crt";
  expect(o, absl::StatusCode::kFailedPrecondition, "ca_path: cannot read \"/nonexistent/ca.crt\"");
  o = good;
  o.k8s_namespace = "";
  o.namespace_path = "/nonexistent/namespace";
  expect(o, absl::StatusCode::kFailedPrecondition, "namespace_path: cannot read");
}

}  // namespace
}  // namespace deepinfer::router
