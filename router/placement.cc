#include "router/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/worker_role.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

using internal::v1::WORKER_ROLE_DECODE;
using internal::v1::WORKER_ROLE_PREFILL;
using internal::v1::WORKER_ROLE_UNSPECIFIED;
using internal::v1::WorkerRole;

bool Tied(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max({1.0, std::fabs(a), std::fabs(b)});
}

absl::Status ValidateRequest(const PlacementRequest& request,
                             absl::Span<const CandidateWorker> candidates) {
  if (request.prompt_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request.prompt_tokens: expected >= 1; got ", request.prompt_tokens));
  }
  if (request.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("request.block_size: expected >= 1; got ", request.block_size));
  }
  if (request.blocks_needed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request.blocks_needed: expected >= 0; got ", request.blocks_needed));
  }
  absl::flat_hash_map<absl::string_view, size_t> seen;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const CandidateWorker& c = candidates[i];
    const std::string field = absl::StrCat("candidates[", i, "].");
    if (c.worker_id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, "worker_id: expected non-empty"));
    }
    auto [it, inserted] = seen.emplace(c.worker_id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(field, "worker_id: expected unique; got \"",
                                                     c.worker_id, "\" again (also candidates[",
                                                     it->second, "])"));
    }
    if (c.role == WORKER_ROLE_UNSPECIFIED || !internal::v1::WorkerRole_IsValid(c.role)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "role: expected PREFILL, DECODE or ENCODER; got ", c.role));
    }
    const std::pair<const char*, int64_t> counts[] = {
        {"queue_depth", c.queue_depth},
        {"queued_input_tokens", c.queued_input_tokens},
        {"running_sequences", c.running_sequences},
        {"free_kv_blocks", c.free_kv_blocks},
        {"total_kv_blocks", c.total_kv_blocks},
        {"cached_prefix_blocks", c.cached_prefix_blocks},
    };
    for (const auto& [name, value] : counts) {
      if (value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, name, ": expected >= 0; got ", value));
      }
    }
    if (!std::isfinite(c.decode_tokens_per_second) || c.decode_tokens_per_second < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "decode_tokens_per_second: expected finite and >= 0; got ",
          c.decode_tokens_per_second));
    }
    if (c.free_kv_blocks > c.total_kv_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "free_kv_blocks: expected <= ", "total_kv_blocks (",
                       c.total_kv_blocks, "); got ", c.free_kv_blocks));
    }
  }
  return absl::OkStatus();
}

std::string DescribeInputs(absl::string_view policy, const PlacementRequest& request,
                           absl::Span<const CandidateWorker> candidates,
                           const std::vector<CandidateCost>& costs) {
  std::string out = absl::StrFormat(
      "[req=%s] placement %s: prompt_tokens=%d blocks_needed=%d block_size=%d; candidates:",
      request.request_id, policy, request.prompt_tokens, request.blocks_needed, request.block_size);
  size_t k = 0;
  for (const CandidateWorker& c : candidates) {
    if (c.role != WORKER_ROLE_PREFILL && c.role != WORKER_ROLE_DECODE) continue;
    absl::StrAppendFormat(&out,
                          " {%s %s%s queue=%d queued_tokens=%d running=%d kv_free=%d/%d "
                          "cached_blocks=%d",
                          c.worker_id, WorkerRoleName(c.role), c.can_prefill ? " can_prefill" : "",
                          c.queue_depth, c.queued_input_tokens, c.running_sequences,
                          c.free_kv_blocks, c.total_kv_blocks, c.cached_prefix_blocks);
    if (k < costs.size() && costs[k].worker_id == c.worker_id) {
      const CandidateCost& cost = costs[k++];
      absl::StrAppendFormat(&out, " uncached=%d cost=%g", cost.uncached_tokens, cost.cost);
      if (cost.role == WORKER_ROLE_DECODE) {
        absl::StrAppendFormat(&out, " (decode %g + prefill %g%s)%s", cost.decode_cost,
                              cost.prefill_cost, cost.local_prefill ? " local" : "",
                              cost.eligible ? "" : " ineligible");
      }
    }
    out += "}";
  }
  return out;
}

