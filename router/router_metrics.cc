#include "router/router_metrics.h"

#include <string>
#include <vector>

#include "common/status_macros.h"

namespace deepinfer::router {
namespace {

constexpr RequestOutcome kOutcomes[] = {RequestOutcome::kOk, RequestOutcome::kError,
                                        RequestOutcome::kCancelled, RequestOutcome::kAborted,
                                        RequestOutcome::kInvalid};
constexpr PlacementOutcome kPlacements[] = {PlacementOutcome::kRemotePrefill,
                                            PlacementOutcome::kLocalPrefillBelowThreshold,
                                            PlacementOutcome::kLocalPrefillNoPrefillWorker,
                                            PlacementOutcome::kLocalPrefillTransferCost,
                                            PlacementOutcome::kLocalPrefillLoad,
                                            PlacementOutcome::kLocalPrefillSlo};

const char* PlacementLabel(PlacementOutcome outcome) {
  switch (outcome) {
    case PlacementOutcome::kRemotePrefill:
      return "remote_prefill";
    case PlacementOutcome::kLocalPrefillBelowThreshold:
      return "local_below_threshold";
    case PlacementOutcome::kLocalPrefillNoPrefillWorker:
      return "local_no_prefill_worker";
    case PlacementOutcome::kLocalPrefillTransferCost:
      return "local_transfer_cost";
    case PlacementOutcome::kLocalPrefillLoad:
      return "local_load";
    case PlacementOutcome::kLocalPrefillSlo:
      return "local_slo";
  }
  return "unknown";
}

}  // namespace

absl::string_view RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kOk:
      return "ok";
    case RequestOutcome::kError:
      return "error";
    case RequestOutcome::kCancelled:
      return "cancelled";
    case RequestOutcome::kAborted:
      return "aborted";
    case RequestOutcome::kInvalid:
      return "invalid";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<RouterMetrics>> RouterMetrics::Create(MetricsRegistry* registry) {
  if (registry == nullptr) return absl::InvalidArgumentError("registry: expected non-null");
  std::unique_ptr<RouterMetrics> m(new RouterMetrics(registry));
  DI_ASSIGN_OR_RETURN(
      CounterFamily * requests,
      registry->AddCounterFamily("deepinfer_requests_total",
                                 "Chat/Generate requests finished, by outcome.", {"outcome"}));
  for (RequestOutcome o : kOutcomes) {
    DI_ASSIGN_OR_RETURN(m->requests_[static_cast<int>(o)],
                        requests->WithLabels({std::string(RequestOutcomeName(o))}));
  }
  DI_ASSIGN_OR_RETURN(m->ttft_, registry->AddHistogram(
                                    "deepinfer_time_to_first_token_seconds",
                                    "Time from the router receiving a request to its first token.",
                                    LatencyBucketsSeconds()));
  // Inter-token gaps of a small model on a CPU are well below a millisecond.
  DI_ASSIGN_OR_RETURN(std::vector<double> itl_buckets, ExponentialBuckets(0.000125, 2, 18));
  DI_ASSIGN_OR_RETURN(
      m->itl_, registry->AddHistogram("deepinfer_inter_token_latency_seconds",
                                      "Time between consecutive tokens of a request at the router.",
                                      std::move(itl_buckets)));
  DI_ASSIGN_OR_RETURN(m->e2e_, registry->AddHistogram("deepinfer_e2e_request_latency_seconds",
                                                      "Time from receiving a request to its end.",
                                                      LatencyBucketsSeconds()));
  DI_ASSIGN_OR_RETURN(m->queue_time_,
                      registry->AddHistogram("deepinfer_queue_time_seconds",
                                             "Time requests waited in the decode node's queue.",
                                             LatencyBucketsSeconds()));
  DI_ASSIGN_OR_RETURN(
      m->prompt_tokens_,
      registry->AddCounter("deepinfer_prompt_tokens_total", "Prompt tokens of finished requests."));
  DI_ASSIGN_OR_RETURN(m->generation_tokens_,
                      registry->AddCounter("deepinfer_generation_tokens_total",
                                           "Tokens generated and relayed to clients."));
  DI_ASSIGN_OR_RETURN(m->cached_prompt_tokens_,
                      registry->AddCounter("deepinfer_cached_prompt_tokens_total",
                                           "Prompt tokens served from a worker's prefix cache."));
  DI_ASSIGN_OR_RETURN(
      m->prefix_cache_hit_ratio_,
      registry->AddGauge("deepinfer_prefix_cache_hit_ratio",
                         "Cached / prompt tokens over every request that reported usage."));
  DI_ASSIGN_OR_RETURN(CounterFamily * placements,
                      registry->AddCounterFamily("deepinfer_placement_decisions_total",
                                                 "Placement decisions, by outcome.", {"outcome"}));
  for (PlacementOutcome o : kPlacements) {
    DI_ASSIGN_OR_RETURN(m->placements_[static_cast<int>(o)],
                        placements->WithLabels({PlacementLabel(o)}));
  }
  DI_ASSIGN_OR_RETURN(GaugeFamily * queue_depth,
                      registry->AddGaugeFamily(
                          "deepinfer_queue_depth",
                          "Requests waiting to start, summed over the pool's workers.", {"pool"}));
  DI_ASSIGN_OR_RETURN(
      GaugeFamily * queued_tokens,
      registry->AddGaugeFamily("deepinfer_queued_input_tokens",
                               "Prompt tokens still to compute, summed over the pool's workers.",
                               {"pool"}));
  DI_ASSIGN_OR_RETURN(GaugeFamily * running,
                      registry->AddGaugeFamily(
                          "deepinfer_running_sequences",
                          "Sequences in the running batches of the pool's workers.", {"pool"}));
  DI_ASSIGN_OR_RETURN(GaugeFamily * kv_usage,
                      registry->AddGaugeFamily(
                          "deepinfer_kv_cache_usage_ratio",
                          "Fraction of the pool's KV blocks in use (1 - free / total).", {"pool"}));
  DI_ASSIGN_OR_RETURN(
      GaugeFamily * workers,
      registry->AddGaugeFamily("deepinfer_workers", "Live workers of the pool.", {"pool"}));
  for (auto [pool, name] : {std::pair<Pool*, const char*>{&m->prefill_, "prefill"},
                            std::pair<Pool*, const char*>{&m->decode_, "decode"}}) {
    DI_ASSIGN_OR_RETURN(pool->queue_depth, queue_depth->WithLabels({name}));
    DI_ASSIGN_OR_RETURN(pool->queued_input_tokens, queued_tokens->WithLabels({name}));
    DI_ASSIGN_OR_RETURN(pool->running_sequences, running->WithLabels({name}));
    DI_ASSIGN_OR_RETURN(pool->kv_cache_usage_ratio, kv_usage->WithLabels({name}));
    DI_ASSIGN_OR_RETURN(pool->workers, workers->WithLabels({name}));
  }
  return m;
}

void RouterMetrics::RecordFinished(const FinishedRequest& r) {
  requests_[static_cast<int>(r.outcome)]->Increment();
  if (r.prompt_tokens > 0) prompt_tokens_->Increment(static_cast<double>(r.prompt_tokens));
  if (r.generation_tokens > 0) {
    generation_tokens_->Increment(static_cast<double>(r.generation_tokens));
  }
  if (r.time_to_first_token_s >= 0) ttft_->Observe(r.time_to_first_token_s);
  if (r.e2e_s >= 0) e2e_->Observe(r.e2e_s);
  if (r.queue_time_s >= 0) queue_time_->Observe(r.queue_time_s);
  if (r.cached_prompt_tokens >= 0) {
    cached_prompt_tokens_->Increment(static_cast<double>(r.cached_prompt_tokens));
    absl::MutexLock lock(&mu_);
    usage_prompt_tokens_ += r.prompt_tokens;
    usage_cached_tokens_ += r.cached_prompt_tokens;
    if (usage_prompt_tokens_ > 0) {
      prefix_cache_hit_ratio_->Set(static_cast<double>(usage_cached_tokens_) /
                                   static_cast<double>(usage_prompt_tokens_));
    }
  }
}

void RouterMetrics::ObserveInterToken(double seconds, int64_t tokens) {
  if (tokens < 1) return;
  const double each = seconds / static_cast<double>(tokens);
  for (int64_t i = 0; i < tokens; ++i) itl_->Observe(each);
}

void RouterMetrics::RecordPlacement(PlacementOutcome outcome) {
  placements_[static_cast<int>(outcome)]->Increment();
}

void RouterMetrics::RefreshPools(const WorkerRegistry& registry, absl::string_view model) {
  struct Sums {
    int64_t queue_depth = 0, queued_tokens = 0, running = 0, free = 0, total = 0, workers = 0;
  } prefill, decode;
  for (const WorkerSnapshot& w : registry.ListLive(model)) {
    Sums* s = w.info.role() == internal::v1::WORKER_ROLE_PREFILL  ? &prefill
              : w.info.role() == internal::v1::WORKER_ROLE_DECODE ? &decode
                                                                  : nullptr;
    if (s == nullptr) continue;
    ++s->workers;
    if (!w.has_load) continue;
    s->queue_depth += w.load.queue_depth();
    s->queued_tokens += static_cast<int64_t>(w.load.queued_input_tokens());
    s->running += w.load.running_sequences();
    s->free += static_cast<int64_t>(w.load.free_kv_blocks());
    s->total += static_cast<int64_t>(w.load.total_kv_blocks());
  }
  for (auto [pool, sums] :
       {std::pair<Pool*, Sums*>{&prefill_, &prefill}, std::pair<Pool*, Sums*>{&decode_, &decode}}) {
    pool->queue_depth->Set(static_cast<double>(sums->queue_depth));
    pool->queued_input_tokens->Set(static_cast<double>(sums->queued_tokens));
    pool->running_sequences->Set(static_cast<double>(sums->running));
    pool->kv_cache_usage_ratio->Set(sums->total > 0 ? 1.0 - static_cast<double>(sums->free) /
                                                                static_cast<double>(sums->total)
                                                    : 0.0);
    pool->workers->Set(static_cast<double>(sums->workers));
  }
}

}  // namespace deepinfer::router
