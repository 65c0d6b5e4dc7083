// TLS on the router's public listeners, from outside: a router process started with
// --tls_cert_file/--tls_key_file made by the openssl CLI at test time (a throwaway CA and a
// leaf for 127.0.0.1/localhost; no key is committed), serving gRPC and the HTTP API. A gRPC
// client and curl trusting the CA get answers (the HTTP API's relay into gRPC included) and
// plaintext clients are refused; after the files are replaced with a pair from a new CA, new
// connections on both listeners present the new certificate without a restart.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process_lifecycle.h"
#include "common/subprocess.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Runs a shell command; its output goes to the test log.
void Sh(const std::string& command) {
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// A CA `dir`/ca.pem and a leaf `dir`/cert.pem + `dir`/key.pem it signed, for 127.0.0.1.
void MakePki(const fs::path& dir, const std::string& name) {
  fs::create_directories(dir);
  const std::string d = dir.string();
  Sh(absl::StrCat("cd ", d, " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
                  "-nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=", name, "-ca 2>/dev/null"));
  Sh(absl::StrCat("cd ", d, " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
                  "-keyout key.pem -out leaf.csr -subj /CN=", name, " 2>/dev/null"));
  std::ofstream(dir / "ext.cnf") << "subjectAltName=IP:127.0.0.1,DNS:localhost\n";
  Sh(absl::StrCat("cd ", d, " && openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key "
                  "-CAcreateserial -days 1 -extfile ext.cnf -out cert.pem 2>/dev/null"));
}

// Copies `from`'s pair over the served files: each by rename, key first, so the watcher never
// reads a half-written file.
void Install(const fs::path& from, const fs::path& served) {
  for (const char* file : {"key.pem", "cert.pem"}) {
    fs::copy_file(from / file, served / absl::StrCat(file, ".tmp"),
                  fs::copy_options::overwrite_existing);
    fs::rename(served / absl::StrCat(file, ".tmp"), served / file);
  }
}

// A ListModels call over a fresh channel (a new connection) with `credentials`.
grpc::Status ListModels(const std::string& target,
                        std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  // Distinct channels must not share a subchannel (and so a connection made before a reload).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::Inference::NewStub(grpc::CreateCustomChannel(target, credentials, args));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListModelsRequest request;
  v1::ListModelsResponse response;
  grpc::Status status = stub->ListModels(&context, request, &response);
  if (status.ok() && response.models_size() == 0) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "no models listed");
  }
  return status;
}

// The HTTP status curl gets for `url` trusting `ca` ("" = plain http); "000" when the
// connection or handshake fails.
std::string Curl(const std::string& url, const fs::path& ca, const fs::path& out) {
  const std::string command = absl::StrCat(
      "curl -s -m 5 -o ", out.string(), " -w '%{http_code}' ",
      ca.empty() ? std::string() : absl::StrCat("--cacert ", ca.string(), " "), url,
      " > ", out.string(), ".code");
  (void)std::system(command.c_str());
  return ReadFile(out.string() + ".code");
}

std::shared_ptr<grpc::ChannelCredentials> Trusting(const fs::path& ca) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadFile(ca);
  return grpc::SslCredentials(options);
}

class RouterTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(std::getenv("TEST_TMPDIR")) / "tls";
    fs::remove_all(root_);
    MakePki(root_ / "a", "first");
    MakePki(root_ / "b", "second");
    fs::create_directories(root_ / "served");
    Install(root_ / "a", root_ / "served");
  }

  // Starts the router with TLS from root_/served; returns its gRPC target.
  std::string StartRouter(std::vector<std::string> extra = {}) {
    SubprocessOptions options;
    options.argv = {"router/router",
                    "--model=engine/testdata/models/llama",
                    "--listen=127.0.0.1:0",
                    absl::StrCat("--port_file=", (root_ / "port").string()),
                    "--allow_anonymous",
                    absl::StrCat("--tls_cert_file=", (root_ / "served" / "cert.pem").string()),
                    absl::StrCat("--tls_key_file=", (root_ / "served" / "key.pem").string()),
                    "--tls_reload_interval=1s",
                    "--http_listen=127.0.0.1:0",
                    absl::StrCat("--http_port_file=", (root_ / "http_port").string())};
    for (std::string& flag : extra) options.argv.push_back(std::move(flag));
    options.log_path = (root_ / "router.log").string();
    absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return "";
    router_ = std::move(*started);
    absl::StatusOr<int> port = ReadPortFile((root_ / "port").string(), absl::Seconds(60));
    if (!port.ok()) {
      ADD_FAILURE() << "router did not start: " << port.status() << "\n"
                    << TailFile(options.log_path);
      return "";
    }
    absl::StatusOr<int> http_port =
        ReadPortFile((root_ / "http_port").string(), absl::Seconds(30));
    if (!http_port.ok()) {
      ADD_FAILURE() << "no HTTP port: " << http_port.status();
      return "";
    }
    http_port_ = *http_port;
    return absl::StrCat("127.0.0.1:", *port);
  }

  std::string HttpUrl(absl::string_view scheme, absl::string_view path) const {
    return absl::StrCat(scheme, "://127.0.0.1:", http_port_, path);
  }

  fs::path root_;
  std::unique_ptr<Subprocess> router_;
  int http_port_ = 0;
};

