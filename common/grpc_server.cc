#include "common/grpc_server.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status_macros.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpc/impl/codegen/grpc_types.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(GrpcServerOptions options) {
  DI_ASSIGN_OR_RETURN(HostPort listen,
                      ParseHostPort("listen", options.listen_address, /*allow_port_zero=*/true));
  // Must precede the builder: the default health service is created with the server.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  std::shared_ptr<grpc::ServerCredentials> credentials = options.credentials;
  if (credentials == nullptr) credentials = grpc::InsecureServerCredentials();
  builder.AddListeningPort(listen.ToString(), credentials, &bound_port);
  std::optional<HostPort> internal;
  int internal_port = 0;
  if (!options.internal_listen_address.empty()) {
    DI_ASSIGN_OR_RETURN(internal, ParseHostPort("internal_listen", options.internal_listen_address,
                                                /*allow_port_zero=*/true));
    if (internal->host != "127.0.0.1" && internal->host != "::1" &&
        internal->host != "localhost") {
      return absl::InvalidArgumentError(
          absl::StrCat("internal_listen: ", internal->ToString(), " is not a loopback address"));
    }
    builder.AddListeningPort(internal->ToString(), grpc::InsecureServerCredentials(),
                             &internal_port);
  }
  // gRPC enables SO_REUSEPORT by default: a second server on a taken port would then start
  // and silently share its traffic. One address, one server.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  for (grpc::Service* service : options.services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0 || (internal.has_value() && internal_port == 0)) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen.ToString(), " (address in use or not local?)"));
  }
  HostPort bound = listen;
  bound.port = static_cast<uint16_t>(bound_port);
  if (bound.host == "0.0.0.0" || bound.host == "::") bound.host = "127.0.0.1";
  std::string internal_address;
  if (internal.has_value()) {
    internal->port = static_cast<uint16_t>(internal_port);
    internal_address = internal->ToString();
  }
  auto out = std::unique_ptr<GrpcServer>(
      new GrpcServer(std::move(server), bound_port, bound.ToString(), std::move(internal_address),
                     std::move(options.health_service_names)));
  out->SetServing(false);
  return out;
}

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::string address,
                       std::string internal_address, std::vector<std::string> service_names)
    : server_(std::move(server)),
      port_(port),
      address_(std::move(address)),
      internal_address_(std::move(internal_address)),
      service_names_(std::move(service_names)) {}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  for (const std::string& name : service_names_) health->SetServingStatus(name, serving);
}

void GrpcServer::Shutdown(absl::Duration grace) {
  SetServing(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void GrpcServer::Wait() { server_->Wait(); }

}  // namespace deepinfer
