#include "router/planner.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/fake_clock.h"
#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {


// Open-loop configuration whose numbers are easy to compute by hand: no smoothing, full
// utilisation, 1000 units per replica.
PoolConfig Simple() {
  PoolConfig c;
  c.min_replicas = 1;
  c.max_replicas = 10;
  c.target_utilization = 1.0;
  c.interval = absl::Seconds(10);
  c.smoothing = absl::ZeroDuration();
  c.hysteresis = 0.1;
  c.scale_up_cooldown = absl::Seconds(30);
  c.scale_down_cooldown = absl::Seconds(120);
  c.backlog_drain_time = absl::Seconds(30);
  c.initial_replica_capacity = 1000;
  return c;
}

PoolSample PrefillAt(double input_tokens_per_second, int current = 1) {
  PoolSample s;
  s.current_replicas = current;
  s.input_tokens_per_second = input_tokens_per_second;
  return s;
}

std::unique_ptr<Planner> MakePlanner(FakeClock& clock, std::map<Pool, PoolConfig> pools) {
  Planner::Options o;
  o.clock = clock.AsFunction();
  o.pools = std::move(pools);
  auto planner = Planner::Create(std::move(o));
  EXPECT_TRUE(planner.ok()) << planner.status();
  return planner.ok() ? std::move(*planner) : nullptr;
}

int DesiredOf(const Planner& p, Pool pool) {
  absl::StatusOr<int> d = p.Desired(pool);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *d : -1;
}

TEST(PlannerTest, NeedFormulas) {
  FakeClock clock;
  PoolConfig prefill = Simple();
  prefill.target_utilization = 0.8;
  prefill.max_replicas = 16;
  prefill.initial_replica_capacity = 5000;
  PoolConfig decode = Simple();
  decode.target_utilization = 0.8;
  decode.initial_replica_capacity = 64;
  PoolConfig encoder = Simple();
  encoder.target_utilization = 0.8;
  encoder.initial_replica_capacity = 20;
  auto p = MakePlanner(
      clock, {{Pool::kPrefill, prefill}, {Pool::kDecode, decode}, {Pool::kEncoder, encoder}});
  // Prefill: (40000 tok/s + 300000 queued / 30 s) / (5000 * 0.8) = 12.5 -> 13. The queue makes
  // the measured 5000 tok/s the capacity (it equals the initial estimate here).
  PoolSample s = PrefillAt(40000, 2);
  s.queue_depth = 25;
  s.queued_input_tokens = 300000;
  s.replica_prefill_tokens_per_second = 5000;
  ASSERT_TRUE(p->Observe(Pool::kPrefill, s).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->need, 12.5);
  EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), 13);
  // Decode: sequences (100 running + 28 waiting) / (64 * 0.8) = 2.5; KV 0.9 * 2 / 0.8 = 2.25.
  PoolSample d;
  d.current_replicas = 2;
  d.running_sequences = 100;
  d.queue_depth = 28;
  d.kv_used_fraction = 0.9;
  ASSERT_TRUE(p->Observe(Pool::kDecode, d).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kDecode)->need, 2.5);
  EXPECT_EQ(DesiredOf(*p, Pool::kDecode), 3);
  // Decode limited by KV: 0.95 * 4 / 0.8 = 4.75 against 40 / 51.2 sequences.
  clock.Advance(absl::Seconds(10));
  d.current_replicas = 4;
  d.running_sequences = 40;
  d.queue_depth = 0;
  d.kv_used_fraction = 0.95;
  ASSERT_TRUE(p->Observe(Pool::kDecode, d).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kDecode)->need, 4.75);
  // Encoder: (50 images/s + 30 queued / 30 s) / (20 * 0.8) = 3.1875 -> 4.
  PoolSample e;
  e.current_replicas = 1;
  e.images_per_second = 50;
  e.queue_depth = 30;
  ASSERT_TRUE(p->Observe(Pool::kEncoder, e).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kEncoder)->need, 3.1875);
  EXPECT_EQ(DesiredOf(*p, Pool::kEncoder), 4);
}

