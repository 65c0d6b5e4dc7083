// The planner sizes each worker pool (encoder, prefill, decode): from periodic samples of a
// pool's load and its replicas' measured throughput it computes the replica count the pool
// should have. A scaler (local process supervisor, Kubernetes scale API) applies Desired(); the
// planner itself starts and stops nothing.
//
// Per sample, the pool's need (replicas at the target utilisation) is
//   prefill: (input tokens/s arriving + queued input tokens / backlog_drain_time)
//              / (per-replica prefill tokens/s * target_utilization)
//   decode:  max((running + queued sequences) / (per-replica sequences * target_utilization),
//                KV used fraction * current replicas / target_utilization)
//   encoder: (images/s arriving + queued images / backlog_drain_time)
//              / (per-replica images/s * target_utilization)
// and the pool's need is an exponentially weighted moving average of those (time constant
// PoolConfig::smoothing, weighted by the time between samples).
//
// Per-replica capacity: a measured throughput is the capacity only while the pool has a queue
// (its replicas are saturated); otherwise it is only what the load asked for. So the estimate
// starts at PoolConfig::initial_replica_capacity, follows (with the same smoothing) the
// measurements taken while queue_depth > 0, and otherwise only rises to a measurement above it.
//
// Every PoolConfig::interval (at the first sample, then on the first sample at least an interval
// after the previous evaluation), the desired count D is re-evaluated with hysteresis h:
//   up   when need > D * (1 + h) (any need > 0 when D = 0): to ceil(need);
//   down when ceil(need * (1 + h)) < D: to ceil(need * (1 + h)), so the remaining replicas still
//        have h of headroom and the next evaluation does not go back up;
// then clamped to [min_replicas, max_replicas]. A change up waits until scale_up_cooldown has
// passed since the last change (the first change up needs no wait); a change down until
// scale_down_cooldown has passed since the last change or, before any, since the first sample.
// D starts at the first sample's current_replicas (clamped). Later samples' current_replicas
// only enter the KV term: D is the planner's target, not a mirror of what runs.
//
// Time comes from Options::clock (STYLE.md 9). Every evaluation is logged at debug level with its
// inputs, every change at info, and counted in PoolState.
//
// Thread-safety: every method is thread-safe.
#ifndef DEEPINFER_ROUTER_PLANNER_H_
#define DEEPINFER_ROUTER_PLANNER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace deepinfer::router {

enum class Pool { kEncoder = 0, kPrefill = 1, kDecode = 2 };
// "encoder", "prefill", "decode".
absl::string_view PoolName(Pool pool);

struct PoolConfig {
  int min_replicas = 1;  // >= 0
  int max_replicas = 1;  // >= max(min_replicas, 1)
  // Fraction of a replica's measured capacity the planner plans to use; (0, 1].
  double target_utilization = 0.8;
  // How often the desired count is re-evaluated; > 0.
  absl::Duration interval = absl::Seconds(10);
  // Time constant of the load's moving average; >= 0 (0: the last sample alone).
  absl::Duration smoothing = absl::Seconds(30);
  // Hysteresis band, a fraction of the current count; [0, 1).
  double hysteresis = 0.1;
  // Least time between a change and the next change up / down; >= 0.
  absl::Duration scale_up_cooldown = absl::Seconds(30);
  absl::Duration scale_down_cooldown = absl::Minutes(5);
  // Prefill and encoder: queued work should be done within this on top of arrivals; > 0.
  absl::Duration backlog_drain_time = absl::Seconds(30);
  // Per-replica capacity until measurements say otherwise; > 0. Prefill: input tokens/s;
  // decode: concurrent sequences; encoder: images/s.
  double initial_replica_capacity = 0;
};

// One observation of a pool. Fields another pool's sizing does not use are ignored. All counts
// >= 0; rates finite and >= 0.
struct PoolSample {
  // Replicas running now.
  int current_replicas = 0;
  // Requests waiting to start, over the pool (encoder: images waiting).
  int64_t queue_depth = 0;
  // Prefill: prompt tokens still to compute over the pool's queues.
  int64_t queued_input_tokens = 0;
  // Prefill: prompt tokens arriving per second.
  double input_tokens_per_second = 0;
  // Encoder: images arriving per second.
  double images_per_second = 0;
  // Decode: sequences in the running batches, over the pool.
  int64_t running_sequences = 0;
  // Decode: KV blocks in use / KV blocks, over the pool; [0, 1].
  double kv_used_fraction = 0;
  // Measured per replica (mean over the pool) over the last interval; 0 = no measurement.
  double replica_prefill_tokens_per_second = 0;
  double replica_decode_sequences = 0;
  double replica_images_per_second = 0;
};

struct PoolState {
  int desired = 0;
  // Smoothed replicas needed at the target utilisation (the file comment's need).
  double need = 0;
  // The last sample's unsmoothed need.
  double last_need = 0;
  // Per-replica capacity estimate (units as PoolConfig::initial_replica_capacity).
  double replica_capacity = 0;
  absl::Time last_change = absl::InfinitePast();  // InfinitePast before any change
  absl::Time last_evaluation = absl::InfinitePast();
  int64_t samples = 0;
  int64_t evaluations = 0;
  int64_t scale_ups = 0;
  int64_t scale_downs = 0;
  // Evaluations that wanted a change the cooldown held back.
  int64_t held_by_cooldown = 0;
  // The last evaluation's outcome, one line.
  std::string reason;
};

class Planner {
 public:
  struct Options {
    // absl::Now when empty.
    std::function<absl::Time()> clock;
    // The pools to plan; at least one.
    std::map<Pool, PoolConfig> pools;
  };

  // kInvalidArgument naming the field ("pools[prefill].max_replicas: expected >= min_replicas
  // (3); got 2") for an invalid config or no pools.
  static absl::StatusOr<std::unique_ptr<Planner>> Create(Options options);

  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Records a sample taken now and re-evaluates the pool's desired count when due (file
  // comment). kNotFound for a pool not configured; kInvalidArgument naming the field for a
  // negative count, a negative or non-finite rate or kv_used_fraction outside [0, 1] (the
  // sample is then ignored).
  absl::Status Observe(Pool pool, const PoolSample& sample);

  // The pool's desired replica count. kNotFound for a pool not configured; kFailedPrecondition
  // before its first sample.
  absl::StatusOr<int> Desired(Pool pool) const;

  // The pool's planning state (same errors as Desired).
  absl::StatusOr<PoolState> State(Pool pool) const;

 private:
  struct PoolPlan {
    PoolConfig config;
    bool started = false;
    bool changed = false;
    absl::Time first_sample;
    absl::Time last_sample;
    PoolState state;
  };

  explicit Planner(Options options);
  absl::Time Now() const;
  absl::StatusOr<const PoolPlan*> Find(Pool pool) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Updates capacity and need from `sample` at `now`.
  static void Smooth(Pool pool, const PoolSample& sample, absl::Time now, PoolPlan& plan);
  static void Evaluate(absl::Time now, PoolPlan& plan);

  const std::function<absl::Time()> clock_;
  mutable absl::Mutex mu_;
  std::array<std::optional<PoolPlan>, 3> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_PLANNER_H_
