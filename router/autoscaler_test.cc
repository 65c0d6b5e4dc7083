#include "router/autoscaler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/fake_clock.h"
#include "gtest/gtest.h"
#include "router/fake_scaler.h"
#include "router/plan_publisher.h"
#include "router/router_admin_service.h"

namespace deepinfer::router {
namespace {

using internal::v1::LoadReport;
using internal::v1::WorkerInfo;
using internal::v1::WorkerRole;


constexpr absl::Duration kStep = absl::Seconds(10);
constexpr double kPrefillCapacity = 5000;  // tokens/s one simulated prefill replica computes
constexpr int kDecodeMaxRunning = 32;      // sequences one simulated decode replica runs
constexpr int kDecodeBlocks = 1000;
constexpr int kPromptTokens = 1000;

// The load offered to the simulated cluster during one step.
struct Load {
  double prefill_tokens_per_second = 0;  // prompt tokens arriving
  int decode_sequences = 0;              // sequences generating (long outputs keep them there)
  int blocks_per_sequence = 4;           // KV blocks each decoding sequence holds
};

// A simulated cluster: registers workers with a real WorkerRegistry (fake clock) to follow the
// FakeScaler's counts, and reports the load each replica of a saturating pool would see.
class AutoscalerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkerRegistry::Options ro;
    ro.clock = clock_.AsFunction();
    ro.heartbeat_interval = absl::Seconds(5);
    ro.missed_heartbeats_allowed = 3;
    auto registry = WorkerRegistry::Create(ro);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    AddScalerPool(Pool::kPrefill, 1);
    AddScalerPool(Pool::kDecode, 1);
  }

  static PoolConfig Config(double initial_capacity) {
    PoolConfig c;
    c.min_replicas = 1;
    c.max_replicas = 4;
    c.target_utilization = 0.8;
    c.interval = kStep;
    c.smoothing = absl::Seconds(20);
    c.hysteresis = 0.1;
    c.scale_up_cooldown = absl::Seconds(30);
    c.scale_down_cooldown = absl::Minutes(2);
    c.backlog_drain_time = absl::Seconds(30);
    c.initial_replica_capacity = initial_capacity;
    return c;
  }

  void MakeAutoscaler() {
    Autoscaler::Options o;
    o.clock = clock_.AsFunction();
    o.interval = kStep;
    o.pools[Pool::kPrefill] = Config(kPrefillCapacity);
    o.pools[Pool::kDecode] = Config(kDecodeMaxRunning);
    auto a = Autoscaler::Create(registry_.get(), &scaler_, o);
    ASSERT_TRUE(a.ok()) << a.status();
    autoscaler_ = *std::move(a);
  }

  WorkerInfo Info(const std::string& id, WorkerRole role) {
    WorkerInfo w;
    w.set_worker_id(id);
    w.set_role(role);
    w.set_address("127.0.0.1:5000");
    w.set_model("m");
    w.set_incarnation(1);
    w.set_block_size(16);
    w.set_kv_capacity_blocks(kDecodeBlocks);
    w.set_block_hash_seed(42);
    return w;
  }

  // Starts or stops simulated workers so that each pool runs what the scaler asks.
  void FollowScaler() {
    for (auto [pool, role] : {std::pair{Pool::kPrefill, internal::v1::WORKER_ROLE_PREFILL},
                              std::pair{Pool::kDecode, internal::v1::WORKER_ROLE_DECODE}}) {
      const int want = Replicas(pool);
      std::vector<std::string>& ids = workers_[pool];
      while (static_cast<int>(ids.size()) < want) {
        const std::string id = absl::StrCat(PoolName(pool), "-", next_id_++);
        ASSERT_TRUE(registry_->Register(Info(id, role)).ok());
        ids.push_back(id);
      }
      while (static_cast<int>(ids.size()) > want) {
        ASSERT_TRUE(registry_->Deregister(ids.back(), 1).ok());
        ids.pop_back();
      }
    }
  }