TEST(PlannerTest, SmoothingIsTimeWeighted) {
  FakeClock clock;
  PoolConfig c = Simple();
  c.smoothing = absl::Seconds(30);
  auto p = MakePlanner(clock, {{Pool::kPrefill, c}});
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(1500)).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->need, 1.5);  // the first sample is taken whole
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(12500)).ok());
  const double alpha = 1 - std::exp(-10.0 / 30.0);
  EXPECT_NEAR(p->State(Pool::kPrefill)->need, 1.5 + 11 * alpha, 1e-12);
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->last_need, 12.5);
  // Two samples 5 s apart move the average as much as one 10 s later.
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(12500)).ok());
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(12500)).ok());
  const double after_one = 1.5 + 11 * alpha;
  EXPECT_NEAR(p->State(Pool::kPrefill)->need, after_one + (12.5 - after_one) * alpha, 1e-12);
}

TEST(PlannerTest, CapacityFollowsMeasurementsOnlyWhileBusy) {
  FakeClock clock;
  auto p = MakePlanner(clock, {{Pool::kPrefill, Simple()}});
  // Not busy: 600 tok/s per replica is what the load asked for, not what a replica can do.
  PoolSample s = PrefillAt(1200, 2);
  s.replica_prefill_tokens_per_second = 600;
  ASSERT_TRUE(p->Observe(Pool::kPrefill, s).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->replica_capacity, 1000);
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->need, 1.2);
  // Not busy but above the estimate: a replica has shown it can do 1500.
  clock.Advance(absl::Seconds(10));
  s.replica_prefill_tokens_per_second = 1500;
  ASSERT_TRUE(p->Observe(Pool::kPrefill, s).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->replica_capacity, 1500);
  // Busy: the measurement is the capacity (no smoothing in Simple()).
  clock.Advance(absl::Seconds(10));
  s.queue_depth = 3;
  s.replica_prefill_tokens_per_second = 800;
  ASSERT_TRUE(p->Observe(Pool::kPrefill, s).ok());
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->replica_capacity, 800);
  EXPECT_DOUBLE_EQ(p->State(Pool::kPrefill)->need, 1.5);
}

TEST(PlannerTest, CooldownsAndHysteresis) {
  FakeClock clock;
  auto p = MakePlanner(clock, {{Pool::kPrefill, Simple()}});
  auto step = [&](double tps) {
    clock.Advance(absl::Seconds(10));
    EXPECT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(tps)).ok());
    return DesiredOf(*p, Pool::kPrefill);
  };
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(1000)).ok());  // t=0
  EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), 1);
  EXPECT_EQ(step(1050), 1);  // t=10: 1.05 is inside the band (up needs > 1.1)
  EXPECT_EQ(step(3000), 3);  // t=20: the first change up needs no wait
  EXPECT_EQ(step(6000), 3);  // t=30: up cooldown (30 s since t=20)
  EXPECT_EQ(step(6000), 3);  // t=40
  EXPECT_NE(p->State(Pool::kPrefill)->reason.find("waits 10s for the cooldown"), std::string::npos)
      << p->State(Pool::kPrefill)->reason;
  EXPECT_EQ(step(6000), 6);  // t=50
  // Down to 0.8 needed: ceil(0.8 * 1.1) = 1, held by the 120 s down cooldown from t=50.
  for (int t = 60; t < 170; t += 10) EXPECT_EQ(step(800), 6) << "t=" << t;
  EXPECT_EQ(step(800), 1);  // t=170
  const PoolState st = *p->State(Pool::kPrefill);
  EXPECT_EQ(st.scale_ups, 2);
  EXPECT_EQ(st.scale_downs, 1);
  EXPECT_EQ(st.held_by_cooldown, 2 + 11);
  EXPECT_EQ(st.last_change, clock.Now());
  EXPECT_EQ(st.evaluations, 18);
}

TEST(PlannerTest, ScaleDownKeepsHeadroom) {
  FakeClock clock;
  auto p = MakePlanner(clock, {{Pool::kPrefill, Simple()}});
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(6000, 6)).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), 6);
  // Need 1.0: one replica would run exactly at target, so two stay (ceil(1.0 * 1.1) = 2). The
  // first change down waits the down cooldown from the first sample.
  for (int t = 10; t <= 200; t += 10) {
    clock.Advance(absl::Seconds(10));
    ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(1000, 6)).ok());
    EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), t < 120 ? 6 : 2) << "t=" << t;
  }
}

