#include "router/planner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

// ceil that ignores rounding noise just above an integer (4.0000000001 -> 4), capped at `cap`
// before converting so that a huge need cannot overflow int.
int CeilCapped(double x, int cap) {
  const double c = std::ceil(x - 1e-9);
  if (c >= cap) return cap;
  return c <= 0 ? 0 : static_cast<int>(c);
}

double MeasuredCapacity(Pool pool, const PoolSample& s) {
  switch (pool) {
    case Pool::kPrefill:
      return s.replica_prefill_tokens_per_second;
    case Pool::kDecode:
      return s.replica_decode_sequences;
    case Pool::kEncoder:
      return s.replica_images_per_second;
  }
  return 0;
}

// Replicas needed for `s` at capacity `cap` per replica (the header's formulas).
double RawNeed(Pool pool, const PoolSample& s, const PoolConfig& c, double cap) {
  const double drain_s = absl::ToDoubleSeconds(c.backlog_drain_time);
  const double per_replica = cap * c.target_utilization;
  switch (pool) {
    case Pool::kPrefill:
      return (s.input_tokens_per_second + static_cast<double>(s.queued_input_tokens) / drain_s) /
             per_replica;
    case Pool::kEncoder:
      return (s.images_per_second + static_cast<double>(s.queue_depth) / drain_s) / per_replica;
    case Pool::kDecode: {
      const double sequences =
          static_cast<double>(s.running_sequences + s.queue_depth) / per_replica;
      const double kv = s.kv_used_fraction * s.current_replicas / c.target_utilization;
      return std::max(sequences, kv);
    }
  }
  return 0;
}

std::string DescribeSample(Pool pool, const PoolSample& s) {
  switch (pool) {
    case Pool::kPrefill:
      return absl::StrFormat(
          "replicas=%d queue=%d queued_tokens=%d input_tokens_per_s=%g measured_tokens_per_s=%g",
          s.current_replicas, s.queue_depth, s.queued_input_tokens, s.input_tokens_per_second,
          s.replica_prefill_tokens_per_second);
    case Pool::kDecode:
      return absl::StrFormat("replicas=%d queue=%d running=%d kv_used=%g measured_sequences=%g",
                             s.current_replicas, s.queue_depth, s.running_sequences,
                             s.kv_used_fraction, s.replica_decode_sequences);
    case Pool::kEncoder:
      return absl::StrFormat("replicas=%d queue=%d images_per_s=%g measured_images_per_s=%g",
                             s.current_replicas, s.queue_depth, s.images_per_second,
                             s.replica_images_per_second);
  }
  return "";
}

absl::Status ValidateConfig(Pool pool, const PoolConfig& c) {
  const std::string field = absl::StrCat("pools[", PoolName(pool), "].");
  auto bad = [&](absl::string_view name, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, name, ": expected ", expected, "; got ", got));
  };
  if (c.min_replicas < 0) return bad("min_replicas", ">= 0", c.min_replicas);
  if (c.max_replicas < std::max(c.min_replicas, 1)) {
    return bad("max_replicas",
               absl::StrCat(">= max(min_replicas, 1) (", std::max(c.min_replicas, 1), ")"),
               c.max_replicas);
  }
  if (!(c.target_utilization > 0 && c.target_utilization <= 1)) {
    return bad("target_utilization", "a value in (0, 1]", c.target_utilization);
  }
  if (c.interval <= absl::ZeroDuration()) {
    return bad("interval", "> 0", absl::FormatDuration(c.interval));
  }
  if (c.smoothing < absl::ZeroDuration() || c.smoothing == absl::InfiniteDuration()) {
    return bad("smoothing", "a finite duration >= 0", absl::FormatDuration(c.smoothing));
  }
  if (!(c.hysteresis >= 0 && c.hysteresis < 1)) {
    return bad("hysteresis", "a value in [0, 1)", c.hysteresis);
  }
  if (c.scale_up_cooldown < absl::ZeroDuration()) {
    return bad("scale_up_cooldown", ">= 0", absl::FormatDuration(c.scale_up_cooldown));
  }
  if (c.scale_down_cooldown < absl::ZeroDuration()) {
    return bad("scale_down_cooldown", ">= 0", absl::FormatDuration(c.scale_down_cooldown));
  }
  if (c.backlog_drain_time <= absl::ZeroDuration() ||
      c.backlog_drain_time == absl::InfiniteDuration()) {
    return bad("backlog_drain_time", "a finite duration > 0",
               absl::FormatDuration(c.backlog_drain_time));
  }
  if (!std::isfinite(c.initial_replica_capacity) || c.initial_replica_capacity <= 0) {
    return bad("initial_replica_capacity", "a finite value > 0", c.initial_replica_capacity);
  }
  return absl::OkStatus();
}