// The transfer-cost rule (PlacementOptions::max_exposed_transfer_fraction): true when the
// measured costs predict that a remote prefill of `tokens` leaves more exposed transfer than the
// allowed fraction of its compute.
bool TransferTooCostly(const PlacementOptions& options, const PlacementRequest& request,
                       int64_t tokens) {
  if (options.max_exposed_transfer_fraction <= 0 || !request.transfer_cost) return false;
  const std::optional<TransferCostEstimate> e = request.transfer_cost(tokens);
  return e.has_value() &&
         e->exposed_transfer_us > options.max_exposed_transfer_fraction * e->prefill_compute_us;
}

// Load-aware local prefill (header comment): the predicted times to the prompt's KV being ready
// on the decode worker, prefilled there or on `prefill`, the local one plus the stall its compute
// adds to each of the decode worker's running sequences; in microseconds when the transfer cost
// model predicts, else in tokens.
struct LoadComparison {
  double local = 0;
  double remote = 0;
  bool measured = false;
};
LoadComparison CompareLoad(const PlacementRequest& request, const CandidateWorker& decode,
                           int64_t local_tokens, const CandidateWorker& prefill,
                           int64_t remote_tokens) {
  const int64_t local_total = decode.queued_input_tokens + local_tokens;
  const int64_t remote_total = prefill.queued_input_tokens + remote_tokens;
  LoadComparison r;
  if (request.transfer_cost) {
    const std::optional<TransferCostEstimate> local = request.transfer_cost(local_total);
    const std::optional<TransferCostEstimate> remote = request.transfer_cost(remote_total);
    const std::optional<TransferCostEstimate> own = request.transfer_cost(remote_tokens);
    const std::optional<TransferCostEstimate> stall = request.transfer_cost(local_tokens);
    if (local.has_value() && remote.has_value() && own.has_value() && stall.has_value()) {
      r.measured = true;
      r.local = local->prefill_compute_us +
                static_cast<double>(decode.running_sequences) * stall->prefill_compute_us;
      r.remote = remote->prefill_compute_us + own->exposed_transfer_us;
      return r;
    }
  }
  r.local = static_cast<double>(local_total + decode.running_sequences * local_tokens);
  r.remote = static_cast<double>(remote_total);
  return r;
}

// SLO-aware local prefill (header comment). `local` is set only when the rule says local.
struct SloComparison {
  double local_ttft = 0;
  double remote_ttft = 0;
  double gap = 0;
  double budget = 0;  // local_ttft / slo_ttft + gap / slo_itl
  bool local = false;
};
SloComparison CompareSlo(const PlacementOptions& options, const PlacementRequest& request,
                         const CandidateWorker& decode, int64_t local_tokens,
                         const CandidateWorker& prefill, int64_t remote_tokens) {
  SloComparison r;
  if (!request.transfer_cost) return r;
  const std::optional<TransferCostEstimate> local =
      request.transfer_cost(decode.queued_input_tokens + local_tokens);
  const std::optional<TransferCostEstimate> remote =
      request.transfer_cost(prefill.queued_input_tokens + remote_tokens);
  const std::optional<TransferCostEstimate> own = request.transfer_cost(remote_tokens);
  if (!local.has_value() || !remote.has_value() || !own.has_value()) return r;
  if (decode.running_sequences > 0) {
    if (!(decode.decode_tokens_per_second > 0)) return r;  // stall of its decodes unknown
    r.gap = 1e6 * static_cast<double>(decode.running_sequences) / decode.decode_tokens_per_second;
  }
  r.local_ttft = local->prefill_compute_us;
  r.remote_ttft = remote->prefill_compute_us + own->exposed_transfer_us;
  r.budget = r.local_ttft / options.slo_ttft_us + r.gap / options.slo_itl_us;
  const bool gains = r.remote_ttft > options.slo_ttft_us || r.local_ttft < r.remote_ttft;
  r.local = gains && r.budget <= 1.0;
  return r;
}

bool SloAware(const PlacementOptions& options) {
  return options.slo_ttft_us > 0 && options.slo_itl_us > 0;
}

}  // namespace

absl::string_view PlacementOutcomeName(PlacementOutcome outcome) {
  switch (outcome) {
    case PlacementOutcome::kRemotePrefill:
      return "remote_prefill";
    case PlacementOutcome::kLocalPrefillBelowThreshold:
      return "local_prefill_below_threshold";
    case PlacementOutcome::kLocalPrefillNoPrefillWorker:
      return "local_prefill_no_prefill_worker";
    case PlacementOutcome::kLocalPrefillTransferCost:
      return "local_prefill_transfer_cost";
    case PlacementOutcome::kLocalPrefillLoad:
      return "local_prefill_load";
    case PlacementOutcome::kLocalPrefillSlo:
      return "local_prefill_slo";
  }
  return "unknown";
}