  void Report(const std::string& id, LoadReport report) {
    report.set_worker_id(id);
    report.set_incarnation(1);
    report.set_sequence(++sequence_[id]);
    ASSERT_TRUE(registry_->ReportLoad(report).known()) << id;
  }

  // One step: the cluster follows the scaler, every worker reports the load it saw over the
  // step, time advances and the autoscaler runs one pass.
  void Step(const Load& load) {
    FollowScaler();
    const auto& prefill = workers_[Pool::kPrefill];
    const double n_prefill = static_cast<double>(prefill.size());
    const double per_replica = load.prefill_tokens_per_second / n_prefill;
    backlog_tokens_ += (load.prefill_tokens_per_second - n_prefill * kPrefillCapacity) *
                       absl::ToDoubleSeconds(kStep);
    backlog_tokens_ = std::max(0.0, backlog_tokens_);
    for (const std::string& id : prefill) {
      LoadReport r;
      const bool saturated = backlog_tokens_ > 0;
      r.set_prefill_tokens_per_second(saturated ? kPrefillCapacity
                                                : std::min(per_replica, kPrefillCapacity));
      r.set_queue_depth(
          static_cast<uint32_t>(std::ceil(backlog_tokens_ / kPromptTokens / n_prefill)));
      r.set_queued_input_tokens(static_cast<uint64_t>(backlog_tokens_ / n_prefill));
      r.set_running_sequences(per_replica > 0 ? 2 : 0);
      r.set_total_kv_blocks(kDecodeBlocks);
      r.set_free_kv_blocks(kDecodeBlocks / 2);
      Report(id, r);
    }
    const auto& decode = workers_[Pool::kDecode];
    const int n_decode = static_cast<int>(decode.size());
    for (int i = 0; i < n_decode; ++i) {
      const int share = load.decode_sequences / n_decode + (i < load.decode_sequences % n_decode);
      const int running = std::min(share, kDecodeMaxRunning);
      LoadReport r;
      r.set_running_sequences(static_cast<uint32_t>(running));
      r.set_queue_depth(static_cast<uint32_t>(share - running));
      r.set_decode_tokens_per_second(running * 50.0);
      r.set_total_kv_blocks(kDecodeBlocks);
      r.set_free_kv_blocks(
          static_cast<uint64_t>(std::max(0, kDecodeBlocks - running * load.blocks_per_sequence)));
      Report(decode[i], r);
    }
    clock_.Advance(kStep);
    autoscaler_->Tick();
  }

  int Calls(Pool pool) const {
    int n = 0;
    for (const auto& c : scaler_.set_calls()) n += c.pool == pool;
    return n;
  }
  // The fake scaler's count, without consuming its injected failures: the last successful
  // SetReplicas, else the count it was configured with.
  int Replicas(Pool pool) const {
    int n = initial_.at(pool);
    for (const auto& c : scaler_.set_calls()) {
      if (c.pool == pool) n = c.replicas;
    }
    return n;
  }
  void AddScalerPool(Pool pool, int replicas) {
    scaler_.AddPool(pool, replicas);
    initial_[pool] = replicas;
  }

  FakeClock clock_;
  std::unique_ptr<WorkerRegistry> registry_;
  FakeScaler scaler_;
  std::unique_ptr<Autoscaler> autoscaler_;
  std::map<Pool, int> initial_;
  std::map<Pool, std::vector<std::string>> workers_;
  std::map<std::string, uint64_t> sequence_;
  int next_id_ = 0;
  double backlog_tokens_ = 0;
};