TEST_F(RouterTlsTest, HttpsServesTlsRefusesPlaintextAndReloadsWithoutRestart) {
  ASSERT_FALSE(StartRouter().empty());
  const fs::path out = root_ / "curl.out";
  // /v1/models answers from the router itself; a chat request goes through the relay into the
  // gRPC server (503: no worker registered, decided by the Inference service).
  EXPECT_EQ(Curl(HttpUrl("https", "/v1/models"), root_ / "a" / "ca.pem", out), "200");
  EXPECT_NE(ReadFile(out).find("llama"), std::string::npos) << ReadFile(out);
  const std::string chat = absl::StrCat(
      "-H 'Content-Type: application/json' -d '{\"model\":\"llama\",\"messages\":"
      "[{\"role\":\"user\",\"content\":\"hi\"}]}' ",
      HttpUrl("https", "/v1/chat/completions"));
  EXPECT_EQ(Curl(chat, root_ / "a" / "ca.pem", out), "503") << ReadFile(out);
  // The Inference service's own answer, not a relay that could not connect.
  EXPECT_NE(ReadFile(out).find("no decode worker"), std::string::npos) << ReadFile(out);
  EXPECT_EQ(Curl(HttpUrl("http", "/v1/models"), "", out), "000");
  EXPECT_EQ(Curl(HttpUrl("https", "/v1/models"), root_ / "b" / "ca.pem", out), "000");

  Install(root_ / "b", root_ / "served");
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (absl::Now() < deadline &&
         Curl(HttpUrl("https", "/v1/models"), root_ / "b" / "ca.pem", out) != "200") {
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(Curl(HttpUrl("https", "/v1/models"), root_ / "b" / "ca.pem", out), "200");
  EXPECT_EQ(Curl(HttpUrl("https", "/v1/models"), root_ / "a" / "ca.pem", out), "000");
  EXPECT_EQ(Curl(chat, root_ / "b" / "ca.pem", out), "503") << ReadFile(out);
  EXPECT_TRUE(router_->Running()) << TailFile(router_->log_path());
}

TEST_F(RouterTlsTest, GrpcServesTlsRefusesPlaintextAndReloadsWithoutRestart) {
  const std::string target = StartRouter();
  ASSERT_FALSE(target.empty());

  grpc::Status status = ListModels(target, Trusting(root_ / "a" / "ca.pem"));
  EXPECT_TRUE(status.ok()) << status.error_message();
  status = ListModels(target, grpc::InsecureChannelCredentials());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // A client trusting another CA refuses the handshake.
  EXPECT_FALSE(ListModels(target, Trusting(root_ / "b" / "ca.pem")).ok());

  Install(root_ / "b", root_ / "served");
  // The watcher polls every second; new connections switch to the new pair.
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (absl::Now() < deadline && !ListModels(target, Trusting(root_ / "b" / "ca.pem")).ok()) {
    absl::SleepFor(absl::Milliseconds(200));
  }
  status = ListModels(target, Trusting(root_ / "b" / "ca.pem"));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(ListModels(target, Trusting(root_ / "a" / "ca.pem")).ok());
  EXPECT_TRUE(router_->Running()) << TailFile(router_->log_path());
}

// A start-up error names the flag: one file without the other, a missing file, a key that is
// not the certificate's.
TEST_F(RouterTlsTest, BadFilesAreNamedErrorsAtStartUp) {
  struct Case {
    std::vector<std::string> argv;
    std::string expected;
  };
  const std::string cert = (root_ / "a" / "cert.pem").string();
  const std::string other_key = (root_ / "b" / "key.pem").string();
  const std::vector<Case> cases = {
      {{absl::StrCat("--tls_cert_file=", cert)}, "go together"},
      {{"--tls_cert_file=/nonexistent/cert.pem", absl::StrCat("--tls_key_file=", other_key)},
       "--tls_cert_file: cannot read /nonexistent/cert.pem"},
      {{absl::StrCat("--tls_cert_file=", cert), absl::StrCat("--tls_key_file=", other_key)},
       "is not the key of the certificate"},
  };
  for (const Case& c : cases) {
    SubprocessOptions options;
    options.argv = {"router/router", "--model=engine/testdata/models/llama",
                    "--listen=127.0.0.1:0", "--allow_anonymous"};
    options.argv.insert(options.argv.end(), c.argv.begin(), c.argv.end());
    options.log_path = (root_ / "bad.log").string();
    absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(options);
    ASSERT_TRUE(child.ok()) << child.status();
    absl::StatusOr<ExitStatus> exit = (*child)->Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_FALSE(exit->ok());
    EXPECT_NE(ReadFile(options.log_path).find(c.expected), std::string::npos)
        << c.expected << " not in: " << ReadFile(options.log_path);
  }
}

}  // namespace
}  // namespace deepinfer