int64_t UncachedPromptTokens(int64_t prompt_tokens, int64_t cached_prefix_blocks,
                             int64_t block_size) {
  const int64_t usable_blocks = std::min(cached_prefix_blocks, (prompt_tokens - 1) / block_size);
  return prompt_tokens - std::max<int64_t>(usable_blocks, 0) * block_size;
}

absl::Status ValidatePlacementOptions(const PlacementOptions& options) {
  if (options.local_prefill_threshold_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_prefill_threshold_tokens: expected >= 0; got ",
                     options.local_prefill_threshold_tokens));
  }
  if (!(options.max_exposed_transfer_fraction >= 0) ||
      !std::isfinite(options.max_exposed_transfer_fraction)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_exposed_transfer_fraction: expected finite and >= 0; got ",
                     options.max_exposed_transfer_fraction));
  }
  const std::pair<const char*, double> slos[] = {
      {"slo_ttft_us", options.slo_ttft_us},
      {"slo_itl_us", options.slo_itl_us},
  };
  for (const auto& [name, value] : slos) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected finite and >= 0; got ", value));
    }
  }
  if ((options.slo_ttft_us > 0) != (options.slo_itl_us > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slo_itl_us: expected > 0 together with slo_ttft_us, or both 0; got slo_ttft_us=",
        options.slo_ttft_us, " slo_itl_us=", options.slo_itl_us));
  }
  const std::pair<const char*, double> weights[] = {
      {"w_uncached_tokens", options.w_uncached_tokens},
      {"w_queued_tokens", options.w_queued_tokens},
      {"w_kv_used", options.w_kv_used},
      {"w_running_sequences", options.w_running_sequences},
  };
  for (const auto& [name, value] : weights) {
    if (!std::isfinite(value) || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": expected a finite weight >= 0; got ", value));
    }
  }
  return absl::OkStatus();
}

ScoredPlacementPolicy::ScoredPlacementPolicy(const PlacementOptions& options)
    : options_(options), rng_(options.rng_seed) {}

PlacementCounters ScoredPlacementPolicy::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

template <typename Better>
size_t ScoredPlacementPolicy::BreakTie(const std::vector<size_t>& tied, Better better) {
  if (tied.size() == 1) return tied.front();
  std::uniform_int_distribution<size_t> first(0, tied.size() - 1);
  std::uniform_int_distribution<size_t> second(0, tied.size() - 2);
  const size_t i = first(rng_);
  size_t j = second(rng_);
  if (j >= i) ++j;
  return better(tied[j], tied[i]) ? tied[j] : tied[i];
}

