// The autoscaler closes the loop between the worker registry, the planner and a scaler: every
// interval it builds one Planner sample per pool from WorkerRegistry::List(), feeds the planner
// (router/planner.h) and asks the Scaler (router/scaler.h) to run the planner's Desired() count
// when that differs from the count the scaler reports.
//
// A pool's sample (BuildSample) from its live workers (role prefill / decode / encoder; live =
// last message at most missed_heartbeats_allowed * heartbeat_interval old):
//   current_replicas                   live workers of the role;
//   queue_depth                        sum of LoadReport.queue_depth;
//   queued_input_tokens (prefill)      sum of LoadReport.queued_input_tokens plus the input tokens
//                                      the router placed there since each worker's last report;
//   input_tokens_per_second (prefill)  sum of LoadReport.prefill_tokens_per_second (what the pool
//                                      computes; arrivals beyond that show as queue);
//   running_sequences (decode)         sum of LoadReport.running_sequences;
//   kv_used_fraction (decode)          (sum of total - free KV blocks + blocks placed since the
//                                      last report) / sum of total, capped at 1;
//   replica_prefill_tokens_per_second  mean of LoadReport.prefill_tokens_per_second over live
//                                      workers that have reported;
//   replica_decode_sequences           mean of LoadReport.running_sequences over the same.
// Load reports carry no image rates, so the encoder pool is sized from its queue alone.
// The encoder pool is sampled only while at least one encoder worker is registered; prefill and
// decode every pass.
//
// Start-up: a pool's first sample reports max(live workers, the scaler's count) as
// current_replicas, so the planner's desired count starts from what the pool is already asked to
// run (a router restarting before its workers re-register must not shrink the pool).
//
// Scaler errors are logged, counted per pool and retried on the next pass; one pool's error does
// not hold back the others.
//
// Time comes from Options::clock (STYLE.md 9): tests call Tick() themselves; Start() runs Tick()
// on a background thread every Options::interval (waiting in real time).
//
// Thread-safety: every method is thread-safe; Tick() calls are serialised.
#ifndef DEEPINFER_ROUTER_AUTOSCALER_H_
#define DEEPINFER_ROUTER_AUTOSCALER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/planner.h"
#include "router/scaler.h"
#include "router/worker_registry.h"

namespace deepinfer::router {

// The worker role that serves `pool`.
internal::v1::WorkerRole PoolRole(Pool pool);

// One pool as the autoscaler last saw and handled it.
struct AutoscalePoolStatus {
  Pool pool = Pool::kPrefill;
  PoolConfig config;
  // False until the planner has seen a sample of the pool (desired is then 0).
  bool planned = false;
  // The planner's desired count.
  int desired = 0;
  // Live workers of the pool at the last sample.
  int live_replicas = 0;
  // What the scaler last reported or was set to; nullopt before the first successful call and
  // after a failed one.
  std::optional<int> scaler_replicas;
  PoolSample last_sample;
  absl::Time sampled_at = absl::InfinitePast();
  // The planner's state after the last sample.
  PoolState planner;
  // Successful SetReplicas calls / failed scaler calls (GetReplicas or SetReplicas).
  int64_t scaler_calls = 0;
  int64_t scaler_errors = 0;
  std::string last_scaler_error;
};

class Autoscaler {
 public:
  struct Options {
    // The pools to plan (at least one); each PoolConfig is validated as Planner::Create does.
    std::map<Pool, PoolConfig> pools;
    // How often Start()'s thread runs Tick(); > 0.
    absl::Duration interval = absl::Seconds(10);
    // absl::Now when empty. Also judges worker liveness.
    std::function<absl::Time()> clock;
  };

  // `registry` and `scaler` are not owned and must outlive the autoscaler. kInvalidArgument for
  // a null registry or scaler, a non-positive interval, or what Planner::Create refuses.
  static absl::StatusOr<std::unique_ptr<Autoscaler>> Create(const WorkerRegistry* registry,
                                                            Scaler* scaler, Options options);

  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;
  // Stops the background thread if running.
  ~Autoscaler();

  // Starts the background thread (once; later calls do nothing); its first Tick runs at once.
  // Stop() ends it (idempotent).
  void Start();
  void Stop();

  // One pass: sample every pool, feed the planner, apply changes through the scaler.
  void Tick();

  // Every configured pool, in the order encoder, prefill, decode.
  std::vector<AutoscalePoolStatus> Status() const;
  // One pool; nullopt when not configured.
  std::optional<AutoscalePoolStatus> PoolStatusOf(Pool pool) const;
  // Passes run so far.
  int64_t ticks() const;

  // The sample of `pool` from `workers` at `now`; workers whose last heartbeat is more than
  // `liveness` old are left out (file comment).
  static PoolSample BuildSample(Pool pool, const std::vector<WorkerSnapshot>& workers,
                                absl::Time now, absl::Duration liveness);

 private:
  Autoscaler(const WorkerRegistry* registry, Scaler* scaler, Options options,
             std::unique_ptr<Planner> planner);
  absl::Time Now() const;
  // Handles one pool in a pass.
  void TickPool(Pool pool, const std::vector<WorkerSnapshot>& workers, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tick_mu_);
  void Loop();

  const WorkerRegistry* const registry_;
  Scaler* const scaler_;
  const Options options_;
  const std::unique_ptr<Planner> planner_;

  absl::Mutex tick_mu_;  // serialises Tick
  mutable absl::Mutex mu_;
  std::array<std::optional<AutoscalePoolStatus>, 3> status_ ABSL_GUARDED_BY(mu_);
  int64_t ticks_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex loop_mu_;
  bool stop_ ABSL_GUARDED_BY(loop_mu_) = false;
  absl::Mutex start_mu_;  // serialises Start/Stop
  std::thread thread_ ABSL_GUARDED_BY(start_mu_);
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_AUTOSCALER_H_
