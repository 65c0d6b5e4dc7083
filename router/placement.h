// Placement policies: given a snapshot of candidate workers and a request, choose the decode
// worker, and the prefill worker or "prefill locally on the decode worker".
//
// The caller (the router's request path) builds the snapshot from WorkerRegistry: one
// CandidateWorker per live prefill or decode worker of the request's model, with
// cached_prefix_blocks = WorkerRegistry::PrefixOverlap(worker_id, prompt's block hashes). A
// policy holds no worker state of its own, so the same snapshot always sees the same costs; only
// the tie-breaking draws depend on the policy's seeded generator.
//
// Every Decide:
//   1. validates the request and the snapshot (kInvalidArgument naming the field);
//   2. costs every candidate (PlacementDecision::costs lists them all, in snapshot order);
//   3. chooses the decode worker: lowest cost among the decode workers with at least
//      blocks_needed free KV blocks that can serve the request (see local prefill below);
//   4. prefills locally on that decode worker when it can_prefill and either its uncached part of
//      the prompt is below Options::local_prefill_threshold_tokens (conditional
//      disaggregation), or the measured transfer cost says disaggregating does not pay
//      (Options::max_exposed_transfer_fraction with PlacementRequest::transfer_cost: the
//      predicted exposed KV transfer of its uncached tokens exceeds that fraction of their
//      predicted prefill compute), or Options::load_aware_local_prefill predicts an earlier
//      first token locally (below), or there is no prefill worker at all; otherwise chooses the
//      prefill worker with the lowest prefill cost.
//
// Load-aware local prefill (Options::load_aware_local_prefill), for a can_prefill decode worker
// whose uncached part is not below the threshold: the predicted time to the prompt's KV being
// ready on the decode worker, both ways, with C = the transfer cost model's prefill compute and
// E its exposed transfer (PlacementRequest::transfer_cost):
//   remote = C(P.queued_input_tokens + P's uncached tokens) + E(P's uncached tokens), where P is
//            the prefill worker with the lowest prefill cost (the one a remote prefill gets);
//   local  = C(decode worker's queued_input_tokens + its uncached tokens)
//            + running_sequences * C(its uncached tokens),
// the last term being the stall the local prefill adds to each sequence decoding there (its
// tokens wait for the prefill's chunks), so that the comparison is of the latency added to all
// requests, not only to this one's first token. The decode worker prefills locally when
// local < remote (ties stay remote). Both workers are taken to compute at the measured rate.
// Before the model has a prediction (or without transfer_cost) the same comparison runs in
// tokens (C(n) = n, E = 0).
//
// SLO-aware local prefill (Options::slo_ttft_us and slo_itl_us both > 0; it then decides instead
// of the load-aware rule), for a can_prefill decode worker whose uncached part is not below the
// threshold, with C, E and P as above:
//   remote_ttft = C(P.queued_input_tokens + P's uncached tokens) + E(P's uncached tokens);
//   local_ttft  = C(decode worker's queued_input_tokens + its uncached tokens);
//   gap         = running_sequences / decode_tokens_per_second (the measured time between two
//                 tokens of each running sequence now; 0 when nothing runs there).
// The decode worker prefills locally when the request gains (remote_ttft > slo_ttft_us: it would
// miss its TTFT remotely, so it is placed where it adds nothing to the prefill worker's queue; or
// local_ttft < remote_ttft) and the decode worker has room in both budgets:
//   local_ttft / slo_ttft_us + gap / slo_itl_us <= 1.
// Why that sum: a local prefill is only worth doing if it finishes within the TTFT SLO; over that
// window a running sequence emits at most slo_ttft_us / slo_itl_us tokens at the ITL target, and
// the prefill's compute (its queue's too) is interleaved with them, so each of those tokens
// waits gap + local_ttft * slo_itl_us / slo_ttft_us on average; that stays within slo_itl_us
// exactly when the sum is at most 1. The rule needs measured rates: before the transfer cost
// model predicts (or without transfer_cost), or while sequences run on a decode worker that has
// not reported a decode rate, it keeps the prompt remote.
// Candidates whose costs are equal (within a relative 1e-9) are broken by a power-of-two random
// choice: two of the tied are drawn at random and the one with the lower secondary load wins
// (prefill: shorter queue; decode: fewer running sequences, then more free KV blocks); when
// those are equal too, the first drawn wins.
//
// Uncached tokens of a prompt on a worker: prompt_tokens minus the tokens of the cached leading
// blocks, where at most floor((prompt_tokens - 1) / block_size) blocks count, because a worker
// always computes at least the prompt's last token to produce logits (BlockManager does the
// same).
//
// Errors: kUnavailable when there is no decode worker, or when no decode worker with room can
// prefill locally and there is no prefill worker; kResourceExhausted when no decode worker has
// blocks_needed free KV blocks (back off); kInvalidArgument for a malformed request/snapshot.
// Each decision is logged at debug level with its inputs and counted in PlacementCounters.
//
// Thread-safety: Decide and counters() of every policy are thread-safe.
#ifndef DEEPINFER_ROUTER_PLACEMENT_H_
#define DEEPINFER_ROUTER_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"
#include "router/transfer_cost.h"