TEST_F(AutoscalerTest, LongPromptBurstGrowsPrefillNotDecode) {
  MakeAutoscaler();
  Load burst;
  burst.prefill_tokens_per_second = 3 * kPrefillCapacity;  // three replicas' worth of prompts
  burst.decode_sequences = 6;  // max_tokens small: few sequences decode at a time
  int max_prefill = 1;
  for (int i = 0; i < 20; ++i) {
    Step(burst);
    max_prefill = std::max(max_prefill, Replicas(Pool::kPrefill));
  }
  EXPECT_GE(max_prefill, 3);
  EXPECT_EQ(Replicas(Pool::kPrefill), *autoscaler_->PoolStatusOf(Pool::kPrefill)->scaler_replicas);
  EXPECT_EQ(Replicas(Pool::kDecode), 1);
  EXPECT_EQ(Calls(Pool::kDecode), 0);
  const AutoscalePoolStatus prefill = *autoscaler_->PoolStatusOf(Pool::kPrefill);
  EXPECT_TRUE(prefill.planned);
  EXPECT_EQ(prefill.desired, Replicas(Pool::kPrefill));
  EXPECT_EQ(prefill.live_replicas, static_cast<int>(workers_[Pool::kPrefill].size()));
  EXPECT_GT(prefill.last_sample.input_tokens_per_second, 0);
  EXPECT_EQ(prefill.scaler_errors, 0);
  EXPECT_GE(prefill.scaler_calls, 1);

  // The burst ends: prefill shrinks back to its minimum once the cooldown has passed.
  for (int i = 0; i < 40; ++i) Step(Load{});
  EXPECT_EQ(Replicas(Pool::kPrefill), 1);
  EXPECT_EQ(Replicas(Pool::kDecode), 1);
}

TEST_F(AutoscalerTest, ShortChatsWithLongOutputsGrowDecodeNotPrefill) {
  MakeAutoscaler();
  Load chats;
  chats.prefill_tokens_per_second = 0.1 * kPrefillCapacity;  // short prompts
  chats.decode_sequences = 80;                               // long outputs pile up sequences
  int max_decode = 1;
  for (int i = 0; i < 20; ++i) {
    Step(chats);
    max_decode = std::max(max_decode, Replicas(Pool::kDecode));
  }
  EXPECT_GE(max_decode, 3);
  EXPECT_EQ(Replicas(Pool::kPrefill), 1);
  EXPECT_EQ(Calls(Pool::kPrefill), 0);
  const AutoscalePoolStatus decode = *autoscaler_->PoolStatusOf(Pool::kDecode);
  EXPECT_GT(decode.last_sample.running_sequences, 0);
  EXPECT_GT(decode.last_sample.kv_used_fraction, 0);
}

TEST_F(AutoscalerTest, KvPressureGrowsDecode) {
  MakeAutoscaler();
  Load load;
  load.decode_sequences = 20;     // well under the sequence capacity...
  load.blocks_per_sequence = 48;  // ...but 96% of the KV blocks
  for (int i = 0; i < 6; ++i) Step(load);
  EXPECT_GE(Replicas(Pool::kDecode), 2);
  EXPECT_EQ(Calls(Pool::kPrefill), 0);
}

TEST_F(AutoscalerTest, SteadyLoadDoesNotFlap) {
  MakeAutoscaler();
  Load steady;
  steady.prefill_tokens_per_second = 1.5 * kPrefillCapacity;
  steady.decode_sequences = 40;
  for (int i = 0; i < 15; ++i) Step(steady);
  const int prefill_calls = Calls(Pool::kPrefill);
  const int decode_calls = Calls(Pool::kDecode);
  const int prefill = Replicas(Pool::kPrefill);
  const int decode = Replicas(Pool::kDecode);
  EXPECT_GE(prefill, 2);
  EXPECT_GE(decode, 2);
  // Settled within 15 steps, and after that 60 more steps of the same load change nothing.
  EXPECT_LE(prefill_calls, 3);
  EXPECT_LE(decode_calls, 3);
  for (int i = 0; i < 60; ++i) Step(steady);
  EXPECT_EQ(Calls(Pool::kPrefill), prefill_calls);
  EXPECT_EQ(Calls(Pool::kDecode), decode_calls);
  EXPECT_EQ(Replicas(Pool::kPrefill), prefill);
  EXPECT_EQ(Replicas(Pool::kDecode), decode);
  EXPECT_EQ(autoscaler_->ticks(), 75);
}

