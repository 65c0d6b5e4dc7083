// What every worker process (prefill/decode runtime, vision encoder node) shares for its link to
// the router and its admin surface: the registry channel with quick reconnects, the per-RPC
// deadline, the WorkerAdmin service over a stats function, and mirroring cumulative stats into
// Prometheus counters.
//
// Thread-safety: functions are thread-safe; WorkerAdminService calls `stats` from gRPC threads.
#ifndef DEEPINFER_NODE_WORKER_LINK_H_
#define DEEPINFER_NODE_WORKER_LINK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"

namespace deepinfer::node {

// Register retries back off from kRegisterBackoffMin, doubling up to kRegisterBackoffMax.
inline constexpr absl::Duration kRegisterBackoffMin = absl::Milliseconds(100);
inline constexpr absl::Duration kRegisterBackoffMax = absl::Seconds(2);

// Deadline of one Register / ReportLoad / PublishKvEvents / Deregister call: now + 2 s.
void SetWorkerRpcDeadline(grpc::ClientContext* context);

// A WorkerRegistry stub for `router_address` whose channel reconnects within
// kRegisterBackoffMin..kRegisterBackoffMax once the router (re)appears (gRPC's default backoff
// grows to 2 minutes).
std::unique_ptr<internal::v1::WorkerRegistry::Stub> NewRegistryStub(
    const std::string& router_address);

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