namespace deepinfer::router {

// One live worker as the caller sees it now. Counts are from the worker's last load report plus
// what the router placed there since (WorkerSnapshot::placed_*), as the caller chooses.
struct CandidateWorker {
  std::string worker_id;  // non-empty, unique within a snapshot
  internal::v1::WorkerRole role = internal::v1::WORKER_ROLE_UNSPECIFIED;  // ENCODER: ignored
  bool can_prefill = false;         // decode workers only: may prefill locally
  int64_t queue_depth = 0;          // requests waiting to start
  int64_t queued_input_tokens = 0;  // prompt tokens still to compute
  int64_t running_sequences = 0;    // in the running batch
  int64_t free_kv_blocks = 0;       // <= total_kv_blocks
  int64_t total_kv_blocks = 0;
  int64_t cached_prefix_blocks = 0;  // leading prompt blocks held (PrefixOverlap)
  // Decode workers: tokens decoded per second over the last load report's interval (all
  // running sequences together); 0 when not measured. >= 0, finite.
  double decode_tokens_per_second = 0;
};

struct PlacementRequest {
  std::string request_id;     // for logs
  int64_t prompt_tokens = 0;  // >= 1
  int64_t blocks_needed = 0;  // KV blocks the decode worker must have free; >= 0
  int64_t block_size = 0;     // tokens per KV block; >= 1
  // The measured cost of a remote prefill of `tokens` uncached tokens (TransferCostModel::
  // Predict), for Options::max_exposed_transfer_fraction and load_aware_local_prefill; empty, or
  // nullopt (not measured yet): the first rule does not apply, the second compares tokens.
  std::function<std::optional<TransferCostEstimate>(int64_t tokens)> transfer_cost;
};

enum class PlacementOutcome {
  kRemotePrefill,                // disaggregated: prefill worker -> decode worker
  kLocalPrefillBelowThreshold,   // uncached part below the threshold
  kLocalPrefillNoPrefillWorker,  // no prefill worker in the snapshot
  kLocalPrefillTransferCost,     // the measured transfer would cost too much of the TTFT
  kLocalPrefillLoad,             // load-aware: local prefill predicted to finish sooner
  kLocalPrefillSlo,              // SLO-aware: the SLOs are predicted to hold locally
};
absl::string_view PlacementOutcomeName(PlacementOutcome outcome);

// One candidate's cost as the policy computed it (lower is better).
struct CandidateCost {
  std::string worker_id;
  internal::v1::WorkerRole role = internal::v1::WORKER_ROLE_UNSPECIFIED;
  // Prompt tokens this worker would compute if it prefilled the request.
  int64_t uncached_tokens = 0;
  // Prefill workers: the prefill cost. Decode workers: the cost the decode choice compares,
  // decode_cost + prefill_cost.
  double cost = 0;
  // Decode workers only: the decode part, and the prefill part of the route this worker would
  // get (local prefill cost, or the best prefill worker's cost; 0 where the policy chooses the
  // decode worker by decode load alone).
  double decode_cost = 0;
  double prefill_cost = 0;
  // Decode workers only: would prefill locally if chosen.
  bool local_prefill = false;
  // False when the worker cannot take the request (decode: too few free KV blocks, or no
  // prefill route).
  bool eligible = false;
};

struct PlacementDecision {
  std::string decode_worker;
  // Empty when the decode worker prefills locally.
  std::string prefill_worker;
  PlacementOutcome outcome = PlacementOutcome::kRemotePrefill;
  // Prompt tokens the chosen prefill target computes.
  int64_t uncached_tokens = 0;
  // Every candidate, in snapshot order.
  std::vector<CandidateCost> costs;
  // True when a choice was made among tied candidates.
  bool tie_broken = false;
  // One line: what was chosen and why.
  std::string reason;
};

// Decisions per outcome since the policy was created.
struct PlacementCounters {
  int64_t remote_prefill = 0;
  int64_t local_prefill_below_threshold = 0;
  int64_t local_prefill_no_prefill_worker = 0;
  int64_t local_prefill_transfer_cost = 0;
  int64_t local_prefill_load = 0;
  int64_t local_prefill_slo = 0;
  int64_t tie_breaks = 0;        // decisions that broke at least one tie
  int64_t no_decode_worker = 0;  // kUnavailable
  int64_t no_kv_room = 0;        // kResourceExhausted
  int64_t no_prefill_route = 0;  // kUnavailable: nobody can prefill
  int64_t invalid_request = 0;   // kInvalidArgument
};

// Shared by the policies; each ignores what it does not use.
struct PlacementOptions {
  // Prefill locally on a can_prefill decode worker when its uncached part of the prompt is below
  // this many tokens; 0 turns conditional disaggregation off. >= 0.
  int64_t local_prefill_threshold_tokens = 512;
  // Prefill locally on a can_prefill decode worker (at or above the threshold too) when the
  // request's transfer_cost predicts an exposed KV transfer above this fraction of the prefill
  // compute: for short prompts the fixed cost of a transfer outweighs what disaggregation saves.
  // 0 turns the rule off. >= 0, finite.
  double max_exposed_transfer_fraction = 0;
  // Prefill locally on a can_prefill decode worker (at or above the threshold too) when that is
  // predicted to add less latency (its queue, the prompt, and the stall of its running decodes)
  // than the least-loaded prefill worker's queue, the prompt and the exposed transfer (file
  // comment: load-aware local prefill).
  bool load_aware_local_prefill = false;
  // SLO-aware local prefill (file comment), on when both are > 0, and then instead of
  // load_aware_local_prefill: the TTFT and ITL targets in microseconds. Each >= 0 and finite;
  // both 0 or both > 0.
  double slo_ttft_us = 0;
  double slo_itl_us = 0;
  // CacheAwarePolicy weights, all >= 0 and finite:
  //   prefill cost = w_uncached_tokens * uncached tokens + w_queued_tokens * queued input tokens
  //   decode cost  = w_kv_used * (KV used fraction after placing blocks_needed)
  //                  + w_running_sequences * running sequences
  // Both are in "prefill token" units, so a decode worker's cost adds the prefill cost of the
  // route it would get.
  double w_uncached_tokens = 1.0;
  double w_queued_tokens = 1.0;
  double w_kv_used = 4096.0;
  double w_running_sequences = 64.0;
  // Seeds the tie-breaking draws.
  uint64_t rng_seed = 0;
};

class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;

