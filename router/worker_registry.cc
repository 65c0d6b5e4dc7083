#include "router/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/flags.h"
#include "common/grpc_status.h"
#include "proto/worker_role.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {

using internal::v1::KvEvent;
using internal::v1::KvEventAck;
using internal::v1::KvEventBatch;
using internal::v1::LoadReport;
using internal::v1::LoadReportResponse;
using internal::v1::RegisterResponse;
using internal::v1::WorkerInfo;
using internal::v1::WorkerRole;

namespace {

constexpr size_t kMaxWorkerIdBytes = 128;
constexpr uint32_t kMaxTier = 2;  // 0 device, 1 host, 2 shared store

bool HoldsKv(WorkerRole role) {
  return role == internal::v1::WORKER_ROLE_PREFILL || role == internal::v1::WORKER_ROLE_DECODE;
}

std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, 64)), s.size() > 64 ? "\"..." : "\"");
}

absl::Status ValidateWorkerInfo(const WorkerInfo& w) {
  if (w.worker_id().empty() || w.worker_id().size() > kMaxWorkerIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("worker.worker_id: expected 1..128 bytes; got ",
                                                   w.worker_id().size(), " bytes"));
  }
  if (w.role() != internal::v1::WORKER_ROLE_PREFILL &&
      w.role() != internal::v1::WORKER_ROLE_DECODE &&
      w.role() != internal::v1::WORKER_ROLE_ENCODER) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker.role: expected PREFILL, DECODE or ENCODER; got ", static_cast<int>(w.role())));
  }
  absl::StatusOr<HostPort> address =
      ParseHostPort("worker.address", w.address(), /*allow_port_zero=*/false);
  if (!address.ok()) {
    // ParseHostPort names flags ("--worker.address: ..."); this is a field.
    absl::string_view message = address.status().message();
    if (absl::ConsumePrefix(&message, "--")) {
      return absl::InvalidArgumentError(message);
    }
    return address.status();
  }
  // ":port" parses to 0.0.0.0, a listen address that clients cannot connect to.
  if (w.address().front() == ':' || address->host == "0.0.0.0" || address->host == "::") {
    return absl::InvalidArgumentError(
        absl::StrCat("worker.address: expected a connectable host:port; got ", Quote(w.address())));
  }
  if (w.model().empty()) {
    return absl::InvalidArgumentError("worker.model: expected a model id; got \"\"");
  }
  if (w.incarnation() == 0) {
    return absl::InvalidArgumentError("worker.incarnation: expected non-zero; got 0");
  }
  if (HoldsKv(w.role()) && w.block_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker.block_size: expected > 0 for a ",
                                                   WorkerRoleName(w.role()), " worker; got 0"));
  }
  if (w.has_kv_metadata()) {
    if (w.kv_metadata().agent_name() != w.worker_id()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker.kv_metadata.agent_name: expected the worker_id ",
                       Quote(w.worker_id()), "; got ", Quote(w.kv_metadata().agent_name())));
    }
    if (w.kv_metadata().incarnation() != w.incarnation()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker.kv_metadata.incarnation: expected the worker's incarnation ",
                       w.incarnation(), "; got ", w.kv_metadata().incarnation()));
    }
  }
  return absl::OkStatus();
}

// " (excluding \"a\", \"b\")" for the messages of picks that skipped workers; "" otherwise.
std::string ExcludedSuffix(absl::Span<const std::string> exclude) {
  if (exclude.empty()) return "";
  std::string out = " (excluding ";
  for (size_t i = 0; i < exclude.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", Quote(exclude[i]));
  }
  out += ")";
  return out;
}

absl::Status ValidateBatch(const KvEventBatch& batch) {
  if (batch.sequence() == 0) {
    return absl::InvalidArgumentError("sequence: expected >= 1 (consecutive from 1); got 0");
  }
  for (int i = 0; i < batch.events_size(); ++i) {
    const KvEvent& e = batch.events(i);
    switch (e.kind()) {
      case KvEvent::KIND_STORED:
      case KvEvent::KIND_REMOVED:
        break;
      case KvEvent::KIND_ALL_CLEARED:
        if (!e.block_hashes().empty()) {
          return absl::InvalidArgumentError(absl::StrCat("events[", i,
                                                         "].block_hashes: expected none with "
                                                         "KIND_ALL_CLEARED; got ",
                                                         e.block_hashes_size()));
        }
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("events[", i, "].kind: expected STORED, REMOVED or ALL_CLEARED; got ",
                         static_cast<int>(e.kind())));
    }
    if (e.tier() > kMaxTier) {
      return absl::InvalidArgumentError(
          absl::StrCat("events[", i, "].tier: expected 0..2; got ", e.tier()));
    }
  }
  return absl::OkStatus();
}

