// The router's Prometheus metrics (names follow vLLM's, with the deepinfer_ prefix), registered
// in a MetricsRegistry the caller owns and serves (common/metrics_http_server.h). Other router
// parts add their own metrics to the same registry through registry() (e.g. the autoscaler's
// deepinfer_desired_replicas{pool}).
//
// Requests (InferenceService reports each finished Chat/Generate call):
//   deepinfer_requests_total{outcome=ok|error|cancelled|aborted|invalid}
//   deepinfer_time_to_first_token_seconds, deepinfer_inter_token_latency_seconds,
//   deepinfer_e2e_request_latency_seconds, deepinfer_queue_time_seconds (histograms; the queue
//     time is the decode node's, from usage.timing.queued_us)
//   deepinfer_prompt_tokens_total, deepinfer_generation_tokens_total,
//   deepinfer_cached_prompt_tokens_total (usage.cached_prompt_tokens of finished requests)
//   deepinfer_prefix_cache_hit_ratio (gauge: cached / prompt tokens over every request that
//     reported usage since start)
// Placement (one per decision):
//   deepinfer_placement_decisions_total{outcome=remote_prefill|local_below_threshold|
//     local_no_prefill_worker}
// Pools (RefreshPools, from the registry's last load reports of the live workers):
//   deepinfer_queue_depth{pool}, deepinfer_queued_input_tokens{pool},
//   deepinfer_running_sequences{pool}, deepinfer_kv_cache_usage_ratio{pool} (1 - free / total
//   KV blocks over the pool's workers that reported), deepinfer_workers{pool} (live workers);
//   pool is "prefill" or "decode".
//
// Thread-safety: every method is thread-safe. The per-token path (ObserveInterToken) is
// lock-free.
#ifndef DEEPINFER_ROUTER_ROUTER_METRICS_H_
#define DEEPINFER_ROUTER_ROUTER_METRICS_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "router/placement.h"
#include "router/worker_registry.h"

namespace deepinfer::router {

enum class RequestOutcome {
  kOk,         // the stream ended normally
  kError,      // placement or a worker failed (or any other non-OK status)
  kCancelled,  // the client cancelled (or its deadline passed)
  kAborted,    // ended by Abort
  kInvalid,    // refused: a malformed request (INVALID_ARGUMENT)
};
absl::string_view RequestOutcomeName(RequestOutcome outcome);

// What one finished Chat/Generate call reports.
struct FinishedRequest {
  RequestOutcome outcome = RequestOutcome::kOk;
  // Prompt tokens of a request that was tokenized (0 otherwise) and tokens relayed to the client.
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  // From the last chunk's usage; < 0 when no usage arrived.
  int64_t cached_prompt_tokens = -1;
  // Seconds from receipt; < 0 when not reached.
  double time_to_first_token_s = -1;
  double e2e_s = -1;
  // The decode node's queue time; < 0 when no usage arrived.
  double queue_time_s = -1;
};

class RouterMetrics {
 public:
  // Registers the metrics above in `registry` (not owned; must outlive this). kAlreadyExists
  // when they are registered there already.
  static absl::StatusOr<std::unique_ptr<RouterMetrics>> Create(MetricsRegistry* registry);

  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  MetricsRegistry* registry() const { return registry_; }

  void RecordFinished(const FinishedRequest& request);
  // `tokens` (>= 1) arrived `seconds` after the previous ones: observed `tokens` times at
  // seconds / tokens.
  void ObserveInterToken(double seconds, int64_t tokens);
  void RecordPlacement(PlacementOutcome outcome);
  // Sets the pool gauges from `registry`'s live workers of `model`.
  void RefreshPools(const WorkerRegistry& registry, absl::string_view model);

 private:
  explicit RouterMetrics(MetricsRegistry* registry) : registry_(registry) {}

  struct Pool {
    Gauge* queue_depth = nullptr;
    Gauge* queued_input_tokens = nullptr;
    Gauge* running_sequences = nullptr;
    Gauge* kv_cache_usage_ratio = nullptr;
    Gauge* workers = nullptr;
  };

  MetricsRegistry* const registry_;
  Counter* requests_[5] = {};  // by RequestOutcome
  Histogram* ttft_ = nullptr;
  Histogram* itl_ = nullptr;
  Histogram* e2e_ = nullptr;
  Histogram* queue_time_ = nullptr;
  Counter* prompt_tokens_ = nullptr;
  Counter* generation_tokens_ = nullptr;
  Counter* cached_prompt_tokens_ = nullptr;
  Gauge* prefix_cache_hit_ratio_ = nullptr;
  Counter* placements_[3] = {};  // by PlacementOutcome
  Pool prefill_;
  Pool decode_;

  absl::Mutex mu_;
  // Over requests that reported usage: the hit ratio's terms.
  int64_t usage_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t usage_cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_ROUTER_METRICS_H_