TEST_F(AutoscalerTest, ScalerFailuresAreCountedAndRetried) {
  MakeAutoscaler();
  Load burst;
  burst.prefill_tokens_per_second = 3 * kPrefillCapacity;
  Step(Load{});  // first sample, idle: desired stays 1
  ASSERT_EQ(Calls(Pool::kPrefill), 0);
  scaler_.FailNext(Pool::kPrefill, absl::UnavailableError("api server down"), 3);
  for (int i = 0; i < 3; ++i) Step(burst);
  EXPECT_EQ(Calls(Pool::kPrefill), 0);
  AutoscalePoolStatus st = *autoscaler_->PoolStatusOf(Pool::kPrefill);
  EXPECT_EQ(st.scaler_errors, 3);
  EXPECT_TRUE(absl::StrContains(st.last_scaler_error, "api server down")) << st.last_scaler_error;
  EXPECT_FALSE(st.scaler_replicas.has_value());
  EXPECT_GE(st.desired, 2);  // the plan moved on while the scaler failed
  // The decode pool was handled on every pass regardless.
  EXPECT_EQ(autoscaler_->PoolStatusOf(Pool::kDecode)->scaler_replicas, 1);

  Step(burst);
  ASSERT_EQ(Calls(Pool::kPrefill), 1);
  EXPECT_EQ(Replicas(Pool::kPrefill), st.desired);
  st = *autoscaler_->PoolStatusOf(Pool::kPrefill);
  EXPECT_EQ(st.scaler_errors, 3);
  EXPECT_EQ(st.scaler_replicas, Replicas(Pool::kPrefill));
}

TEST_F(AutoscalerTest, StartsFromTheScalersCountNotAnEmptyRegistry) {
  AddScalerPool(Pool::kPrefill, 3);  // deployed with 3; the router just restarted
  MakeAutoscaler();
  autoscaler_->Tick();  // no worker has registered yet
  EXPECT_EQ(Calls(Pool::kPrefill), 0);
  EXPECT_EQ(Replicas(Pool::kPrefill), 3);
  const AutoscalePoolStatus st = *autoscaler_->PoolStatusOf(Pool::kPrefill);
  EXPECT_EQ(st.desired, 3);
  EXPECT_EQ(st.live_replicas, 0);
}