// FAILED_PRECONDITION naming the first field of `got` that differs from `want` (the config of
// registered worker `other_id`). Every prefill and decode worker of a model carries the same
// speculative flags: a prefill node never speculates, but a different config there means the
// model was deployed with two configurations.
absl::Status CompareSpeculative(const internal::v1::SpeculativeConfig& want,
                                const internal::v1::SpeculativeConfig& got,
                                const std::string& other_id, const std::string& model) {
  auto method = [](const internal::v1::SpeculativeConfig& c) {
    return c.method().empty() ? std::string("off") : c.method();
  };
  auto mismatch = [&](absl::string_view field, const auto& expected, const auto& actual) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker.speculative.", field, ": expected ", expected, " (as worker ", Quote(other_id),
        " of model ", Quote(model), "; every worker of a model needs the same speculative flags)",
        "; got ", actual));
  };
  if (method(want) != method(got)) return mismatch("method", method(want), method(got));
  if (method(want) == "off") return absl::OkStatus();
  if (want.num_speculative_tokens() != got.num_speculative_tokens()) {
    return mismatch("num_speculative_tokens", want.num_speculative_tokens(),
                    got.num_speculative_tokens());
  }
  if (want.min_n() != got.min_n()) return mismatch("min_n", want.min_n(), got.min_n());
  if (want.max_n() != got.max_n()) return mismatch("max_n", want.max_n(), got.max_n());
  if (want.adaptive() != got.adaptive()) {
    return mismatch("adaptive", want.adaptive() ? "true" : "false",
                    got.adaptive() ? "true" : "false");
  }
  if (want.draft_model_id() != got.draft_model_id()) {
    return mismatch("draft_model_id", Quote(want.draft_model_id()), Quote(got.draft_model_id()));
  }
  return absl::OkStatus();
}

}  // namespace

struct WorkerRegistry::Entry {
  WorkerInfo info;
  LoadReport load;
  bool has_load = false;
  absl::Time registered_at;
  absl::Time last_heartbeat;
  uint64_t last_kv_sequence = 0;
  bool kv_resync_pending = false;
  // Block hash -> bit mask of the tiers it is stored in.
  absl::flat_hash_map<uint64_t, uint8_t> blocks;
  // Block hash -> until when it counts as held (ExpectStored), for blocks not in `blocks`.
  absl::flat_hash_map<uint64_t, absl::Time> expected;
  // Whether an event ever stored a block (the worker has a prefix cache).
  bool stored_any = false;
  int64_t placed_requests = 0;
  int64_t placed_tokens = 0;
  int64_t placed_blocks = 0;
  // Bumped by every accepted load report (which resets placed_*).
  uint64_t load_epoch = 0;
  uint64_t last_chosen = 0;  // pick_counter_ when last chosen; 0 = never

  int64_t FreeBlocks() const {
    const int64_t free = has_load ? static_cast<int64_t>(load.free_kv_blocks())
                                  : static_cast<int64_t>(info.kv_capacity_blocks());
    return std::max<int64_t>(0, free - placed_blocks);
  }
};

absl::StatusOr<std::unique_ptr<WorkerRegistry>> WorkerRegistry::Create(Options options) {
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat_interval: expected > 0; got ",
                     absl::FormatDuration(options.heartbeat_interval)));
  }
  if (options.missed_heartbeats_allowed < 1) {
    return absl::InvalidArgumentError(absl::StrCat("missed_heartbeats_allowed: expected >= 1; got ",
                                                   options.missed_heartbeats_allowed));
  }
  if (options.max_blocks_per_worker < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_blocks_per_worker: expected >= 0; got ", options.max_blocks_per_worker));
  }
  if (options.expected_block_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected_block_ttl: expected > 0; got ",
                     absl::FormatDuration(options.expected_block_ttl)));
  }
  return std::unique_ptr<WorkerRegistry>(new WorkerRegistry(std::move(options)));
}

