// LocalCluster against the real router, prefill_node and decode_node binaries (runfiles root is
// the working directory, so bin_dir is ".") on the tiny test model.
#include "deploy/local/local_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::deploy {
namespace {

using ::testing::HasSubstr;

LocalClusterConfig TestConfig(const std::string& name) {
  const char* tmp = getenv("TEST_TMPDIR");
  LocalClusterConfig config;
  config.bin_dir = ".";
  config.model_dir = "engine/testdata/models/llama";
  config.log_dir = absl::StrCat(tmp ? tmp : "/tmp", "/", name, ".", getpid());
  config.num_prefill = 1;
  config.num_decode = 1;
  config.kv_blocks = 64;
  config.block_size = 16;
  config.threads_per_worker = 1;
  config.router_flags = {"--heartbeat_interval=200ms", "--missed_heartbeats=3"};
  config.startup_timeout = absl::Seconds(60);
  return config;
}

TEST(LocalClusterTest, StartsServesStatsAddsRemovesAndStops) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(TestConfig("lifecycle"));
  ASSERT_TRUE(started.ok()) << started.status();
  LocalCluster& cluster = **started;

  EXPECT_THAT(cluster.router_address(), HasSubstr("127.0.0.1:"));
  EXPECT_TRUE(cluster.router().running);
  std::vector<ClusterProcessInfo> workers = cluster.workers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].name, "prefill-0");
  EXPECT_EQ(workers[0].role, ClusterRole::kPrefill);
  EXPECT_EQ(workers[1].name, "decode-0");
  EXPECT_EQ(workers[1].role, ClusterRole::kDecode);
  for (const ClusterProcessInfo& w : workers) {
    EXPECT_TRUE(w.running) << w.name;
    EXPECT_GT(w.pid, 0) << w.name;
    EXPECT_THAT(w.address, HasSubstr("127.0.0.1:")) << w.name;
  }

  absl::StatusOr<internal::v1::WorkerStats> prefill_stats = cluster.GetStats(0);
  ASSERT_TRUE(prefill_stats.ok()) << prefill_stats.status();
  EXPECT_EQ(prefill_stats->worker_id(), "prefill-0");
  EXPECT_EQ(prefill_stats->role(), internal::v1::WORKER_ROLE_PREFILL);
  EXPECT_EQ(prefill_stats->total_kv_blocks(), 64u);
  EXPECT_FALSE(prefill_stats->draining());
  absl::StatusOr<internal::v1::WorkerStats> decode_stats = cluster.GetStats(1);
  ASSERT_TRUE(decode_stats.ok()) << decode_stats.status();
  EXPECT_EQ(decode_stats->role(), internal::v1::WORKER_ROLE_DECODE);

  // Scale out, then drain the new worker: SIGTERM is a clean exit.
  absl::StatusOr<int> added = cluster.AddWorker(ClusterRole::kDecode);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 2);
  EXPECT_EQ(cluster.workers()[2].name, "decode-1");
  EXPECT_EQ(cluster.GetStats(2)->worker_id(), "decode-1");
  absl::StatusOr<ExitStatus> removed = cluster.RemoveWorker(2, absl::Seconds(20));
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_TRUE(removed->ok()) << removed->ToString();
  EXPECT_EQ(cluster.workers().size(), 2u);

  // A crash: the cluster reports it, and Stop names it.
  ASSERT_TRUE(cluster.Signal(0, SIGKILL).ok());
  absl::StatusOr<ExitStatus> killed = cluster.WaitExit(0, absl::Seconds(10));
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->signal, SIGKILL);
  EXPECT_FALSE(cluster.workers()[0].running);
  EXPECT_EQ(cluster.Signal(0, SIGTERM).code(), absl::StatusCode::kFailedPrecondition);

  absl::Status stopped = cluster.Stop(absl::Seconds(20));
  EXPECT_EQ(stopped.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(stopped.message(), HasSubstr("prefill-0: killed by signal 9"));
  EXPECT_THAT(stopped.message(), ::testing::Not(HasSubstr("decode-0")));
  EXPECT_THAT(stopped.message(), ::testing::Not(HasSubstr("router")));
  EXPECT_FALSE(cluster.router().running);
  EXPECT_TRUE(cluster.router().exit_status->ok());
  EXPECT_TRUE(cluster.Stop().ok());  // Idempotent.
}

TEST(LocalClusterTest, ColocatedDecodeOnlyClusterStartsAndStopsCleanly) {
  LocalClusterConfig config = TestConfig("colocated");
  config.num_prefill = 0;
  config.decode_can_prefill = true;
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(config);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_EQ((*started)->workers().size(), 1u);
  EXPECT_EQ((*started)->workers()[0].name, "decode-0");
  EXPECT_TRUE((*started)->Stop(absl::Seconds(20)).ok());
}

TEST(LocalClusterTest, WorkerThatCannotLoadTheModelFailsStartWithItsLog) {
  LocalClusterConfig config = TestConfig("bad_model");
  config.model_dir = "/nonexistent/model";
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(config);
  ASSERT_FALSE(started.ok());
  // The router loads the model too, so it is the first to fail.
  EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable) << started.status();
  EXPECT_THAT(started.status().message(), HasSubstr("router (pid"));
  EXPECT_THAT(started.status().message(), HasSubstr("/nonexistent/model"));
}

}  // namespace
}  // namespace deepinfer::deploy