TEST(AutoscalerSampleTest, CountsOnlyLiveWorkersOfThePool) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  auto worker = [&](const std::string& id, WorkerRole role, absl::Duration age) {
    WorkerSnapshot w;
    w.info.set_worker_id(id);
    w.info.set_role(role);
    w.last_heartbeat = now - age;
    w.has_load = true;
    w.load.set_queue_depth(2);
    w.load.set_queued_input_tokens(100);
    w.load.set_running_sequences(5);
    w.load.set_total_kv_blocks(100);
    w.load.set_free_kv_blocks(75);
    w.load.set_prefill_tokens_per_second(role == internal::v1::WORKER_ROLE_PREFILL ? 1000 : 0);
    w.placed_tokens = 50;
    w.placed_blocks = 5;
    return w;
  };
  const std::vector<WorkerSnapshot> workers = {
      worker("p0", internal::v1::WORKER_ROLE_PREFILL, absl::Seconds(1)),
      worker("p1", internal::v1::WORKER_ROLE_PREFILL, absl::Seconds(2)),
      worker("p2", internal::v1::WORKER_ROLE_PREFILL, absl::Seconds(60)),  // dead
      worker("d0", internal::v1::WORKER_ROLE_DECODE, absl::Seconds(1)),
  };
  const PoolSample p = Autoscaler::BuildSample(Pool::kPrefill, workers, now, absl::Seconds(10));
  EXPECT_EQ(p.current_replicas, 2);
  EXPECT_EQ(p.queue_depth, 4);
  EXPECT_EQ(p.queued_input_tokens, 300);  // reported + placed since
  EXPECT_DOUBLE_EQ(p.input_tokens_per_second, 2000);
  EXPECT_DOUBLE_EQ(p.replica_prefill_tokens_per_second, 1000);
  EXPECT_EQ(p.running_sequences, 0);

  const PoolSample d = Autoscaler::BuildSample(Pool::kDecode, workers, now, absl::Seconds(10));
  EXPECT_EQ(d.current_replicas, 1);
  EXPECT_EQ(d.running_sequences, 5);
  EXPECT_DOUBLE_EQ(d.replica_decode_sequences, 5);
  EXPECT_DOUBLE_EQ(d.kv_used_fraction, 0.30);  // 25 used + 5 placed of 100
  EXPECT_EQ(d.queued_input_tokens, 0);

  const PoolSample e = Autoscaler::BuildSample(Pool::kEncoder, workers, now, absl::Seconds(10));
  EXPECT_EQ(e.current_replicas, 0);

  // Encoders: images/s summed over the live ones; the per-replica mean is the measured rate.
  std::vector<WorkerSnapshot> encoders = {
      worker("e0", internal::v1::WORKER_ROLE_ENCODER, absl::Seconds(1)),
      worker("e1", internal::v1::WORKER_ROLE_ENCODER, absl::Seconds(1)),
      worker("e2", internal::v1::WORKER_ROLE_ENCODER, absl::Seconds(60)),  // dead
  };
  encoders[0].load.set_images_per_second(30);
  encoders[1].load.set_images_per_second(10);
  encoders[2].load.set_images_per_second(99);
  const PoolSample enc =
      Autoscaler::BuildSample(Pool::kEncoder, encoders, now, absl::Seconds(10));
  EXPECT_EQ(enc.current_replicas, 2);
  EXPECT_EQ(enc.queue_depth, 4);
  EXPECT_DOUBLE_EQ(enc.images_per_second, 40);
  EXPECT_DOUBLE_EQ(enc.replica_images_per_second, 20);
  EXPECT_EQ(enc.queued_input_tokens, 0);
}

TEST_F(AutoscalerTest, EncoderPoolIsSampledOnlyWhenEncodersExist) {
  Autoscaler::Options o;
  o.clock = clock_.AsFunction();
  o.pools[Pool::kEncoder] = Config(1);
  o.pools[Pool::kPrefill] = Config(kPrefillCapacity);
  AddScalerPool(Pool::kEncoder, 1);
  auto a = Autoscaler::Create(registry_.get(), &scaler_, o);
  ASSERT_TRUE(a.ok()) << a.status();
  (*a)->Tick();
  EXPECT_FALSE((*a)->PoolStatusOf(Pool::kEncoder)->planned);
  EXPECT_TRUE((*a)->PoolStatusOf(Pool::kPrefill)->planned);
  EXPECT_FALSE((*a)->PoolStatusOf(Pool::kDecode).has_value());  // not configured
  ASSERT_TRUE(registry_->Register(Info("enc-0", internal::v1::WORKER_ROLE_ENCODER)).ok());
  (*a)->Tick();
  const AutoscalePoolStatus enc = *(*a)->PoolStatusOf(Pool::kEncoder);
  EXPECT_TRUE(enc.planned);
  EXPECT_EQ(enc.live_replicas, 1);
  EXPECT_EQ((*a)->Status().size(), 2u);
}

