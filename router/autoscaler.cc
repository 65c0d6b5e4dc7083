#include "router/autoscaler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

using internal::v1::WorkerRole;

constexpr Pool kPools[] = {Pool::kEncoder, Pool::kPrefill, Pool::kDecode};

}  // namespace

absl::StatusOr<std::unique_ptr<Autoscaler>> Autoscaler::Create(const WorkerRegistry* registry,
                                                               Scaler* scaler, Options options) {
  if (registry == nullptr) return absl::InvalidArgumentError("registry: expected non-null");
  if (scaler == nullptr) return absl::InvalidArgumentError("scaler: expected non-null");
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("interval: expected > 0; got ", absl::FormatDuration(options.interval)));
  }
  Planner::Options planner_options;
  planner_options.clock = options.clock;
  planner_options.pools = options.pools;
  absl::StatusOr<std::unique_ptr<Planner>> planner = Planner::Create(std::move(planner_options));
  if (!planner.ok()) return planner.status();
  return std::unique_ptr<Autoscaler>(
      new Autoscaler(registry, scaler, std::move(options), *std::move(planner)));
}

Autoscaler::Autoscaler(const WorkerRegistry* registry, Scaler* scaler, Options options,
                       std::unique_ptr<Planner> planner)
    : registry_(registry),
      scaler_(scaler),
      options_(std::move(options)),
      planner_(std::move(planner)) {
  absl::MutexLock lock(&mu_);
  for (const auto& [pool, config] : options_.pools) {
    AutoscalePoolStatus status;
    status.pool = pool;
    status.config = config;
    status_[static_cast<int>(pool)] = std::move(status);
  }
}

Autoscaler::~Autoscaler() { Stop(); }

absl::Time Autoscaler::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

void Autoscaler::Start() {
  absl::MutexLock start_lock(&start_mu_);
  if (thread_.joinable()) return;
  {
    absl::MutexLock lock(&loop_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
}

void Autoscaler::Stop() {
  absl::MutexLock start_lock(&start_mu_);
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&loop_mu_);
    stop_ = true;
  }
  thread_.join();
}

void Autoscaler::Loop() {
  while (true) {
    Tick();
    absl::MutexLock lock(&loop_mu_);
    if (loop_mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.interval)) return;
  }
}

PoolSample Autoscaler::BuildSample(Pool pool, const std::vector<WorkerSnapshot>& workers,
                                   absl::Time now, absl::Duration liveness) {
  const WorkerRole role = PoolRole(pool);
  PoolSample s;
  int reported = 0;
  double prefill_tps = 0;
  int64_t used_blocks = 0;
  int64_t total_blocks = 0;
  for (const WorkerSnapshot& w : workers) {
    if (w.info.role() != role || now - w.last_heartbeat > liveness) continue;
    ++s.current_replicas;
    const internal::v1::LoadReport& load = w.load;
    s.queue_depth += load.queue_depth();
    s.running_sequences += load.running_sequences();
    if (pool == Pool::kPrefill) {
      s.queued_input_tokens += static_cast<int64_t>(load.queued_input_tokens()) + w.placed_tokens;
      s.input_tokens_per_second += load.prefill_tokens_per_second();
    }
    if (pool == Pool::kEncoder) s.images_per_second += load.images_per_second();
    if (w.has_load) {
      ++reported;
      prefill_tps += load.prefill_tokens_per_second();
      const int64_t total = static_cast<int64_t>(load.total_kv_blocks());
      const int64_t free = std::min(total, static_cast<int64_t>(load.free_kv_blocks()));
      total_blocks += total;
      used_blocks += total - free + (pool == Pool::kDecode ? w.placed_blocks : 0);
    }
  }
  if (reported > 0) {
    s.replica_prefill_tokens_per_second = pool == Pool::kPrefill ? prefill_tps / reported : 0;
    s.replica_decode_sequences =
        pool == Pool::kDecode ? static_cast<double>(s.running_sequences) / reported : 0;
    s.replica_images_per_second = pool == Pool::kEncoder ? s.images_per_second / reported : 0;
  }
  if (pool == Pool::kDecode && total_blocks > 0) {
    s.kv_used_fraction =
        std::clamp(static_cast<double>(used_blocks) / static_cast<double>(total_blocks), 0.0, 1.0);
  }
  if (pool != Pool::kDecode) s.running_sequences = 0;  // only decode sizing reads it
  return s;
}