TEST(PlannerTest, BoundsAreRespected) {
  FakeClock clock;
  PoolConfig c = Simple();
  c.min_replicas = 2;
  c.max_replicas = 5;
  c.scale_down_cooldown = absl::ZeroDuration();
  c.scale_up_cooldown = absl::ZeroDuration();
  auto p = MakePlanner(clock, {{Pool::kPrefill, c}});
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(5000, 9)).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), 5);  // the first count is clamped too
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(0, 5)).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), 2);
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(1e300, 2)).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), 5);
}

TEST(PlannerTest, ScalesFromAndToZero) {
  FakeClock clock;
  PoolConfig c = Simple();
  c.min_replicas = 0;
  c.scale_down_cooldown = absl::Seconds(20);
  auto p = MakePlanner(clock, {{Pool::kEncoder, c}});
  PoolSample idle;
  ASSERT_TRUE(p->Observe(Pool::kEncoder, idle).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kEncoder), 0);
  // One queued image is work: up from zero at once.
  clock.Advance(absl::Seconds(10));
  PoolSample one = idle;
  one.queue_depth = 1;
  ASSERT_TRUE(p->Observe(Pool::kEncoder, one).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kEncoder), 1);
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(p->Observe(Pool::kEncoder, idle).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kEncoder), 1);  // down cooldown
  clock.Advance(absl::Seconds(10));
  ASSERT_TRUE(p->Observe(Pool::kEncoder, idle).ok());
  EXPECT_EQ(DesiredOf(*p, Pool::kEncoder), 0);
}

TEST(PlannerTest, EvaluatesOncePerInterval) {
  FakeClock clock;
  auto p = MakePlanner(clock, {{Pool::kPrefill, Simple()}});
  ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(1000)).ok());  // evaluation 1 at t=0
  for (int t = 1; t <= 25; ++t) {
    clock.Advance(absl::Seconds(1));
    ASSERT_TRUE(p->Observe(Pool::kPrefill, PrefillAt(5000)).ok());
    // The need jumps at t=1, but the count only moves at the next evaluation (t=10).
    EXPECT_EQ(DesiredOf(*p, Pool::kPrefill), t < 10 ? 1 : 5) << "t=" << t;
  }
  const PoolState st = *p->State(Pool::kPrefill);
  EXPECT_EQ(st.samples, 26);
  EXPECT_EQ(st.evaluations, 3);  // t=0, 10, 20
}

TEST(PlannerTest, Errors) {
  FakeClock clock;
  auto p = MakePlanner(clock, {{Pool::kPrefill, Simple()}});
  EXPECT_EQ(p->Desired(Pool::kDecode).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p->Observe(Pool::kDecode, PoolSample()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p->Desired(Pool::kPrefill).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->State(Pool::kPrefill).status().code(), absl::StatusCode::kFailedPrecondition);

  struct Case {
    PoolSample sample;
    std::string message;
  };
  std::vector<Case> cases;
  PoolSample s;
  s.current_replicas = -1;
  cases.push_back({s, "sample.current_replicas: expected >= 0; got -1"});
  s = PoolSample();
  s.queued_input_tokens = -3;
  cases.push_back({s, "sample.queued_input_tokens: expected >= 0; got -3"});
  s = PoolSample();
  s.input_tokens_per_second = std::nan("");
  cases.push_back({s, "sample.input_tokens_per_second: expected a finite value >= 0; got nan"});
  s = PoolSample();
  s.kv_used_fraction = 1.5;
  cases.push_back({s, "sample.kv_used_fraction: expected a value in [0, 1]; got 1.5"});
  for (const Case& c : cases) {
    const absl::Status st = p->Observe(Pool::kPrefill, c.sample);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), c.message);
  }
  EXPECT_EQ(p->Desired(Pool::kPrefill).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(PlannerTest, CreateValidatesConfigs) {
  struct Case {
    std::function<void(PoolConfig&)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](PoolConfig& c) { c.min_replicas = -1; },
       "pools[decode].min_replicas: expected >= 0; got -1"},
      {[](PoolConfig& c) { c.min_replicas = 3, c.max_replicas = 2; },
       "pools[decode].max_replicas: expected >= max(min_replicas, 1) (3); got 2"},
      {[](PoolConfig& c) { c.min_replicas = 0, c.max_replicas = 0; },
       "pools[decode].max_replicas: expected >= max(min_replicas, 1) (1); got 0"},
      {[](PoolConfig& c) { c.target_utilization = 0; },
       "pools[decode].target_utilization: expected a value in (0, 1]; got 0"},
      {[](PoolConfig& c) { c.interval = absl::ZeroDuration(); },
       "pools[decode].interval: expected > 0; got 0"},
      {[](PoolConfig& c) { c.smoothing = -absl::Seconds(1); },
       "pools[decode].smoothing: expected a finite duration >= 0; got -1s"},
      {[](PoolConfig& c) { c.hysteresis = 1; },
       "pools[decode].hysteresis: expected a value in [0, 1); got 1"},
      {[](PoolConfig& c) { c.scale_down_cooldown = -absl::Seconds(2); },
       "pools[decode].scale_down_cooldown: expected >= 0; got -2s"},
      {[](PoolConfig& c) { c.backlog_drain_time = absl::ZeroDuration(); },
       "pools[decode].backlog_drain_time: expected a finite duration > 0; got 0"},
      {[](PoolConfig& c) { c.initial_replica_capacity = 0; },
       "pools[decode].initial_replica_capacity: expected a finite value > 0; got 0"},
  };
  for (const Case& c : cases) {
    PoolConfig config = Simple();
    c.edit(config);
    Planner::Options o;
    o.pools = {{Pool::kPrefill, Simple()}, {Pool::kDecode, config}};
    auto p = Planner::Create(std::move(o));
    ASSERT_FALSE(p.ok()) << c.message;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(p.status().message(), c.message);
  }
  auto none = Planner::Create(Planner::Options());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "pools: expected at least one pool to plan; got none");
}