WorkerRegistry::WorkerRegistry(Options options)
    : options_(std::move(options)), rng_(options_.rng_seed) {}

WorkerRegistry::~WorkerRegistry() { Stop(); }

absl::Time WorkerRegistry::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

bool WorkerRegistry::Alive(const Entry& entry, absl::Time now) const {
  return now - entry.last_heartbeat <=
         options_.heartbeat_interval * options_.missed_heartbeats_allowed;
}

WorkerSnapshot WorkerRegistry::Snapshot(const Entry& e) {
  WorkerSnapshot s;
  s.info = e.info;
  s.load = e.load;
  s.has_load = e.has_load;
  s.registered_at = e.registered_at;
  s.last_heartbeat = e.last_heartbeat;
  s.cached_blocks = static_cast<int64_t>(e.blocks.size());
  s.expected_blocks = static_cast<int64_t>(e.expected.size());
  s.kv_resync_pending = e.kv_resync_pending;
  s.placed_requests = e.placed_requests;
  s.placed_tokens = e.placed_tokens;
  s.placed_blocks = e.placed_blocks;
  s.load_epoch = e.load_epoch;
  return s;
}

absl::StatusOr<WorkerSnapshot> WorkerRegistry::RecordPlacement(absl::string_view worker_id,
                                                               uint64_t incarnation,
                                                               int64_t input_tokens,
                                                               int64_t blocks) {
  if (input_tokens < 0 || blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(input_tokens < 0 ? "input_tokens" : "blocks",
                                                   ": expected >= 0; got ",
                                                   input_tokens < 0 ? input_tokens : blocks));
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || !Alive(*it->second, Now())) {
    return absl::NotFoundError(
        absl::StrCat("worker ", Quote(worker_id), " is not registered or no longer live"));
  }
  Entry& e = *it->second;
  if (e.info.incarnation() != incarnation) {
    return absl::AbortedError(absl::StrCat("worker ", Quote(worker_id), ": incarnation ",
                                           incarnation, " was replaced by ", e.info.incarnation()));
  }
  e.placed_requests += 1;
  e.placed_tokens += input_tokens;
  e.placed_blocks += blocks;
  e.last_chosen = ++pick_counter_;
  return Snapshot(e);
}

void WorkerRegistry::ReleasePlacement(absl::string_view worker_id, uint64_t incarnation,
                                      uint64_t load_epoch, int64_t input_tokens, int64_t blocks) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  Entry& e = *it->second;
  if (e.info.incarnation() != incarnation || e.load_epoch != load_epoch) return;
  e.placed_requests = std::max<int64_t>(0, e.placed_requests - 1);
  e.placed_tokens = std::max<int64_t>(0, e.placed_tokens - input_tokens);
  e.placed_blocks = std::max<int64_t>(0, e.placed_blocks - blocks);
}

void WorkerRegistry::Notify(std::vector<Removed> removed) {
  for (const Removed& r : removed) {
    spdlog::info("worker {} ({} {}, incarnation {}) removed: {}", r.info.worker_id(),
                 std::string(WorkerRoleName(r.info.role())), r.info.address(), r.info.incarnation(),
                 r.reason.ToString());
    if (options_.on_removed) options_.on_removed(r.info, r.reason);
  }
}

bool WorkerRegistry::ExpireIfDeadLocked(absl::string_view worker_id, absl::Time now,
                                        std::vector<Removed>* removed) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || Alive(*it->second, now)) return false;
  const Entry& e = *it->second;
  removed->push_back(
      {e.info, absl::UnavailableError(absl::StrCat(
                   "missed ", options_.missed_heartbeats_allowed, " heartbeats (every ",
                   absl::FormatDuration(options_.heartbeat_interval), "): silent for ",
                   absl::FormatDuration(now - e.last_heartbeat)))});
  workers_.erase(it);
  return true;
}

void WorkerRegistry::Start() {
  absl::MutexLock start_lock(&start_mu_);
  if (sweeper_.joinable()) return;
  {
    absl::MutexLock lock(&sweeper_mu_);
    stop_ = false;
  }
  sweeper_ = std::thread([this] { SweeperLoop(); });
}

void WorkerRegistry::Stop() {
  absl::MutexLock start_lock(&start_mu_);
  if (!sweeper_.joinable()) return;
  {
    absl::MutexLock lock(&sweeper_mu_);
    stop_ = true;
  }
  sweeper_.join();
}

