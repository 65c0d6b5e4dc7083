// The router's view of its workers (prefill, decode and encoder nodes): who is registered, how
// loaded each is, which prefix-cache blocks each holds, and who has stopped sending heartbeats.
// WorkerRegistry is the state; WorkerRegistryService serves it as the
// deepinfer.internal.v1.WorkerRegistry gRPC service (proto/deepinfer/internal/v1/worker.proto).
//
// Lifecycle of a worker entry:
//   Register      validates WorkerInfo; a higher incarnation of a registered worker_id replaces
//                 the old entry (its KV block set and sequences start over); a lower one is
//                 refused with kAborted; the same one refreshes the entry (a retried Register).
//   ReportLoad    heartbeat + load; reports with a sequence not above the last accepted one only
//                 count as a heartbeat; an unknown worker or incarnation gets known=false.
//   PublishKvEvents  keeps the worker's set of cached block hashes (see below).
//   Deregister    removes the entry.
//   Sweep         removes every worker whose last message (Register, ReportLoad or
//                 PublishKvEvents) is more than missed_heartbeats_allowed * heartbeat_interval
//                 old. Such a worker counts as dropped even before a sweep removes it: selection
//                 skips it, and its next message removes it (ReportLoad then says known=false,
//                 PublishKvEvents kNotFound) so that it registers again.
// Every removal (replaced, deregistered, expired) calls Options::on_removed, so the caller can
// fail what was bound to that worker incarnation.
//
// KV events: batches are consecutive per incarnation starting at 1. A batch whose sequence
// skips ahead is a gap: the worker's block set is cleared (it may hold blocks since evicted), the
// batch is applied, and every ack says resync=true until a batch containing KIND_ALL_CLEARED
// (the start of the worker's snapshot) arrives. A batch at or below the last sequence is a
// duplicate and is ignored. A block counts as held while it is stored in any tier.
//
// Expected blocks: a worker reports the blocks a request left in its cache with its next
// heartbeat (up to heartbeat_interval later), but a chat's next turn arrives as soon as the
// client has the previous answer, milliseconds after it. ExpectStored records what the router
// knows the worker now holds (a request it finished there: prompt and answer), and PrefixOverlap
// counts those blocks until the worker's events confirm them (STORED), drop them (REMOVED,
// ALL_CLEARED, a gap) or Options::expected_block_ttl passes, so the next turn goes where its
// history is (conditional disaggregation: a decode node that holds it prefills only the new
// message). Only for a worker whose events have stored a block before (one without a prefix
// cache publishes none, and would otherwise be credited for a history it never kept).
//
// Placement (the first policy; prefix-aware scoring builds on PrefixOverlap):
//   PickPrefill: least queued input tokens, then shortest queue.
//   PickDecode:  most free KV blocks, then fewest running sequences; only workers with room for
//                the request's blocks.
// Loads are the last report plus what this router placed there since (so that requests arriving
// between two reports do not all land on the same worker). Workers tied on the key are broken by
// a power-of-two random choice: two of them drawn at random (seeded by Options::rng_seed), the
// one chosen less recently wins.
//
// Time comes from Options::clock (STYLE.md 9), so tests drive expiry with a fake clock and call
// Sweep() themselves; production calls Start(), which sweeps on a background thread every
// heartbeat interval (waiting in real time, judging expiry by the clock).
//
// Thread-safety: every method of WorkerRegistry and WorkerRegistryService is thread-safe.
// on_removed runs on the calling (or sweeper) thread with no lock held, so it may call back into
// the registry.
#ifndef DEEPINFER_ROUTER_WORKER_REGISTRY_H_
#define DEEPINFER_ROUTER_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::router {

// A copy of one worker's entry.
struct WorkerSnapshot {
  internal::v1::WorkerInfo info;
  // The last accepted load report (all zero before the first).
  internal::v1::LoadReport load;
  bool has_load = false;
  absl::Time registered_at;
  absl::Time last_heartbeat;
  // Block hashes this worker's prefix cache holds, as its KV events say.
  int64_t cached_blocks = 0;
  // Blocks expected (ExpectStored) and not yet confirmed or dropped by its events, nor forgotten
  // by Sweep after they expired.
  int64_t expected_blocks = 0;
  // A KV-event gap was seen and no snapshot has arrived since.
  bool kv_resync_pending = false;
  // Placed by this router since the last accepted load report.
  int64_t placed_requests = 0;
  int64_t placed_tokens = 0;  // PickPrefill: input tokens
  int64_t placed_blocks = 0;  // PickDecode: KV blocks
  // Which load report the placed_* counts are relative to (for ReleasePlacement).
  uint64_t load_epoch = 0;
};