  // See the file comment. `candidates` may hold workers of other roles (encoders), which are
  // ignored and not listed in costs.
  virtual absl::StatusOr<PlacementDecision> Decide(
      const PlacementRequest& request, absl::Span<const CandidateWorker> candidates) = 0;

  virtual PlacementCounters counters() const = 0;
  virtual absl::string_view name() const = 0;
};

// The common algorithm (file comment); subclasses supply the costs.
class ScoredPlacementPolicy : public PlacementPolicy {
 public:
  absl::StatusOr<PlacementDecision> Decide(const PlacementRequest& request,
                                           absl::Span<const CandidateWorker> candidates) final;
  PlacementCounters counters() const final;

 protected:
  explicit ScoredPlacementPolicy(const PlacementOptions& options);

  // Prompt tokens `worker` would compute (the file comment's rule, or the whole prompt for a
  // policy that ignores the cache).
  virtual int64_t UncachedTokens(const PlacementRequest& request,
                                 const CandidateWorker& worker) const = 0;
  // Cost of `worker` prefilling `uncached_tokens` of the prompt.
  virtual double PrefillCost(const CandidateWorker& worker, int64_t uncached_tokens) const = 0;
  // Cost of decoding on `worker` (which has room for the request).
  virtual double DecodeCost(const PlacementRequest& request,
                            const CandidateWorker& worker) const = 0;
  // Whether a decode worker's cost includes the prefill cost of its route.
  virtual bool JointCost() const = 0;

