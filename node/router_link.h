// A worker process's link to the router's WorkerRegistry (proto/deepinfer/internal/v1/
// worker.proto), shared by prefill and decode nodes (node/worker_runtime.h) and vision encoder
// nodes (vision_encoder/encoder_node.h). One background thread, waking every kTick:
//
//  * Register: RegisterRequest{worker = Options::worker}. A failed call (router down, or an
//    answer such as FAILED_PRECONDITION for a config that differs from the model's other
//    workers) is logged and retried after a backoff that starts at kRegisterBackoffMin and
//    doubles up to kRegisterBackoffMax; a success resets it, takes the heartbeat interval from
//    the response (1 s when it gives none) and calls Options::on_registered.
//  * Heartbeats: once registered, a LoadReport every heartbeat interval (the first one interval
//    after Register), numbered 1, 2, ... for the link's lifetime, carrying what Options::load
//    fills in. A failed ReportLoad is logged and the link carries on; known=false (the router
//    restarted or dropped this incarnation) makes it Register again at once.
//  * KV events (when Options::kv_events is set): after each heartbeat that the router did not
//    answer with known=false, the events Options::kv_events hands over go out as one
//    KvEventBatch (consecutive sequence numbers from 1). Batches stay queued until acknowledged
//    and are resent in order with their sequence numbers; more than kMaxUnackedKvBatches queued,
//    or lost events, or an ack asking for resync, or a re-registration, start the next batch
//    with KIND_ALL_CLEARED. kNotFound from PublishKvEvents makes the link Register again.
//  * Stop: ends the thread and, if the link ever registered, sends Deregister.
// Every RPC has a deadline of now + kWorkerRpcTimeout. Log lines name the process as
// "<log_name> <worker_id>"; a state change (registered, registering again, Register or
// ReportLoad or Deregister failed, deregistered) is one line.
//
// Time: intervals and backoff are judged by Options::clock (STYLE.md 9; common/fake_clock.h in
// tests); the thread itself waits in real time, kTick at a time.
//
// Lifecycle: Create (binds nothing, starts nothing) -> Start -> Stop (idempotent; the destructor
// stops). Thread-safety: Start, Stop, registered() and the destructor are thread-safe. The
// callbacks run on the link's thread, one at a time, never after Stop returns; they must not
// call Stop. Not copyable or movable.
#ifndef DEEPINFER_NODE_ROUTER_LINK_H_
#define DEEPINFER_NODE_ROUTER_LINK_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "grpcpp/grpcpp.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::node {

// Register retries back off from kRegisterBackoffMin, doubling up to kRegisterBackoffMax.
inline constexpr absl::Duration kRegisterBackoffMin = absl::Milliseconds(100);
inline constexpr absl::Duration kRegisterBackoffMax = absl::Seconds(2);
// Deadline of one Register / ReportLoad / PublishKvEvents / Deregister call.
inline constexpr absl::Duration kWorkerRpcTimeout = absl::Seconds(2);

// Sets `context`'s deadline to now + kWorkerRpcTimeout.
void SetWorkerRpcDeadline(grpc::ClientContext* context);

// A WorkerRegistry stub for `router_address` whose channel reconnects within
// kRegisterBackoffMin..kRegisterBackoffMax once the router (re)appears (gRPC's default backoff
// grows to 2 minutes).
std::unique_ptr<internal::v1::WorkerRegistry::Stub> NewRegistryStub(
    const std::string& router_address);

class RouterLink {
 public:
  // How often the thread wakes to see whether a Register or a heartbeat is due.
  static constexpr absl::Duration kTick = absl::Milliseconds(50);
  // Unacknowledged KV-event batches kept for resending; beyond it the link starts over with
  // KIND_ALL_CLEARED (the router will see the gap and ask for a resync anyway).
  static constexpr size_t kMaxUnackedKvBatches = 256;

  struct Options {
    // The router's "host:port"; required.
    std::string router_address;
    // What Register sends, as is. Its worker_id and incarnation (both required) also label every
    // LoadReport, KvEventBatch and Deregister.
    internal::v1::WorkerInfo worker;
    // Fills the load figures of a report (queue depth, running sequences, rates, ...);
    // worker_id, incarnation and sequence are already set. `since_last` is the time since the
    // previous report (since Start for the first), for rates. Required.
    std::function<void(absl::Duration since_last, internal::v1::LoadReport* report)> load;
    // KV events (optional; unset = the link publishes none): appends the events since the
    // previous call to `events` and returns true when some were lost since then (the link then
    // starts the next batch with KIND_ALL_CLEARED).
    std::function<bool(google::protobuf::RepeatedPtrField<internal::v1::KvEvent>* events)>
        kv_events;
    // Called after every successful Register (the first and each re-registration); optional.
    std::function<void()> on_registered;
    // Log lines read "<log_name> <worker_id>: ...".
    std::string log_name = "worker";
    // The "registered" line adds the heartbeat interval, the number of peers and " again" for a
    // re-registration (prefill/decode nodes); off: just the router (encoder nodes).
    bool log_registration_details = true;
    // A successful Deregister is logged (prefill/decode nodes); a failed one always is.
    bool log_deregistration = true;
    // Now; absl::Now when empty.
    std::function<absl::Time()> clock;
  };

  // kInvalidArgument naming the option: router_address empty, worker.worker_id empty,
  // worker.incarnation 0, load unset.
  static absl::StatusOr<std::unique_ptr<RouterLink>> Create(Options options);

  RouterLink(const RouterLink&) = delete;
  RouterLink& operator=(const RouterLink&) = delete;
  ~RouterLink();  // Stop()

  // Starts the thread (the first Register goes out at once). kFailedPrecondition when already
  // started or stopped.
  absl::Status Start();

  // Ends the thread (waiting for the RPC in progress, at most kWorkerRpcTimeout) and then, if
  // the link ever registered, sends Deregister. Idempotent.
  void Stop();

  // Whether the last Register succeeded and the router has not since forgotten this worker
  // (known=false, kNotFound) as far as the link has heard.
  bool registered() const;

 private:
  explicit RouterLink(Options options);
  void Run();
  absl::Time Now() const;
  std::string Who() const;
  // One Register attempt at `now`; on success sets up the heartbeat and calls on_registered.
  void TryRegister(absl::Time now);
  // One heartbeat at `now`: ReportLoad, then (unless the router forgot this worker) KV events.
  void Heartbeat(absl::Time now);
  void PublishKvEvents();
  void SetRegistered(bool registered);
  void Deregister();

  const Options options_;
  std::unique_ptr<internal::v1::WorkerRegistry::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  // Serialises Stop (held while joining).
  absl::Mutex stop_mu_;

  // The link thread's own state (touched by it alone once started).
  bool ever_registered_ = false;
  absl::Duration backoff_ = kRegisterBackoffMin;
  absl::Time next_register_ = absl::InfinitePast();
  absl::Duration heartbeat_ = absl::Seconds(1);
  absl::Time next_heartbeat_ = absl::InfinitePast();
  uint64_t load_sequence_ = 0;
  absl::Time last_report_;
  uint64_t kv_sequence_ = 0;
  std::vector<internal::v1::KvEventBatch> unacked_;
  bool send_all_cleared_ = false;
};

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_ROUTER_LINK_H_