void WorkerRegistry::SweeperLoop() {
  while (true) {
    {
      absl::MutexLock lock(&sweeper_mu_);
      if (sweeper_mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.heartbeat_interval)) {
        return;
      }
    }
    Sweep();
  }
}

absl::StatusOr<RegisterResponse> WorkerRegistry::Register(const WorkerInfo& worker) {
  if (absl::Status status = ValidateWorkerInfo(worker); !status.ok()) return status;
  std::vector<Removed> removed;
  absl::StatusOr<RegisterResponse> result;
  {
    absl::MutexLock lock(&mu_);
    result = RegisterLocked(worker, Now(), &removed);
  }
  if (result.ok()) {
    spdlog::info("worker {} registered: {} {} model {} incarnation {}", worker.worker_id(),
                 std::string(WorkerRoleName(worker.role())), worker.address(), worker.model(),
                 worker.incarnation());
  }
  Notify(std::move(removed));
  return result;
}

absl::StatusOr<RegisterResponse> WorkerRegistry::RegisterLocked(const WorkerInfo& worker,
                                                                absl::Time now,
                                                                std::vector<Removed>* removed) {
  // A silent entry of this worker is gone already; the registration starts afresh.
  ExpireIfDeadLocked(worker.worker_id(), now, removed);
  if (HoldsKv(worker.role())) {
    for (const auto& [id, other] : workers_) {
      const WorkerInfo& o = other->info;
      if (id == worker.worker_id() || !HoldsKv(o.role()) || o.model() != worker.model() ||
          !Alive(*other, now)) {
        continue;
      }
      if (o.block_size() != worker.block_size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker.block_size: expected ", o.block_size(), " (as worker ", Quote(id),
                         " of model ", Quote(o.model()), "); got ", worker.block_size()));
      }
      if (o.block_hash_seed() != worker.block_hash_seed()) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker.block_hash_seed: expected ", o.block_hash_seed(), " (as worker ",
                         Quote(id), " of model ", Quote(o.model()),
                         ", so that block hashes compare); got ", worker.block_hash_seed()));
      }
      if (absl::Status same =
              CompareSpeculative(o.speculative(), worker.speculative(), id, o.model());
          !same.ok()) {
        return same;
      }
    }
  }
  auto it = workers_.find(worker.worker_id());
  if (it != workers_.end()) {
    Entry& old = *it->second;
    if (worker.incarnation() < old.info.incarnation()) {
      return absl::AbortedError(
          absl::StrCat("worker.incarnation: expected >= ", old.info.incarnation(),
                       " (the registered incarnation of ", Quote(worker.worker_id()),
                       "); got stale ", worker.incarnation()));
    }
    if (worker.incarnation() == old.info.incarnation()) {
      // A retried Register: same process, refresh what it says about itself.
      old.info = worker;
      old.last_heartbeat = now;
    } else {
      removed->push_back({old.info, absl::AbortedError(absl::StrCat("replaced by incarnation ",
                                                                    worker.incarnation()))});
      workers_.erase(it);
      it = workers_.end();
    }
  }
  if (it == workers_.end()) {
    auto entry = std::make_unique<Entry>();
    entry->info = worker;
    entry->registered_at = now;
    entry->last_heartbeat = now;
    workers_.emplace(worker.worker_id(), std::move(entry));
  }
  RegisterResponse response;
  response.set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  response.set_missed_heartbeats_allowed(static_cast<uint32_t>(options_.missed_heartbeats_allowed));
  std::vector<const Entry*> peers;
  for (const auto& [id, other] : workers_) {
    if (id != worker.worker_id() && HoldsKv(other->info.role()) && Alive(*other, now)) {
      peers.push_back(other.get());
    }
  }
  std::sort(peers.begin(), peers.end(), [](const Entry* a, const Entry* b) {
    return a->info.worker_id() < b->info.worker_id();
  });
  for (const Entry* peer : peers) *response.add_peers() = peer->info;
  return response;
}