// ---------------------------------------------------------------------------------------------
// Closed-loop synthetic traces: a small cluster model whose replica counts follow the planner's
// desired counts (the scaler applies them at once), sampled every 10 s.
//
// Prefill: each replica computes 5000 prompt tokens/s; arrivals beyond that queue up.
// Decode: each replica runs at most 64 sequences and holds 10000 KV blocks; sequences beyond the
// slots wait.

struct Demand {
  double input_tokens_per_second = 0;  // prompt tokens arriving
  double prompt_tokens = 0;            // mean prompt length (for the queue's request count)
  double sequences = 0;                // concurrent sequences wanting to decode
  double kv_blocks = 0;                // KV blocks those sequences hold
};

class Cluster {
 public:
  static constexpr double kPrefillTokensPerSecond = 5000;
  static constexpr double kDecodeSlots = 64;
  static constexpr double kKvBlocks = 10000;
  static constexpr absl::Duration kStep = absl::Seconds(10);

  explicit Cluster(int prefill_replicas, int decode_replicas) {
    PoolConfig prefill;
    prefill.min_replicas = 1;
    prefill.max_replicas = 16;
    prefill.target_utilization = 0.8;
    prefill.interval = kStep;
    prefill.smoothing = absl::Seconds(30);
    prefill.hysteresis = 0.1;
    prefill.scale_up_cooldown = absl::Seconds(30);
    prefill.scale_down_cooldown = absl::Minutes(5);
    prefill.backlog_drain_time = absl::Seconds(30);
    prefill.initial_replica_capacity = kPrefillTokensPerSecond;
    PoolConfig decode = prefill;
    decode.initial_replica_capacity = kDecodeSlots;
    planner_ = MakePlanner(clock_, {{Pool::kPrefill, prefill}, {Pool::kDecode, decode}});
    prefill_replicas_ = prefill_replicas;
    decode_replicas_ = decode_replicas;
  }

