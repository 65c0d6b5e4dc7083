// Autoscaling end to end, as real processes: the router runs its planner with
// `--autoscale --scaler=external` and fast knobs, the local supervisor (deploy/local/
// supervisor.h) follows RouterAdmin.GetPlan by adding and draining workers of a LocalCluster.
// A burst of long prompts (max_tokens 1) grows the prefill pool while decode stays at one
// replica; once the burst stops the prefill pool shrinks back to one.
//
// Asserts on counts reached within generous deadlines, not on timing: CI runs this on two
// loaded cores.
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "deploy/local/local_cluster.h"
#include "deploy/local/supervisor.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/router_admin.pb.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "tests/cluster_test_util.h"

namespace deepinfer {
namespace {

using deploy::ClusterRole;

int Running(const deploy::LocalCluster& cluster, ClusterRole role) {
  int n = 0;
  for (const auto& w : cluster.workers()) n += w.role == role && w.running;
  return n;
}

std::string Describe(deploy::RouterPlanSource& plans) {
  auto plan = plans.GetPlan();
  return plan.ok() ? plan->ShortDebugString() : plan.status().ToString();
}

TEST(ClusterAutoscaleTest, LongPromptBurstGrowsPrefillOnlyAndItShrinksAfter) {
  deploy::LocalClusterConfig config = testutil::ClusterConfig("autoscale", 1, 1, false);
  // Decode nodes get room for every prompt of the burst at once, so the KV term of the decode
  // plan stays low; prefill nodes keep 2048 tokens of KV, so prompts queue there.
  config.decode_flags.push_back("--kv_blocks=8192");
  for (const char* flag :
       {"--autoscale", "--scaler=external", "--autoscale_interval=300ms", "--smoothing=1s",
        "--hysteresis=0.1", "--target_utilization=0.8", "--scale_up_cooldown=1s",
        "--scale_down_cooldown=3s", "--backlog_drain_time=5s", "--prefill_min_replicas=1",
        "--prefill_max_replicas=3", "--prefill_initial_replica_capacity=200",
        "--decode_min_replicas=1", "--decode_max_replicas=2",
        "--decode_initial_replica_capacity=64"}) {
    config.router_flags.push_back(flag);
  }
  auto started = deploy::LocalCluster::Start(config);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<deploy::LocalCluster> cluster = *std::move(started);

  deploy::RouterPlanSource plans(cluster->router_address(), absl::Seconds(5));
  deploy::SupervisorOptions options;
  options.prefill = {1, 3};
  options.decode = {1, 2};
  options.interval = absl::Milliseconds(300);
  options.drain_grace = absl::Seconds(15);
  auto supervisor = deploy::Supervisor::Create(&plans, cluster.get(), options);
  ASSERT_TRUE(supervisor.ok()) << supervisor.status();
  (*supervisor)->Start();

  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel(cluster->router_address(), grpc::InsecureChannelCredentials()));
  std::atomic<bool> stop_load{false};
  std::atomic<int> ok{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 8; ++t) {
    load.emplace_back([&, t] {
      std::mt19937 rng(1000 + t);
      while (!stop_load.load()) {
        std::vector<int32_t> prompt(1000);
        for (int32_t& token : prompt) token = static_cast<int32_t>(rng() % 700);
        testutil::StreamResult r =
            testutil::GenerateStream(*stub, prompt, /*max_tokens=*/1, absl::Seconds(60));
        (r.status.ok() ? ok : failed).fetch_add(1);
      }
    });
  }

  int max_decode = Running(*cluster, ClusterRole::kDecode);
  int max_prefill = 1;
  absl::Time deadline = absl::Now() + absl::Seconds(40);
  while (max_prefill < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    max_prefill = std::max(max_prefill, Running(*cluster, ClusterRole::kPrefill));
    max_decode = std::max(max_decode, Running(*cluster, ClusterRole::kDecode));
  }
  // A little longer under load: decode must still not grow.
  const absl::Time settle = absl::Now() + absl::Seconds(2);
  while (absl::Now() < settle) {
    absl::SleepFor(absl::Milliseconds(100));
    max_prefill = std::max(max_prefill, Running(*cluster, ClusterRole::kPrefill));
    max_decode = std::max(max_decode, Running(*cluster, ClusterRole::kDecode));
  }
  stop_load.store(true);
  for (auto& t : load) t.join();
  EXPECT_GE(max_prefill, 2) << Describe(plans);
  EXPECT_EQ(max_decode, 1) << Describe(plans);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(failed.load(), 0);

  // Idle: prefill goes back to its minimum once the down cooldown has passed.
  deadline = absl::Now() + absl::Seconds(40);
  while (Running(*cluster, ClusterRole::kPrefill) > 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
    max_decode = std::max(max_decode, Running(*cluster, ClusterRole::kDecode));
  }
  EXPECT_EQ(Running(*cluster, ClusterRole::kPrefill), 1) << Describe(plans);
  EXPECT_EQ(max_decode, 1);
  EXPECT_EQ(Running(*cluster, ClusterRole::kDecode), 1);

  auto plan = plans.GetPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->scaler(), "external");
  for (const auto& pool : plan->pools()) {
    if (pool.pool() == internal::v1::WORKER_ROLE_PREFILL) {
      EXPECT_EQ(pool.desired_replicas(), 1u);
      EXPECT_GE(pool.scale_ups(), 1u);
      EXPECT_GE(pool.scale_downs(), 1u);
    } else if (pool.pool() == internal::v1::WORKER_ROLE_DECODE) {
      EXPECT_EQ(pool.desired_replicas(), 1u);
      EXPECT_EQ(pool.scale_ups(), 0u);
    }
  }
  EXPECT_GE((*supervisor)->added(), 1);
  EXPECT_GE((*supervisor)->removed(), 1);

  // The workers the supervisor started belong to its thread: stop the cluster (they drain)
  // before the supervisor.
  EXPECT_TRUE(cluster->Stop(absl::Seconds(20)).ok());
  (*supervisor)->Stop();
}

}  // namespace
}  // namespace deepinfer