class WorkerRegistry {
 public:
  struct Options {
    // Sent to workers in RegisterResponse; > 0.
    absl::Duration heartbeat_interval = absl::Seconds(1);
    // A worker silent for more than this many intervals is dropped; >= 1.
    int missed_heartbeats_allowed = 3;
    // absl::Now when empty.
    std::function<absl::Time()> clock;
    // Seeds the tie-breaking draws.
    uint64_t rng_seed = 0;
    // Most block hashes remembered per worker; STORED events beyond it are not recorded (the
    // router then under-estimates that worker's cache, which costs hit rate, not correctness).
    int64_t max_blocks_per_worker = int64_t{1} << 22;
    // How long an expected block (ExpectStored) counts without the worker confirming it; > 0.
    // Its KV events come with each heartbeat, so a few intervals.
    absl::Duration expected_block_ttl = absl::Seconds(3);
    // Called after a worker entry is removed, with the removed entry's info and why:
    // kAborted (replaced by a newer incarnation), kCancelled (deregistered) or kUnavailable
    // (missed heartbeats).
    std::function<void(const internal::v1::WorkerInfo&, const absl::Status&)> on_removed;
  };

  // kInvalidArgument for a non-positive heartbeat interval, missed_heartbeats_allowed < 1,
  // max_blocks_per_worker < 0 or a non-positive expected_block_ttl.
  static absl::StatusOr<std::unique_ptr<WorkerRegistry>> Create(Options options);

  WorkerRegistry(const WorkerRegistry&) = delete;
  WorkerRegistry& operator=(const WorkerRegistry&) = delete;
  // Stops the sweeper if running.
  ~WorkerRegistry();

  // Starts the background sweeper (once; later calls do nothing). Stop() ends it; idempotent.
  void Start();
  void Stop();

  // Validates `worker` and adds or replaces its entry. kInvalidArgument naming the field
  // (worker.worker_id: 1..128 bytes; worker.role: not UNSPECIFIED; worker.address: a connectable
  // host:port; worker.model: non-empty; worker.incarnation: non-zero; worker.block_size: > 0 for
  // prefill and decode workers; worker.kv_metadata: agent_name and incarnation match the
  // worker's when set); kFailedPrecondition when block_size, block_hash_seed or the speculative
  // config (method; with a method other than "off" also num_speculative_tokens, min_n, max_n,
  // adaptive; an unset config counts as "off") differ from the other prefill/decode workers of
  // the same model, naming the field and both values; kAborted when a higher incarnation of this
  // worker_id is registered. The response lists every other registered prefill/decode worker.
  absl::StatusOr<internal::v1::RegisterResponse> Register(const internal::v1::WorkerInfo& worker);

  internal::v1::LoadReportResponse ReportLoad(const internal::v1::LoadReport& report);

  // OK when the entry was removed or was not there; kAborted when a different incarnation is
  // registered (it stays).
  absl::Status Deregister(absl::string_view worker_id, uint64_t incarnation);

  // kNotFound for an unknown worker_id, kAborted for a different incarnation, kInvalidArgument
  // (naming events[i].kind / events[i].block_hashes / events[i].tier) for a malformed batch,
  // which is then not applied.
  absl::StatusOr<internal::v1::KvEventAck> PublishKvEvents(const internal::v1::KvEventBatch& batch);

  // How many of `block_hashes` (a prompt's hash chain, in order), counted from the first, the
  // worker holds, by its KV events or as still-expected blocks (ExpectStored). 0 for an unknown
  // worker.
  int64_t PrefixOverlap(absl::string_view worker_id, absl::Span<const uint64_t> block_hashes) const;

  // The router knows that `worker_id` (at `incarnation`) now holds `block_hashes` (the full
  // blocks of a request that just finished there: see the file comment), before the worker's KV
  // events say so. Ignored for an unknown worker or incarnation, and for a worker whose events
  // never stored a block. Blocks it already reported stay as they are; the others count as held
  // for Options::expected_block_ttl unless its events drop or confirm them first.
  void ExpectStored(absl::string_view worker_id, uint64_t incarnation,
                    absl::Span<const uint64_t> block_hashes);

  // Removes the workers past their heartbeat deadline; returns how many. Also forgets expired
  // expected blocks.
  int Sweep();

  // The least loaded live prefill worker of `model` (see the file comment), recording
  // `input_tokens` placed on it. Workers whose worker_id is in `exclude` are never chosen (a
  // retry after a failure there). kUnavailable when there is none.
  absl::StatusOr<WorkerSnapshot> PickPrefill(absl::string_view model, int64_t input_tokens,
                                             absl::Span<const std::string> exclude = {});