LoadReportResponse WorkerRegistry::ReportLoad(const LoadReport& report) {
  LoadReportResponse response;
  std::vector<Removed> removed;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    // Too late: the worker counts as dropped and must register again.
    ExpireIfDeadLocked(report.worker_id(), now, &removed);
    auto it = workers_.find(report.worker_id());
    if (it != workers_.end() && it->second->info.incarnation() == report.incarnation()) {
      Entry& e = *it->second;
      e.last_heartbeat = now;
      if (!e.has_load || report.sequence() > e.load.sequence()) {
        e.load = report;
        e.has_load = true;
        // The report now accounts for what was placed before it.
        e.placed_requests = 0;
        e.placed_tokens = 0;
        e.placed_blocks = 0;
        ++e.load_epoch;
      }
      response.set_known(true);
    }
  }
  Notify(std::move(removed));
  return response;
}

absl::Status WorkerRegistry::Deregister(absl::string_view worker_id, uint64_t incarnation) {
  std::vector<Removed> removed;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end()) {
      if (it->second->info.incarnation() != incarnation) {
        status = absl::AbortedError(
            absl::StrCat("incarnation: expected ", it->second->info.incarnation(),
                         " (registered for ", Quote(worker_id), "); got ", incarnation));
      } else {
        removed.push_back({it->second->info, absl::CancelledError("deregistered")});
        workers_.erase(it);
      }
    }
  }
  Notify(std::move(removed));
  return status;
}

absl::StatusOr<KvEventAck> WorkerRegistry::PublishKvEvents(const KvEventBatch& batch) {
  if (absl::Status status = ValidateBatch(batch); !status.ok()) return status;
  std::vector<Removed> removed;
  absl::StatusOr<KvEventAck> ack;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    ExpireIfDeadLocked(batch.worker_id(), now, &removed);
    ack = ApplyKvEventsLocked(batch, now);
  }
  Notify(std::move(removed));
  return ack;
}

absl::StatusOr<KvEventAck> WorkerRegistry::ApplyKvEventsLocked(const KvEventBatch& batch,
                                                               absl::Time now) {
  auto it = workers_.find(batch.worker_id());
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker_id: expected a registered worker; got ",
                                            Quote(batch.worker_id()), " (Register first)"));
  }
  Entry& e = *it->second;
  if (e.info.incarnation() != batch.incarnation()) {
    return absl::AbortedError(absl::StrCat("incarnation: expected ", e.info.incarnation(),
                                           " (registered for ", Quote(batch.worker_id()), "); got ",
                                           batch.incarnation()));
  }
  e.last_heartbeat = now;
  KvEventAck ack;
  if (batch.sequence() <= e.last_kv_sequence) {
    // Already applied (a retried RPC) or older.
    ack.set_resync(e.kv_resync_pending);
    return ack;
  }
  if (batch.sequence() != e.last_kv_sequence + 1) {
    spdlog::info("worker {}: KV event gap (expected sequence {}, got {}): asking for a snapshot",
                 batch.worker_id(), e.last_kv_sequence + 1, batch.sequence());
    e.blocks.clear();
    e.expected.clear();
    e.kv_resync_pending = true;
  }
  for (const KvEvent& event : batch.events()) {
    const uint8_t bit = static_cast<uint8_t>(1u << event.tier());
    switch (event.kind()) {
      case KvEvent::KIND_ALL_CLEARED:
        e.blocks.clear();
        e.expected.clear();
        e.kv_resync_pending = false;
        break;
      case KvEvent::KIND_STORED:
        e.stored_any = true;
        for (uint64_t hash : event.block_hashes()) {
          e.expected.erase(hash);
          auto found = e.blocks.find(hash);
          if (found != e.blocks.end()) {
            found->second |= bit;
          } else if (static_cast<int64_t>(e.blocks.size()) < options_.max_blocks_per_worker) {
            e.blocks.emplace(hash, bit);
          }
        }
        break;
      case KvEvent::KIND_REMOVED:
        for (uint64_t hash : event.block_hashes()) {
          e.expected.erase(hash);
          auto found = e.blocks.find(hash);
          if (found == e.blocks.end()) continue;
          found->second &= static_cast<uint8_t>(~bit);
          if (found->second == 0) e.blocks.erase(found);
        }
        break;
      default:
        break;  // ValidateBatch admits no other kind
    }
  }
  e.last_kv_sequence = batch.sequence();
  ack.set_resync(e.kv_resync_pending);
  return ack;
}

int64_t WorkerRegistry::PrefixOverlap(absl::string_view worker_id,
                                      absl::Span<const uint64_t> block_hashes) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return 0;
  const Entry& e = *it->second;
  const absl::Time now = e.expected.empty() ? absl::InfinitePast() : Now();
  int64_t n = 0;
  for (uint64_t hash : block_hashes) {
    if (!e.blocks.contains(hash)) {
      auto expected = e.expected.find(hash);
      if (expected == e.expected.end() || expected->second <= now) break;
    }
    ++n;
  }
  return n;
}