  const PlacementOptions options_;

 private:
  // Index into `tied` (non-empty) chosen by the power-of-two rule; `better(a, b)` says whether a
  // has the lower secondary load.
  template <typename Better>
  size_t BreakTie(const std::vector<size_t>& tied, Better better)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  PlacementCounters counters_ ABSL_GUARDED_BY(mu_);
};

// Ignores the prefix cache: every worker would compute the whole prompt.
//   prefill cost = queued input tokens on the worker (secondary: queue depth)
//   decode cost  = running sequences (secondary: more free KV blocks)
// Local prefill when a can_prefill decode worker is chosen and the whole prompt is below the
// threshold, or when there is no prefill worker. The decode worker is chosen by decode load alone.
class LeastLoadedPolicy final : public ScoredPlacementPolicy {
 public:
  // kInvalidArgument naming the option (ValidatePlacementOptions).
  static absl::StatusOr<std::unique_ptr<LeastLoadedPolicy>> Create(const PlacementOptions& options);
  absl::string_view name() const override { return "least_loaded"; }

 protected:
  int64_t UncachedTokens(const PlacementRequest& request,
                         const CandidateWorker& worker) const override;
  double PrefillCost(const CandidateWorker& worker, int64_t uncached_tokens) const override;
  double DecodeCost(const PlacementRequest& request, const CandidateWorker& worker) const override;
  bool JointCost() const override { return false; }

 private:
  explicit LeastLoadedPolicy(const PlacementOptions& options) : ScoredPlacementPolicy(options) {}
};

// Prefix-cache aware, with the weighted costs of PlacementOptions. A decode worker's cost adds
// the prefill cost of its route: w_uncached * its own uncached tokens + w_queued * its queued
// input tokens when it would prefill locally, else the cheapest prefill worker's cost. So a
// decode worker that already holds the conversation's prefix wins when it can prefill the rest
// locally.
class CacheAwarePolicy final : public ScoredPlacementPolicy {
 public:
  // kInvalidArgument naming the option (ValidatePlacementOptions).
  static absl::StatusOr<std::unique_ptr<CacheAwarePolicy>> Create(const PlacementOptions& options);
  absl::string_view name() const override { return "cache_aware"; }

 protected:
  int64_t UncachedTokens(const PlacementRequest& request,
                         const CandidateWorker& worker) const override;
  double PrefillCost(const CandidateWorker& worker, int64_t uncached_tokens) const override;
  double DecodeCost(const PlacementRequest& request, const CandidateWorker& worker) const override;
  bool JointCost() const override { return true; }

 private:
  explicit CacheAwarePolicy(const PlacementOptions& options) : ScoredPlacementPolicy(options) {}
};

// OK, or kInvalidArgument naming the first bad field ("local_prefill_threshold_tokens: expected
// >= 0; got -1").
absl::Status ValidatePlacementOptions(const PlacementOptions& options);

// The policy named `name` ("least_loaded" or "cache_aware"). kInvalidArgument naming `flag_name`
// and the accepted names for an unknown name; ValidatePlacementOptions' error for bad options.
absl::StatusOr<std::unique_ptr<PlacementPolicy>> CreatePlacementPolicy(
    absl::string_view name, const PlacementOptions& options,
    absl::string_view flag_name = "placement_policy");

// Tokens of `prompt_tokens` not covered by `cached_prefix_blocks` leading blocks of `block_size`
// (the file comment's rule). Requires prompt_tokens >= 1, block_size >= 1.
int64_t UncachedPromptTokens(int64_t prompt_tokens, int64_t cached_prefix_blocks,
                             int64_t block_size);

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_PLACEMENT_H_