TEST_F(AutoscalerTest, CreateRejectsBadOptions) {
  Autoscaler::Options o;
  o.pools[Pool::kPrefill] = Config(kPrefillCapacity);
  EXPECT_EQ(Autoscaler::Create(nullptr, &scaler_, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Autoscaler::Create(registry_.get(), nullptr, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  Autoscaler::Options zero = o;
  zero.interval = absl::ZeroDuration();
  EXPECT_TRUE(absl::StrContains(
      Autoscaler::Create(registry_.get(), &scaler_, zero).status().message(), "interval"));
  Autoscaler::Options bad = o;
  bad.pools[Pool::kPrefill].max_replicas = 0;
  EXPECT_TRUE(
      absl::StrContains(Autoscaler::Create(registry_.get(), &scaler_, bad).status().message(),
                        "pools[prefill].max_replicas"));
}

TEST_F(AutoscalerTest, StartRunsPassesUntilStop) {
  Autoscaler::Options o;  // real clock
  o.interval = absl::Milliseconds(5);
  o.pools[Pool::kPrefill] = Config(kPrefillCapacity);
  auto a = Autoscaler::Create(registry_.get(), &scaler_, o);
  ASSERT_TRUE(a.ok());
  (*a)->Start();
  (*a)->Start();  // once
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((*a)->ticks() < 3 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  (*a)->Stop();
  const int64_t ticks = (*a)->ticks();
  EXPECT_GE(ticks, 3);
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ((*a)->ticks(), ticks);
  (*a)->Stop();  // idempotent
}

TEST(PlanPublisherTest, RecordsWhatIsAsked) {
  PlanPublisher p;
  EXPECT_EQ(*p.GetReplicas(Pool::kPrefill), 0);
  EXPECT_FALSE(p.Get(Pool::kPrefill).has_value());
  ASSERT_TRUE(p.SetReplicas(Pool::kPrefill, 3).ok());
  ASSERT_TRUE(p.SetReplicas(Pool::kPrefill, 2).ok());
  EXPECT_EQ(*p.GetReplicas(Pool::kPrefill), 2);
  EXPECT_EQ(p.Get(Pool::kPrefill)->version, 2);
  EXPECT_EQ(*p.GetReplicas(Pool::kDecode), 0);
  EXPECT_EQ(p.SetReplicas(Pool::kDecode, -1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AutoscalerTest, PlanPublisherFollowsThePlanAndGetPlanReportsIt) {
  PlanPublisher publisher;
  Autoscaler::Options o;
  o.clock = clock_.AsFunction();
  o.pools[Pool::kPrefill] = Config(kPrefillCapacity);
  o.pools[Pool::kDecode] = Config(kDecodeMaxRunning);
  auto a = Autoscaler::Create(registry_.get(), &publisher, o);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(registry_->Register(Info("p0", internal::v1::WORKER_ROLE_PREFILL)).ok());
  (*a)->Tick();
  EXPECT_EQ(*publisher.GetReplicas(Pool::kPrefill), 1);  // published at once
  EXPECT_EQ(*publisher.GetReplicas(Pool::kDecode), 1);   // min_replicas with none live

  RouterAdminService off(nullptr, "external");
  internal::v1::GetPlanResponse response;
  EXPECT_EQ(off.GetPlan(nullptr, nullptr, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  RouterAdminService service(a->get(), "external");
  ASSERT_TRUE(service.GetPlan(nullptr, nullptr, &response).ok());
  EXPECT_EQ(response.scaler(), "external");
  EXPECT_EQ(response.ticks(), 1u);
  ASSERT_EQ(response.pools_size(), 2);
  const internal::v1::PoolPlan& p = response.pools(0);
  EXPECT_EQ(p.pool(), internal::v1::WORKER_ROLE_PREFILL);
  EXPECT_TRUE(p.planned());
  EXPECT_EQ(p.desired_replicas(), 1u);
  EXPECT_EQ(p.live_replicas(), 1u);
  EXPECT_EQ(p.scaler_replicas(), 1);
  EXPECT_EQ(p.max_replicas(), 4u);
  EXPECT_EQ(p.last_sample().current_replicas(), 1u);
  EXPECT_EQ(p.last_sample().sampled_at_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_EQ(p.scaler_calls(), 1u);
  EXPECT_FALSE(p.reason().empty());
  EXPECT_EQ(response.pools(1).pool(), internal::v1::WORKER_ROLE_DECODE);
  EXPECT_EQ(response.pools(1).live_replicas(), 0u);
}

}  // namespace
}  // namespace deepinfer::router