absl::Status ValidateSample(const PoolSample& s) {
  auto bad = [](absl::string_view name, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample.", name, ": expected ", expected, "; got ", got));
  };
  if (s.current_replicas < 0) return bad("current_replicas", ">= 0", s.current_replicas);
  const std::pair<const char*, int64_t> counts[] = {
      {"queue_depth", s.queue_depth},
      {"queued_input_tokens", s.queued_input_tokens},
      {"running_sequences", s.running_sequences},
  };
  for (const auto& [name, value] : counts) {
    if (value < 0) return bad(name, ">= 0", value);
  }
  const std::pair<const char*, double> rates[] = {
      {"input_tokens_per_second", s.input_tokens_per_second},
      {"images_per_second", s.images_per_second},
      {"replica_prefill_tokens_per_second", s.replica_prefill_tokens_per_second},
      {"replica_decode_sequences", s.replica_decode_sequences},
      {"replica_images_per_second", s.replica_images_per_second},
  };
  for (const auto& [name, value] : rates) {
    if (!std::isfinite(value) || value < 0) return bad(name, "a finite value >= 0", value);
  }
  if (!(s.kv_used_fraction >= 0 && s.kv_used_fraction <= 1)) {
    return bad("kv_used_fraction", "a value in [0, 1]", s.kv_used_fraction);
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view PoolName(Pool pool) {
  switch (pool) {
    case Pool::kEncoder:
      return "encoder";
    case Pool::kPrefill:
      return "prefill";
    case Pool::kDecode:
      return "decode";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Planner>> Planner::Create(Options options) {
  if (options.pools.empty()) {
    return absl::InvalidArgumentError("pools: expected at least one pool to plan; got none");
  }
  for (const auto& [pool, config] : options.pools) {
    const int index = static_cast<int>(pool);
    if (index < 0 || index > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("pools: expected encoder, prefill or decode; got pool ", index));
    }
    if (absl::Status valid = ValidateConfig(pool, config); !valid.ok()) return valid;
  }
  return std::unique_ptr<Planner>(new Planner(std::move(options)));
}

Planner::Planner(Options options) : clock_(std::move(options.clock)) {
  for (const auto& [pool, config] : options.pools) {
    PoolPlan plan;
    plan.config = config;
    plan.state.replica_capacity = config.initial_replica_capacity;
    pools_[static_cast<int>(pool)] = std::move(plan);
  }
}

absl::Time Planner::Now() const { return clock_ ? clock_() : absl::Now(); }

absl::StatusOr<const Planner::PoolPlan*> Planner::Find(Pool pool) const {
  const int index = static_cast<int>(pool);
  if (index < 0 || index > 2 || !pools_[index].has_value()) {
    return absl::NotFoundError(
        absl::StrCat("pool ", PoolName(pool), ": not configured in this planner"));
  }
  const PoolPlan& plan = *pools_[index];
  if (!plan.started) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool ", PoolName(pool), ": no sample observed yet"));
  }
  return &plan;
}

absl::Status Planner::Observe(Pool pool, const PoolSample& sample) {
  const int index = static_cast<int>(pool);
  if (index < 0 || index > 2) {
    return absl::NotFoundError(absl::StrCat("pool ", index, ": not configured in this planner"));
  }
  if (absl::Status valid = ValidateSample(sample); !valid.ok()) return valid;
  const absl::Time now = Now();
  std::string log_line;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (!pools_[index].has_value()) {
      return absl::NotFoundError(
          absl::StrCat("pool ", PoolName(pool), ": not configured in this planner"));
    }
    PoolPlan& plan = *pools_[index];
    Smooth(pool, sample, now, plan);
    const bool due =
        plan.state.evaluations == 0 || now - plan.state.last_evaluation >= plan.config.interval;
    if (due) {
      const int before = plan.state.desired;
      Evaluate(now, plan);
      changed = plan.state.desired != before;
      if (changed || spdlog::should_log(spdlog::level::debug)) {
        log_line = absl::StrCat("planner ", PoolName(pool), ": ", DescribeSample(pool, sample),
                                " -> ", plan.state.reason);
      }
    }
  }
  if (changed) {
    spdlog::info("{}", log_line);
  } else if (!log_line.empty()) {
    spdlog::debug("{}", log_line);
  }
  return absl::OkStatus();
}

void Planner::Smooth(Pool pool, const PoolSample& sample, absl::Time now, PoolPlan& plan) {
  PoolState& st = plan.state;
  const PoolConfig& c = plan.config;
  double alpha = 1.0;
  if (plan.started && c.smoothing > absl::ZeroDuration()) {
    const double dt = std::max(0.0, absl::ToDoubleSeconds(now - plan.last_sample));
    alpha = 1.0 - std::exp(-dt / absl::ToDoubleSeconds(c.smoothing));
  }
  const double measured = MeasuredCapacity(pool, sample);
  if (measured > 0) {
    if (sample.queue_depth > 0) {
      st.replica_capacity += alpha * (measured - st.replica_capacity);
    } else if (measured > st.replica_capacity) {
      st.replica_capacity = measured;
    }
  }
  st.last_need = RawNeed(pool, sample, c, st.replica_capacity);
  st.need = plan.started ? st.need + alpha * (st.last_need - st.need) : st.last_need;
  if (!plan.started) {
    plan.started = true;
    plan.first_sample = now;
    st.desired = std::clamp(sample.current_replicas, c.min_replicas, c.max_replicas);
  }
  plan.last_sample = now;
  ++st.samples;
}

void Planner::Evaluate(absl::Time now, PoolPlan& plan) {
  PoolState& st = plan.state;
  const PoolConfig& c = plan.config;
  const int current = st.desired;
  const double h = c.hysteresis;
  int proposed = current;
  if (current == 0 ? st.need > 0 : st.need > current * (1 + h)) {
    proposed = CeilCapped(st.need, c.max_replicas);
  } else if (CeilCapped(st.need * (1 + h), c.max_replicas) < current) {
    proposed = CeilCapped(st.need * (1 + h), c.max_replicas);
  }
  proposed = std::clamp(proposed, c.min_replicas, c.max_replicas);

  ++st.evaluations;
  st.last_evaluation = now;
  const std::string basis =
      absl::StrFormat("need %.3g replicas (this sample %.3g, capacity %.4g per replica, target %g)",
                      st.need, st.last_need, st.replica_capacity, c.target_utilization);
  if (proposed == current) {
    st.reason = absl::StrFormat("desired stays %d: %s", current, basis);
    return;
  }
  const bool up = proposed > current;
  const absl::Time since = plan.changed ? st.last_change : plan.first_sample;
  const absl::Duration cooldown = up ? c.scale_up_cooldown : c.scale_down_cooldown;
  const bool allowed = up ? (!plan.changed || now - since >= cooldown) : now - since >= cooldown;
  if (!allowed) {
    ++st.held_by_cooldown;
    st.reason = absl::StrFormat("desired stays %d (scale %s to %d waits %s for the cooldown): %s",
                                current, up ? "up" : "down", proposed,
                                absl::FormatDuration(cooldown - (now - since)), basis);
    return;
  }
  st.reason = absl::StrFormat("desired %d -> %d: %s", current, proposed, basis);
  st.desired = proposed;
  st.last_change = now;
  plan.changed = true;
  if (up) {
    ++st.scale_ups;
  } else {
    ++st.scale_downs;
  }
}

absl::StatusOr<int> Planner::Desired(Pool pool) const {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<const PoolPlan*> plan = Find(pool);
  if (!plan.ok()) return plan.status();
  return (*plan)->state.desired;
}

absl::StatusOr<PoolState> Planner::State(Pool pool) const {
  absl::ReaderMutexLock lock(&mu_);
  absl::StatusOr<const PoolPlan*> plan = Find(pool);
  if (!plan.ok()) return plan.status();
  return (*plan)->state;
}

}  // namespace deepinfer::router