  // Advances 10 s under `demand`, reports both pools and applies the desired counts.
  void Step(const Demand& demand) {
    clock_.Advance(kStep);
    const double step_s = absl::ToDoubleSeconds(kStep);
    PoolSample p;
    p.current_replicas = prefill_replicas_;
    const double capacity = prefill_replicas_ * kPrefillTokensPerSecond;
    const double processed =
        std::min(demand.input_tokens_per_second + backlog_tokens_ / step_s, capacity);
    backlog_tokens_ += (demand.input_tokens_per_second - processed) * step_s;
    backlog_tokens_ = std::max(0.0, backlog_tokens_);
    p.input_tokens_per_second = demand.input_tokens_per_second;
    p.queued_input_tokens = static_cast<int64_t>(backlog_tokens_);
    p.queue_depth = backlog_tokens_ > 0
                        ? static_cast<int64_t>(std::ceil(backlog_tokens_ / demand.prompt_tokens))
                        : 0;
    p.replica_prefill_tokens_per_second = processed / prefill_replicas_;
    ASSERT_TRUE(planner_->Observe(Pool::kPrefill, p).ok());

    PoolSample d;
    d.current_replicas = decode_replicas_;
    const double running = std::min(demand.sequences, decode_replicas_ * kDecodeSlots);
    d.running_sequences = static_cast<int64_t>(running);
    d.queue_depth = static_cast<int64_t>(demand.sequences - running);
    d.kv_used_fraction = std::min(1.0, demand.kv_blocks / (decode_replicas_ * kKvBlocks));
    d.replica_decode_sequences = running / decode_replicas_;
    ASSERT_TRUE(planner_->Observe(Pool::kDecode, d).ok());

    const int new_prefill = DesiredOf(*planner_, Pool::kPrefill);
    const int new_decode = DesiredOf(*planner_, Pool::kDecode);
    prefill_ups_ += new_prefill > prefill_replicas_;
    prefill_downs_ += new_prefill < prefill_replicas_;
    decode_ups_ += new_decode > decode_replicas_;
    decode_downs_ += new_decode < decode_replicas_;
    prefill_replicas_ = new_prefill;
    decode_replicas_ = new_decode;
    max_prefill_ = std::max(max_prefill_, prefill_replicas_);
    max_decode_ = std::max(max_decode_, decode_replicas_);
  }

  int prefill_replicas() const { return prefill_replicas_; }
  int decode_replicas() const { return decode_replicas_; }
  int max_prefill() const { return max_prefill_; }
  int max_decode() const { return max_decode_; }
  int prefill_ups() const { return prefill_ups_; }
  int prefill_downs() const { return prefill_downs_; }
  int decode_ups() const { return decode_ups_; }
  int decode_downs() const { return decode_downs_; }
  double backlog_tokens() const { return backlog_tokens_; }
  void ResetCounts() {
    prefill_ups_ = prefill_downs_ = decode_ups_ = decode_downs_ = 0;
    max_prefill_ = prefill_replicas_;
    max_decode_ = decode_replicas_;
  }

 private:
  FakeClock clock_;
  std::unique_ptr<Planner> planner_;
  int prefill_replicas_ = 0;
  int decode_replicas_ = 0;
  int max_prefill_ = 0;
  int max_decode_ = 0;
  int prefill_ups_ = 0;
  int prefill_downs_ = 0;
  int decode_ups_ = 0;
  int decode_downs_ = 0;
  double backlog_tokens_ = 0;
};

// Steady chat traffic: 6000 prompt tokens/s (~300-token prompts), 70 sequences decoding holding
// 7000 KV blocks. Needs: prefill 6000 / 4000 = 1.5, decode 70 / 51.2 = 1.37 -> 2 and 2.
Demand Baseline() { return {6000, 300, 70, 7000}; }

TEST(PlannerTraceTest, LongPromptBurstRaisesPrefillNotDecode) {
  Cluster cluster(2, 2);
  for (int i = 0; i < 30; ++i) cluster.Step(Baseline());
  ASSERT_EQ(cluster.prefill_replicas(), 2);
  ASSERT_EQ(cluster.decode_replicas(), 2);
  // 5 minutes of 8 requests/s with 5000-token prompts and short answers: +40000 prompt
  // tokens/s; the 16 extra sequences decoding hold 313 blocks each.
  Demand burst = Baseline();
  burst.input_tokens_per_second += 40000;
  burst.prompt_tokens = 5000;
  burst.sequences += 16;
  burst.kv_blocks += 16 * 313;
  for (int i = 0; i < 30; ++i) cluster.Step(burst);
  // 46000 tok/s at 4000 per replica needs 11.5 replicas, plus draining the backlog.
  EXPECT_GE(cluster.prefill_replicas(), 12);
  EXPECT_LE(cluster.max_prefill(), 16);
  EXPECT_EQ(cluster.max_decode(), 2);
  EXPECT_EQ(cluster.decode_ups() + cluster.decode_downs(), 0);
  EXPECT_LE(cluster.prefill_ups(), 5);     // a few steps up (cooldown-spaced)
  EXPECT_LE(cluster.prefill_downs(), 1);   // at most one trim once the backlog is gone
  EXPECT_EQ(cluster.backlog_tokens(), 0);  // the backlog was drained
  // Back to the baseline: prefill comes down, only down, within two down cooldowns.
  cluster.ResetCounts();
  for (int i = 0; i < 60; ++i) cluster.Step(Baseline());
  EXPECT_EQ(cluster.prefill_replicas(), 2);
  EXPECT_EQ(cluster.decode_replicas(), 2);
  EXPECT_EQ(cluster.prefill_ups(), 0);
  EXPECT_LE(cluster.prefill_downs(), 2);
  EXPECT_EQ(cluster.decode_ups() + cluster.decode_downs(), 0);
}

