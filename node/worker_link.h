// What every worker process (prefill/decode runtime, vision encoder node) shares for its admin
// surface: the WorkerAdmin service over a stats function, and mirroring cumulative stats into
// Prometheus counters. The link to the router is node/router_link.h.
//
// Thread-safety: functions are thread-safe; WorkerAdminService calls `stats` from gRPC threads.
#ifndef DEEPINFER_NODE_WORKER_LINK_H_
#define DEEPINFER_NODE_WORKER_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"

namespace deepinfer::node {

// WorkerAdmin.GetStats answering with `stats()`.
class WorkerAdminService final : public internal::v1::WorkerAdmin::Service {
 public:
  explicit WorkerAdminService(std::function<internal::v1::WorkerStats()> stats)
      : stats_(std::move(stats)) {}
  grpc::Status GetStats(grpc::ServerContext* context,
                        const internal::v1::WorkerStatsRequest* request,
                        internal::v1::WorkerStats* response) override;

 private:
  const std::function<internal::v1::WorkerStats()> stats_;
};

// Makes a counter that mirrors a cumulative value read from stats equal to `value` (adds what
// grew since the last call; never decreases). Callers serialise calls per counter.
void MirrorCounter(Counter* counter, uint64_t value);

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_WORKER_LINK_H_
