#include "node/worker_link.h"

namespace deepinfer::node {

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
