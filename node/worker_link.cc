#include "node/worker_link.h"

#include "grpc/impl/codegen/grpc_types.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace deepinfer::node {

void SetWorkerRpcDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

std::unique_ptr<internal::v1::WorkerRegistry::Stub> NewRegistryStub(
    const std::string& router_address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kRegisterBackoffMin)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kRegisterBackoffMin)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(kRegisterBackoffMax)));
  return internal::v1::WorkerRegistry::NewStub(
      grpc::CreateCustomChannel(router_address, grpc::InsecureChannelCredentials(), args));
}

grpc::Status WorkerAdminService::GetStats(grpc::ServerContext* /*context*/,
                                          const internal::v1::WorkerStatsRequest* /*request*/,
                                          internal::v1::WorkerStats* response) {
  *response = stats_();
  return grpc::Status::OK;
}

void MirrorCounter(Counter* counter, uint64_t value) {
  const double delta = static_cast<double>(value) - counter->Value();
  if (delta > 0) counter->Increment(delta);
}

}  // namespace deepinfer::node