void WorkerRegistry::ExpectStored(absl::string_view worker_id, uint64_t incarnation,
                                  absl::Span<const uint64_t> block_hashes) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  Entry& e = *it->second;
  if (e.info.incarnation() != incarnation || !e.stored_any) return;
  const absl::Time until = Now() + options_.expected_block_ttl;
  for (uint64_t hash : block_hashes) {
    if (e.blocks.contains(hash)) continue;
    auto found = e.expected.find(hash);
    if (found != e.expected.end()) {
      found->second = until;
    } else if (static_cast<int64_t>(e.blocks.size() + e.expected.size()) <
               options_.max_blocks_per_worker) {
      e.expected.emplace(hash, until);
    }
  }
}

int WorkerRegistry::Sweep() {
  std::vector<Removed> removed;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    std::vector<std::string> dead;
    for (const auto& [id, entry] : workers_) {
      if (!Alive(*entry, now)) dead.push_back(id);
      auto& expected = entry->expected;
      for (auto e = expected.begin(); e != expected.end();) {
        if (e->second <= now) {
          expected.erase(e++);
        } else {
          ++e;
        }
      }
    }
    for (const std::string& id : dead) ExpireIfDeadLocked(id, now, &removed);
  }
  const int n = static_cast<int>(removed.size());
  Notify(std::move(removed));
  return n;
}

std::vector<WorkerRegistry::Entry*> WorkerRegistry::CandidatesLocked(
    WorkerRole role, absl::string_view model, absl::Span<const std::string> exclude,
    absl::Time now) {
  std::vector<Entry*> out;
  for (auto& [id, entry] : workers_) {
    if (entry->info.role() == role && entry->info.model() == model && Alive(*entry, now) &&
        std::find(exclude.begin(), exclude.end(), id) == exclude.end()) {
      out.push_back(entry.get());
    }
  }
  // Map order is arbitrary; sort so that the seeded draws are reproducible.
  std::sort(out.begin(), out.end(), [](const Entry* a, const Entry* b) {
    return a->info.worker_id() < b->info.worker_id();
  });
  return out;
}

template <typename Compare>
WorkerRegistry::Entry* WorkerRegistry::ChooseLocked(const std::vector<Entry*>& candidates,
                                                    Compare compare) {
  std::vector<Entry*> best;
  for (Entry* c : candidates) {
    const int order = best.empty() ? -1 : compare(*c, *best.front());
    if (order < 0) best.clear();
    if (order <= 0) best.push_back(c);
  }
  Entry* chosen = best.front();
  if (best.size() > 1) {
    // Power of two choices among the tied: the less recently chosen of two random ones.
    std::uniform_int_distribution<size_t> first(0, best.size() - 1);
    std::uniform_int_distribution<size_t> second(0, best.size() - 2);
    const size_t i = first(rng_);
    size_t j = second(rng_);
    if (j >= i) ++j;
    chosen = best[i]->last_chosen <= best[j]->last_chosen ? best[i] : best[j];
  }
  chosen->last_chosen = ++pick_counter_;
  return chosen;
}

absl::StatusOr<WorkerSnapshot> WorkerRegistry::PickPrefill(absl::string_view model,
                                                           int64_t input_tokens,
                                                           absl::Span<const std::string> exclude) {
  if (input_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_tokens: expected >= 0; got ", input_tokens));
  }
  absl::MutexLock lock(&mu_);
  const std::vector<Entry*> candidates =
      CandidatesLocked(internal::v1::WORKER_ROLE_PREFILL, model, exclude, Now());
  if (candidates.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no live prefill worker for model ", Quote(model), ExcludedSuffix(exclude)));
  }
  auto key = [](const Entry& e) {
    return std::make_pair(static_cast<int64_t>(e.load.queued_input_tokens()) + e.placed_tokens,
                          static_cast<int64_t>(e.load.queue_depth()) + e.placed_requests);
  };
  Entry* chosen = ChooseLocked(candidates, [&](const Entry& a, const Entry& b) {
    const auto ka = key(a);
    const auto kb = key(b);
    return ka < kb ? -1 : (kb < ka ? 1 : 0);
  });
  chosen->placed_requests += 1;
  chosen->placed_tokens += input_tokens;
  return Snapshot(*chosen);
}