absl::StatusOr<PlacementDecision> ScoredPlacementPolicy::Decide(
    const PlacementRequest& request, absl::Span<const CandidateWorker> candidates) {
  if (absl::Status valid = ValidateRequest(request, candidates); !valid.ok()) {
    {
      absl::MutexLock lock(&mu_);
      ++counters_.invalid_request;
    }
    spdlog::debug("[req={}] placement {}: {}", request.request_id, std::string(name()),
                  valid.ToString());
    return valid;
  }

  PlacementDecision decision;
  std::vector<size_t> prefill;  // indices into decision.costs
  std::vector<size_t> decode;
  std::vector<const CandidateWorker*> worker;  // parallel to decision.costs
  double best_prefill_cost = std::numeric_limits<double>::infinity();
  size_t best_prefill_index = 0;  // the first with best_prefill_cost
  for (const CandidateWorker& c : candidates) {
    if (c.role != WORKER_ROLE_PREFILL && c.role != WORKER_ROLE_DECODE) continue;
    CandidateCost cost;
    cost.worker_id = c.worker_id;
    cost.role = c.role;
    cost.uncached_tokens = UncachedTokens(request, c);
    if (c.role == WORKER_ROLE_PREFILL) {
      cost.cost = PrefillCost(c, cost.uncached_tokens);
      cost.eligible = true;
      if (cost.cost < best_prefill_cost) {
        best_prefill_cost = cost.cost;
        best_prefill_index = decision.costs.size();
      }
      prefill.push_back(decision.costs.size());
    } else {
      decode.push_back(decision.costs.size());
    }
    worker.push_back(&c);
    decision.costs.push_back(std::move(cost));
  }

  const int64_t threshold = options_.local_prefill_threshold_tokens;
  // Decode workers that prefill locally by the load-aware rule, with its comparison.
  absl::flat_hash_map<size_t, LoadComparison> local_by_load;
  // Decode workers that prefill locally by the SLO-aware rule, with its comparison.
  absl::flat_hash_map<size_t, SloComparison> local_by_slo;
  int64_t most_free = -1;
  std::string most_free_id;
  bool any_room = false;
  for (size_t k : decode) {
    const CandidateWorker& c = *worker[k];
    CandidateCost& cost = decision.costs[k];
    const bool has_room = c.free_kv_blocks >= request.blocks_needed;
    any_room = any_room || has_room;
    if (c.free_kv_blocks > most_free) {
      most_free = c.free_kv_blocks;
      most_free_id = c.worker_id;
    }
    cost.local_prefill = c.can_prefill && (prefill.empty() || cost.uncached_tokens < threshold ||
                                           TransferTooCostly(options_, request, cost.uncached_tokens));
    if (c.can_prefill && !cost.local_prefill && SloAware(options_)) {
      const SloComparison slo =
          CompareSlo(options_, request, c, cost.uncached_tokens, *worker[best_prefill_index],
                     decision.costs[best_prefill_index].uncached_tokens);
      if (slo.local) {
        cost.local_prefill = true;
        local_by_slo[k] = slo;
      }
    } else if (c.can_prefill && !cost.local_prefill && options_.load_aware_local_prefill) {
      const LoadComparison load =
          CompareLoad(request, c, cost.uncached_tokens, *worker[best_prefill_index],
                      decision.costs[best_prefill_index].uncached_tokens);
      if (load.local < load.remote) {
        cost.local_prefill = true;
        local_by_load[k] = load;
      }
    }
    cost.eligible = has_room && (cost.local_prefill || !prefill.empty());
    cost.decode_cost = DecodeCost(request, c);
    if (JointCost()) {
      cost.prefill_cost =
          cost.local_prefill ? PrefillCost(c, cost.uncached_tokens) : best_prefill_cost;
      if (!std::isfinite(cost.prefill_cost)) cost.prefill_cost = 0;  // no route: ineligible
    }
    cost.cost = cost.decode_cost + cost.prefill_cost;
  }

  // The lowest-cost eligible indices of `pool` (empty when none is eligible).
  auto lowest = [&](const std::vector<size_t>& pool) {
    std::vector<size_t> best;
    for (size_t k : pool) {
      const CandidateCost& cost = decision.costs[k];
      if (!cost.eligible) continue;
      if (!best.empty() && !Tied(cost.cost, decision.costs[best.front()].cost)) {
        if (cost.cost > decision.costs[best.front()].cost) continue;
        best.clear();
      }
      best.push_back(k);
    }
    return best;
  };

  absl::Status error;
  const std::vector<size_t> best_decode = lowest(decode);
  if (decode.empty()) {
    error = absl::UnavailableError(
        absl::StrCat("no decode worker among ", candidates.size(), " candidates"));
  } else if (!any_room) {
    error = absl::ResourceExhaustedError(
        absl::StrCat("no decode worker has ", request.blocks_needed,
                     " free KV blocks (most free: ", most_free, " on \"", most_free_id, "\")"));
  } else if (best_decode.empty()) {
    error = absl::UnavailableError(
        "no prefill worker, and no decode worker with room for the request can prefill locally");
  }
  if (!error.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (decode.empty()) {
        ++counters_.no_decode_worker;
      } else if (!any_room) {
        ++counters_.no_kv_room;
      } else {
        ++counters_.no_prefill_route;
      }
    }
    if (spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("{} -> {}", DescribeInputs(name(), request, candidates, decision.costs),
                    error.ToString());
    }
    return error;
  }

  size_t chosen_decode;
  size_t chosen_prefill = 0;
  std::vector<size_t> best_prefill;
  {
    absl::MutexLock lock(&mu_);
    chosen_decode = BreakTie(best_decode, [&](size_t a, size_t b) {
      const CandidateWorker& wa = *worker[a];
      const CandidateWorker& wb = *worker[b];
      if (wa.running_sequences != wb.running_sequences) {
        return wa.running_sequences < wb.running_sequences;
      }
      return wa.free_kv_blocks > wb.free_kv_blocks;
    });
    if (!decision.costs[chosen_decode].local_prefill) {
      best_prefill = lowest(prefill);
      chosen_prefill = BreakTie(best_prefill, [&](size_t a, size_t b) {
        return worker[a]->queue_depth < worker[b]->queue_depth;
      });
    }
    decision.tie_broken = best_decode.size() > 1 || best_prefill.size() > 1;

    const CandidateCost& d = decision.costs[chosen_decode];
    decision.decode_worker = d.worker_id;
    if (d.local_prefill) {
      decision.outcome = prefill.empty() ? PlacementOutcome::kLocalPrefillNoPrefillWorker
                         : d.uncached_tokens < threshold
                             ? PlacementOutcome::kLocalPrefillBelowThreshold
                         : local_by_load.contains(chosen_decode)
                             ? PlacementOutcome::kLocalPrefillLoad
                         : local_by_slo.contains(chosen_decode)
                             ? PlacementOutcome::kLocalPrefillSlo
                             : PlacementOutcome::kLocalPrefillTransferCost;
      decision.uncached_tokens = d.uncached_tokens;
    } else {
      decision.outcome = PlacementOutcome::kRemotePrefill;
      decision.prefill_worker = decision.costs[chosen_prefill].worker_id;
      decision.uncached_tokens = decision.costs[chosen_prefill].uncached_tokens;
    }
    switch (decision.outcome) {
      case PlacementOutcome::kRemotePrefill:
        ++counters_.remote_prefill;
        break;
      case PlacementOutcome::kLocalPrefillBelowThreshold:
        ++counters_.local_prefill_below_threshold;
        break;
      case PlacementOutcome::kLocalPrefillNoPrefillWorker:
        ++counters_.local_prefill_no_prefill_worker;
        break;
      case PlacementOutcome::kLocalPrefillTransferCost:
        ++counters_.local_prefill_transfer_cost;
        break;
      case PlacementOutcome::kLocalPrefillLoad:
        ++counters_.local_prefill_load;
        break;
      case PlacementOutcome::kLocalPrefillSlo:
        ++counters_.local_prefill_slo;
        break;
    }
    if (decision.tie_broken) ++counters_.tie_breaks;
  }

  const CandidateCost& d = decision.costs[chosen_decode];
  size_t eligible_decode = 0;
  for (size_t k : decode) eligible_decode += decision.costs[k].eligible ? 1 : 0;
  decision.reason = absl::StrFormat(
      "decode on %s (cost %g, lowest of %d eligible%s)", d.worker_id, d.cost, eligible_decode,
      best_decode.size() > 1 ? absl::StrCat(", power-of-two among ", best_decode.size(), " tied")
                             : "");
  switch (decision.outcome) {
    case PlacementOutcome::kLocalPrefillBelowThreshold:
      absl::StrAppendFormat(&decision.reason,
                            "; prefill locally: %d uncached tokens < threshold %d",
                            d.uncached_tokens, threshold);
      break;
    case PlacementOutcome::kLocalPrefillNoPrefillWorker:
      absl::StrAppendFormat(&decision.reason,
                            "; prefill locally: no prefill worker (%d uncached tokens)",
                            d.uncached_tokens);
      break;
    case PlacementOutcome::kLocalPrefillTransferCost: {
      const TransferCostEstimate e = *request.transfer_cost(d.uncached_tokens);
      absl::StrAppendFormat(&decision.reason,
                            "; prefill locally: %d uncached tokens, predicted exposed transfer "
                            "%.0fus > %g of predicted compute %.0fus",
                            d.uncached_tokens, e.exposed_transfer_us,
                            options_.max_exposed_transfer_fraction, e.prefill_compute_us);
      break;
    }
    case PlacementOutcome::kLocalPrefillLoad: {
      const LoadComparison& load = local_by_load.at(chosen_decode);
      absl::StrAppendFormat(&decision.reason,
                            "; prefill locally: %d uncached tokens ready sooner here (predicted "
                            "%.0f%s with the decodes' stall) than on %s (%.0f%s with exposed "
                            "transfer)",
                            d.uncached_tokens, load.local, load.measured ? "us" : " tokens",
                            decision.costs[best_prefill_index].worker_id, load.remote,
                            load.measured ? "us" : " tokens");
      break;
    }
    case PlacementOutcome::kLocalPrefillSlo: {
      const SloComparison& slo = local_by_slo.at(chosen_decode);
      absl::StrAppendFormat(&decision.reason,
                            "; prefill locally: %d uncached tokens, predicted TTFT %.0fus here vs "
                            "%.0fus via %s (SLO %.0fus), running decodes' gap %.0fus (ITL SLO "
                            "%.0fus), budget %.3f <= 1",
                            d.uncached_tokens, slo.local_ttft, slo.remote_ttft,
                            decision.costs[best_prefill_index].worker_id, options_.slo_ttft_us,
                            slo.gap, options_.slo_itl_us, slo.budget);
      break;
    }
    case PlacementOutcome::kRemotePrefill: {
      const CandidateCost& p = decision.costs[chosen_prefill];
      absl::StrAppendFormat(&decision.reason, "; prefill on %s (cost %g, %d uncached tokens%s%s)",
                            p.worker_id, p.cost, p.uncached_tokens,
                            best_prefill.size() > 1 ? absl::StrCat(", power-of-two among ",
                                                                   best_prefill.size(), " tied")
                                                    : "",
                            d.uncached_tokens < threshold ? ""
                                                          : ", decode-side part not below "
                                                            "the local-prefill threshold");
      break;
    }
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    spdlog::debug("{} -> {}", DescribeInputs(name(), request, candidates, decision.costs),
                  decision.reason);
  }
  return decision;
}