  // The live decode worker of `model` with the most free KV blocks among those with at least
  // `blocks_needed` free, recording the blocks placed on it; workers in `exclude` are skipped.
  // kUnavailable when the model has no live decode worker (outside `exclude`),
  // kResourceExhausted when none has room.
  absl::StatusOr<WorkerSnapshot> PickDecode(absl::string_view model, int64_t blocks_needed,
                                            absl::Span<const std::string> exclude = {});

  // Records one request placed on `worker_id` by a caller that chose it from a snapshot (the
  // placement policies of router/placement.h): `input_tokens` prompt tokens it will compute and
  // `blocks` KV blocks it will hold count in its placed_* until the next accepted load report
  // (or ReleasePlacement). Returns the updated snapshot, whose load_epoch ReleasePlacement takes.
  // kInvalidArgument for negative counts; kNotFound when the worker is not registered or no
  // longer live; kAborted when `incarnation` is not the registered one.
  absl::StatusOr<WorkerSnapshot> RecordPlacement(absl::string_view worker_id, uint64_t incarnation,
                                                 int64_t input_tokens, int64_t blocks);

  // Gives back what one PickPrefill (input_tokens), PickDecode (blocks) or RecordPlacement
  // recorded, when that
  // request left the worker (finished, failed, cancelled) before the worker's next load report
  // could count it. `load_epoch` and `incarnation` come from the snapshot the pick returned; when
  // a load report arrived since (it already reflects the request) or the worker is gone, nothing
  // changes.
  void ReleasePlacement(absl::string_view worker_id, uint64_t incarnation, uint64_t load_epoch,
                        int64_t input_tokens, int64_t blocks);

  std::optional<WorkerSnapshot> Get(absl::string_view worker_id) const;
  // Every registered worker (live or not yet swept), ordered by worker_id.
  std::vector<WorkerSnapshot> List() const;
  // The live workers (heartbeat within the deadline, by Options::clock) serving `model`, ordered
  // by worker_id.
  std::vector<WorkerSnapshot> ListLive(absl::string_view model) const;

  absl::Duration heartbeat_interval() const { return options_.heartbeat_interval; }
  int missed_heartbeats_allowed() const { return options_.missed_heartbeats_allowed; }

 private:
  struct Entry;
  struct Removed {
    internal::v1::WorkerInfo info;
    absl::Status reason;
  };

  explicit WorkerRegistry(Options options);

  absl::Time Now() const;
  absl::StatusOr<internal::v1::RegisterResponse> RegisterLocked(
      const internal::v1::WorkerInfo& worker, absl::Time now, std::vector<Removed>* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<internal::v1::KvEventAck> ApplyKvEventsLocked(
      const internal::v1::KvEventBatch& batch, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `worker_id` when it is past its heartbeat deadline; true if it did.
  bool ExpireIfDeadLocked(absl::string_view worker_id, absl::Time now,
                          std::vector<Removed>* removed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Alive(const Entry& entry, absl::Time now) const;
  static WorkerSnapshot Snapshot(const Entry& entry);
  void Notify(std::vector<Removed> removed);
  // Live workers of `role` serving `model`, except those in `exclude`.
  std::vector<Entry*> CandidatesLocked(internal::v1::WorkerRole role, absl::string_view model,
                                       absl::Span<const std::string> exclude, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The best of `candidates` (non-empty) by `compare(a, b)` (< 0: a better, 0: tie), ties
  // broken as the file comment says; marks it as chosen now.
  template <typename Compare>
  Entry* ChooseLocked(const std::vector<Entry*>& candidates, Compare compare)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SweeperLoop();

  const Options options_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Entry>> workers_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  uint64_t pick_counter_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex sweeper_mu_;
  bool stop_ ABSL_GUARDED_BY(sweeper_mu_) = false;
  absl::Mutex start_mu_;  // serialises Start/Stop
  std::thread sweeper_ ABSL_GUARDED_BY(start_mu_);
};

// The gRPC face of a WorkerRegistry (not owned; must outlive the service). Statuses map 1:1.
class WorkerRegistryService final : public internal::v1::WorkerRegistry::Service {
 public:
  explicit WorkerRegistryService(WorkerRegistry* registry) : registry_(registry) {}

  grpc::Status Register(grpc::ServerContext* context, const internal::v1::RegisterRequest* request,
                        internal::v1::RegisterResponse* response) override;
  grpc::Status ReportLoad(grpc::ServerContext* context, const internal::v1::LoadReport* request,
                          internal::v1::LoadReportResponse* response) override;
  grpc::Status Deregister(grpc::ServerContext* context,
                          const internal::v1::DeregisterRequest* request,
                          internal::v1::DeregisterResponse* response) override;
  grpc::Status PublishKvEvents(grpc::ServerContext* context,
                               const internal::v1::KvEventBatch* request,
                               internal::v1::KvEventAck* response) override;

 private:
  WorkerRegistry* const registry_;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_WORKER_REGISTRY_H_