absl::StatusOr<WorkerSnapshot> WorkerRegistry::PickDecode(absl::string_view model,
                                                          int64_t blocks_needed,
                                                          absl::Span<const std::string> exclude) {
  if (blocks_needed < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks_needed: expected >= 0; got ", blocks_needed));
  }
  absl::MutexLock lock(&mu_);
  std::vector<Entry*> candidates =
      CandidatesLocked(internal::v1::WORKER_ROLE_DECODE, model, exclude, Now());
  if (candidates.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no live decode worker for model ", Quote(model), ExcludedSuffix(exclude)));
  }
  int64_t most_free = 0;
  std::vector<Entry*> with_room;
  for (Entry* c : candidates) {
    most_free = std::max(most_free, c->FreeBlocks());
    if (c->FreeBlocks() >= blocks_needed) with_room.push_back(c);
  }
  if (with_room.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no decode worker for model ", Quote(model), " has ", blocks_needed,
                     " free KV blocks (most free: ", most_free, ")"));
  }
  Entry* chosen = ChooseLocked(with_room, [](const Entry& a, const Entry& b) {
    if (a.FreeBlocks() != b.FreeBlocks()) return a.FreeBlocks() > b.FreeBlocks() ? -1 : 1;
    const int64_t ra = static_cast<int64_t>(a.load.running_sequences()) + a.placed_requests;
    const int64_t rb = static_cast<int64_t>(b.load.running_sequences()) + b.placed_requests;
    return ra < rb ? -1 : (rb < ra ? 1 : 0);
  });
  chosen->placed_requests += 1;
  chosen->placed_blocks += blocks_needed;
  return Snapshot(*chosen);
}

std::optional<WorkerSnapshot> WorkerRegistry::Get(absl::string_view worker_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return Snapshot(*it->second);
}

std::vector<WorkerSnapshot> WorkerRegistry::List() const {
  std::vector<WorkerSnapshot> out;
  {
    absl::ReaderMutexLock lock(&mu_);
    out.reserve(workers_.size());
    for (const auto& [id, entry] : workers_) out.push_back(Snapshot(*entry));
  }
  std::sort(out.begin(), out.end(), [](const WorkerSnapshot& a, const WorkerSnapshot& b) {
    return a.info.worker_id() < b.info.worker_id();
  });
  return out;
}

std::vector<WorkerSnapshot> WorkerRegistry::ListLive(absl::string_view model) const {
  std::vector<WorkerSnapshot> out;
  {
    absl::ReaderMutexLock lock(&mu_);
    const absl::Time now = Now();
    for (const auto& [id, entry] : workers_) {
      if (entry->info.model() == model && Alive(*entry, now)) out.push_back(Snapshot(*entry));
    }
  }
  std::sort(out.begin(), out.end(), [](const WorkerSnapshot& a, const WorkerSnapshot& b) {
    return a.info.worker_id() < b.info.worker_id();
  });
  return out;
}

grpc::Status WorkerRegistryService::Register(grpc::ServerContext* /*context*/,
                                             const internal::v1::RegisterRequest* request,
                                             RegisterResponse* response) {
  absl::StatusOr<RegisterResponse> result = registry_->Register(request->worker());
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryService::ReportLoad(grpc::ServerContext* /*context*/,
                                               const LoadReport* request,
                                               LoadReportResponse* response) {
  *response = registry_->ReportLoad(*request);
  return grpc::Status::OK;
}

grpc::Status WorkerRegistryService::Deregister(grpc::ServerContext* /*context*/,
                                               const internal::v1::DeregisterRequest* request,
                                               internal::v1::DeregisterResponse* /*response*/) {
  return ToGrpcStatus(registry_->Deregister(request->worker_id(), request->incarnation()));
}

grpc::Status WorkerRegistryService::PublishKvEvents(grpc::ServerContext* /*context*/,
                                                    const KvEventBatch* request,
                                                    KvEventAck* response) {
  absl::StatusOr<KvEventAck> ack = registry_->PublishKvEvents(*request);
  if (!ack.ok()) return ToGrpcStatus(ack.status());
  *response = std::move(*ack);
  return grpc::Status::OK;
}

}  // namespace deepinfer::router