absl::StatusOr<std::unique_ptr<LeastLoadedPolicy>> LeastLoadedPolicy::Create(
    const PlacementOptions& options) {
  if (absl::Status valid = ValidatePlacementOptions(options); !valid.ok()) return valid;
  return std::unique_ptr<LeastLoadedPolicy>(new LeastLoadedPolicy(options));
}

int64_t LeastLoadedPolicy::UncachedTokens(const PlacementRequest& request,
                                          const CandidateWorker&) const {
  return request.prompt_tokens;
}

double LeastLoadedPolicy::PrefillCost(const CandidateWorker& worker, int64_t) const {
  return static_cast<double>(worker.queued_input_tokens);
}

double LeastLoadedPolicy::DecodeCost(const PlacementRequest&, const CandidateWorker& worker) const {
  return static_cast<double>(worker.running_sequences);
}

absl::StatusOr<std::unique_ptr<CacheAwarePolicy>> CacheAwarePolicy::Create(
    const PlacementOptions& options) {
  if (absl::Status valid = ValidatePlacementOptions(options); !valid.ok()) return valid;
  return std::unique_ptr<CacheAwarePolicy>(new CacheAwarePolicy(options));
}

int64_t CacheAwarePolicy::UncachedTokens(const PlacementRequest& request,
                                         const CandidateWorker& worker) const {
  return UncachedPromptTokens(request.prompt_tokens, worker.cached_prefix_blocks,
                              request.block_size);
}