void Autoscaler::Tick() {
  absl::MutexLock tick_lock(&tick_mu_);
  const std::vector<WorkerSnapshot> workers = registry_->List();
  const absl::Time now = Now();
  for (Pool pool : kPools) {
    if (options_.pools.count(pool) == 0) continue;
    if (pool == Pool::kEncoder &&
        std::none_of(workers.begin(), workers.end(), [](const WorkerSnapshot& w) {
          return w.info.role() == internal::v1::WORKER_ROLE_ENCODER;
        })) {
      continue;
    }
    TickPool(pool, workers, now);
  }
  absl::MutexLock lock(&mu_);
  ++ticks_;
}

void Autoscaler::TickPool(Pool pool, const std::vector<WorkerSnapshot>& workers, absl::Time now) {
  const std::string name(PoolName(pool));
  PoolSample sample = BuildSample(
      pool, workers, now, registry_->heartbeat_interval() * registry_->missed_heartbeats_allowed());
  const int live = sample.current_replicas;

  // What the scaler runs now; failures are counted and the pool retried next pass.
  int64_t errors = 0;
  std::string last_error;
  auto failed = [&](absl::string_view what, const absl::Status& status) {
    ++errors;
    last_error = absl::StrCat(what, ": ", status.ToString());
    spdlog::warn("autoscaler {}: {}", name, last_error);
  };
  absl::StatusOr<int> scaler_count = scaler_->GetReplicas(pool);
  if (!scaler_count.ok()) failed("GetReplicas", scaler_count.status());

  const bool first = !planner_->Desired(pool).ok();
  if (first && scaler_count.ok()) {
    sample.current_replicas = std::max(sample.current_replicas, *scaler_count);
  }
  if (absl::Status observed = planner_->Observe(pool, sample); !observed.ok()) {
    spdlog::error("autoscaler {}: sample refused: {}", name, observed.ToString());
  }
  absl::StatusOr<int> desired = planner_->Desired(pool);
  absl::StatusOr<PoolState> state = planner_->State(pool);

  std::optional<int> scaler_replicas;
  int64_t calls = 0;
  if (scaler_count.ok()) {
    scaler_replicas = *scaler_count;
    if (desired.ok() && *desired != *scaler_count) {
      absl::Status set = scaler_->SetReplicas(pool, *desired);
      if (set.ok()) {
        ++calls;
        scaler_replicas = *desired;
        spdlog::info("autoscaler {}: scaled {} -> {} replicas ({} live)", name, *scaler_count,
                     *desired, live);
      } else {
        scaler_replicas.reset();
        failed(absl::StrCat("SetReplicas(", *desired, ")"), set);
      }
    }
  }

  absl::MutexLock lock(&mu_);
  AutoscalePoolStatus& st = *status_[static_cast<int>(pool)];
  st.planned = desired.ok();
  st.desired = desired.ok() ? *desired : 0;
  st.live_replicas = live;
  st.scaler_replicas = scaler_replicas;
  sample.current_replicas = live;
  st.last_sample = sample;
  st.sampled_at = now;
  if (state.ok()) st.planner = *state;
  st.scaler_calls += calls;
  st.scaler_errors += errors;
  if (errors > 0) st.last_scaler_error = last_error;
}

std::vector<AutoscalePoolStatus> Autoscaler::Status() const {
  absl::MutexLock lock(&mu_);
  std::vector<AutoscalePoolStatus> out;
  for (const auto& st : status_) {
    if (st.has_value()) out.push_back(*st);
  }
  return out;
}

std::optional<AutoscalePoolStatus> Autoscaler::PoolStatusOf(Pool pool) const {
  absl::MutexLock lock(&mu_);
  const int index = static_cast<int>(pool);
  if (index < 0 || index > 2) return std::nullopt;
  return status_[index];
}

int64_t Autoscaler::ticks() const {
  absl::MutexLock lock(&mu_);
  return ticks_;
}

internal::v1::WorkerRole PoolRole(Pool pool) {
  switch (pool) {
    case Pool::kEncoder:
      return internal::v1::WORKER_ROLE_ENCODER;
    case Pool::kPrefill:
      return internal::v1::WORKER_ROLE_PREFILL;
    case Pool::kDecode:
      return internal::v1::WORKER_ROLE_DECODE;
  }
  return internal::v1::WORKER_ROLE_UNSPECIFIED;
}

}  // namespace deepinfer::router