TEST(PlannerTraceTest, ShortChatsWithLongOutputsRaiseDecodeNotPrefill) {
  Cluster cluster(2, 2);
  for (int i = 0; i < 30; ++i) cluster.Step(Baseline());
  // +5 requests/s of 200-token prompts with 1000-token answers decoded for ~50 s each: +1000
  // prompt tokens/s, +250 concurrent sequences holding 75 blocks each.
  Demand chats = Baseline();
  chats.input_tokens_per_second += 1000;
  chats.prompt_tokens = 280;
  chats.sequences += 250;
  chats.kv_blocks += 250 * 75;
  cluster.ResetCounts();
  for (int i = 0; i < 30; ++i) cluster.Step(chats);
  // 320 sequences at 51.2 per replica need 6.25 replicas: 6 are within the 10% band (6.6), and
  // their 384 slots run every sequence.
  EXPECT_EQ(cluster.decode_replicas(), 6);
  EXPECT_LE(cluster.decode_ups(), 4);
  EXPECT_EQ(cluster.decode_downs(), 0);
  EXPECT_EQ(cluster.max_prefill(), 2);
  EXPECT_EQ(cluster.prefill_ups() + cluster.prefill_downs(), 0);
}

// Steady load with +-15% noise on every quantity, its mean need close to the count above
// (prefill 7600 / 4000 = 1.9 of 2, decode 145 / 51.2 = 2.83 of 3): single samples reach 2.19
// and 3.26, past the counts, and fall to 1.62 and 2.41.
Demand Noisy(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> noise(0.85, 1.15);
  Demand d;
  d.input_tokens_per_second = 7600 * noise(rng);
  d.prompt_tokens = 300;
  d.sequences = std::round(145 * noise(rng));
  d.kv_blocks = 14500 * noise(rng);
  return d;
}

TEST(PlannerTraceTest, SteadyNoisyLoadDoesNotFlap) {
  std::mt19937_64 rng(42);
  Cluster cluster(2, 3);
  for (int i = 0; i < 30; ++i) cluster.Step(Noisy(rng));
  EXPECT_EQ(cluster.prefill_replicas(), 2);
  EXPECT_EQ(cluster.decode_replicas(), 3);
  cluster.ResetCounts();
  const int kIntervals = 500;  // ~83 minutes
  for (int i = 0; i < kIntervals; ++i) cluster.Step(Noisy(rng));
  EXPECT_EQ(cluster.prefill_ups() + cluster.prefill_downs(), 0);
  EXPECT_EQ(cluster.decode_ups() + cluster.decode_downs(), 0);
  EXPECT_EQ(cluster.prefill_replicas(), 2);
  EXPECT_EQ(cluster.decode_replicas(), 3);
}

TEST(PlannerTraceTest, WithoutSmoothingAndHysteresisTheSameLoadFlaps) {
  // The control for the test above: the mechanisms, not the trace, keep it steady.
  FakeClock clock;
  PoolConfig c = Simple();
  c.target_utilization = 0.8;
  c.initial_replica_capacity = 5000;
  c.hysteresis = 0;
  c.scale_up_cooldown = c.scale_down_cooldown = absl::ZeroDuration();
  auto p = MakePlanner(clock, {{Pool::kPrefill, c}});
  std::mt19937_64 rng(42);
  int current = 2, changes = 0;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(
        p->Observe(Pool::kPrefill, PrefillAt(Noisy(rng).input_tokens_per_second, current)).ok());
    const int desired = DesiredOf(*p, Pool::kPrefill);
    changes += desired != current;
    current = desired;
    clock.Advance(absl::Seconds(10));
  }
  EXPECT_GE(changes, 10);
}

}  // namespace
}  // namespace deepinfer::router