double CacheAwarePolicy::PrefillCost(const CandidateWorker& worker, int64_t uncached_tokens) const {
  return options_.w_uncached_tokens * static_cast<double>(uncached_tokens) +
         options_.w_queued_tokens * static_cast<double>(worker.queued_input_tokens);
}

double CacheAwarePolicy::DecodeCost(const PlacementRequest& request,
                                    const CandidateWorker& worker) const {
  // A worker with no KV at all counts as full.
  const double used_after =
      worker.total_kv_blocks == 0
          ? 1.0
          : static_cast<double>(worker.total_kv_blocks - worker.free_kv_blocks +
                                request.blocks_needed) /
                static_cast<double>(worker.total_kv_blocks);
  return options_.w_kv_used * used_after +
         options_.w_running_sequences * static_cast<double>(worker.running_sequences);
}

absl::StatusOr<std::unique_ptr<PlacementPolicy>> CreatePlacementPolicy(
    absl::string_view name, const PlacementOptions& options, absl::string_view flag_name) {
  if (name == "least_loaded") {
    auto policy = LeastLoadedPolicy::Create(options);
    if (!policy.ok()) return policy.status();
    return std::unique_ptr<PlacementPolicy>(std::move(*policy));
  }
  if (name == "cache_aware") {
    auto policy = CacheAwarePolicy::Create(options);
    if (!policy.ok()) return policy.status();
    return std::unique_ptr<PlacementPolicy>(std::move(*policy));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag_name, ": expected least_loaded or cache_aware; got \"", name, "\""));
}

}  // namespace deepinfer::router
