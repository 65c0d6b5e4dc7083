#include "node/testing/worker_test_util.h"

#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace deepinfer::node::testing {

WorkerOptions SmallPrefillWorker(const std::string& worker_id) {
  WorkerOptions o;
  o.role = internal::v1::WORKER_ROLE_PREFILL;
  o.worker_id = worker_id;
  o.model_path = "engine/testdata/models/llama";
  o.kv_blocks = 64;
  o.block_size = 4;
  o.threads = 2;
  o.kv_backend = kv_transfer::Backend::kLoopback;
  return o;
}

grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(const std::string& address,
                                                                 const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  if (!stub->Check(&context, request, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

}  // namespace deepinfer::node::testing
