// A gRPC server with the standard grpc.health.v1.Health service, as every deepinfer binary runs
// it. Listen on port 0 to let the OS choose (tests, STYLE.md 9); port() says which was bound.
//
// Health: the overall status ("") and each registered service's full name start NOT_SERVING
// until the owner calls SetServing(true), e.g. once a model has loaded; Shutdown() flips
// everything back to NOT_SERVING first so load balancers stop sending before the drain.
//
// Thread-safety: all methods are thread-safe. Not copyable or movable (it owns threads).
#ifndef DEEPINFER_COMMON_GRPC_SERVER_H_
#define DEEPINFER_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"

namespace deepinfer {

struct GrpcServerOptions {
  // "host:port"; port 0 picks a free port.
  std::string listen_address = "127.0.0.1:0";
  // Services to serve; not owned, must outlive the server.
  std::vector<grpc::Service*> services;
  // Full names that health reports on besides "" (e.g. Inference::service_full_name()).
  std::vector<std::string> health_service_names;
  // Largest request or response message, bytes (KV metadata and image payloads can be large).
  int max_message_bytes = 64 << 20;
  // Credentials of `listen_address`; null = plaintext (grpc::InsecureServerCredentials).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Non-empty: a second, always plaintext listener of the same services, which must be on a
  // loopback host (127.0.0.1, [::1] or localhost; kInvalidArgument otherwise), e.g. for a
  // process's own relay to itself while `listen_address` serves TLS. Port 0 picks a free port.
  std::string internal_listen_address;
};

class GrpcServer {
 public:
  // Builds, binds and starts serving. kInvalidArgument for a malformed address, kUnavailable if
  // the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(GrpcServerOptions options);

  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;
  ~GrpcServer();

  int port() const { return port_; }
  // "host:port" with the bound port, usable as a client target.
  std::string address() const { return address_; }
  // The internal plaintext listener's "host:port"; "" when none was asked for.
  std::string internal_address() const { return internal_address_; }

  // Sets health for "" and every name in health_service_names.
  void SetServing(bool serving);

  // Stops accepting, marks NOT_SERVING, waits up to `grace` for in-flight calls, then cancels
  // the rest. Idempotent.
  void Shutdown(absl::Duration grace);

  // Blocks until Shutdown() completes.
  void Wait();

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::string address,
             std::string internal_address, std::vector<std::string> service_names);

  std::unique_ptr<grpc::Server> server_;
  const int port_;
  const std::string address_;
  const std::string internal_address_;
  const std::vector<std::string> service_names_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_GRPC_SERVER_H_
