// Prefix-cache-aware placement across real processes (deploy/local/local_cluster.h: the router
// with --placement=cache_aware, two prefill nodes, one decode node): the second turn of a
// conversation (the first turn's prompt and answer plus a new instruction) is prefilled on the
// prefill node that served the first turn, which then serves the shared prefix from its cache.
// The router learns what each node holds from the nodes' KV events and computes the prompt's
// block hashes itself (router/prompt_block_hashes.h).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "deploy/local/local_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "tests/cluster_test_util.h"

namespace deepinfer {
namespace {

using testutil::ClusterConfig;
using testutil::GenerateStream;
using testutil::StreamResult;

constexpr int kBlockSize = 4;  // ClusterConfig's

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng() % 700 + 1));
  return out;
}

TEST(ClusterPlacementTest, SecondTurnIsPrefilledWhereTheFirstTurnLeftItsPrefix) {
  deploy::LocalClusterConfig config = ClusterConfig("placement", /*prefill=*/2, /*decode=*/1,
                                                    /*colocated=*/false);
  config.router_flags.push_back("--placement=cache_aware");
  config.router_flags.push_back("--log_level=debug");  // placement decisions in router.log
  absl::StatusOr<std::unique_ptr<deploy::LocalCluster>> started =
      deploy::LocalCluster::Start(config);
  ASSERT_TRUE(started.ok()) << started.status();
  deploy::LocalCluster& cluster = **started;
  std::unique_ptr<v1::Inference::Stub> stub = v1::Inference::NewStub(
      grpc::CreateChannel(cluster.router_address(), grpc::InsecureChannelCredentials()));

  absl::StatusOr<int> p0 = cluster.FindWorker("prefill-0");
  absl::StatusOr<int> p1 = cluster.FindWorker("prefill-1");
  ASSERT_TRUE(p0.ok() && p1.ok());
  const int prefill[2] = {*p0, *p1};
  auto stats = [&](int i) {
    absl::StatusOr<internal::v1::WorkerStats> s = cluster.GetStats(prefill[i]);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.value_or(internal::v1::WorkerStats());
  };

  std::mt19937 rng(11);
  for (int session = 0; session < 2; ++session) {
    SCOPED_TRACE(absl::StrCat("session ", session));
    // Turn 1: a long shared context and a first instruction.
    std::vector<int32_t> turn1 = RandomTokens(rng, 160);
    const std::vector<int32_t> instruction1 = RandomTokens(rng, 7);
    turn1.insert(turn1.end(), instruction1.begin(), instruction1.end());
    const internal::v1::WorkerStats before[2] = {stats(0), stats(1)};
    const StreamResult r1 = GenerateStream(*stub, turn1, 4);
    ASSERT_TRUE(r1.status.ok()) << r1.status.error_message();
    ASSERT_EQ(r1.tokens.size(), 4u);
    const internal::v1::WorkerStats after1[2] = {stats(0), stats(1)};
    // Exactly one prefill node looked the prompt up: the one that prefilled it.
    const bool grew[2] = {after1[0].prefix_query_tokens() > before[0].prefix_query_tokens(),
                          after1[1].prefix_query_tokens() > before[1].prefix_query_tokens()};
    ASSERT_NE(grew[0], grew[1]) << "turn 1 should be prefilled by exactly one node";
    const int served = grew[0] ? 0 : 1;
    const int other = 1 - served;

    // The node's KV events reach the router with its next heartbeat (every 250 ms).
    absl::SleepFor(absl::Seconds(1));

    // Turn 2: turn 1's prompt and answer, then a new instruction.
    std::vector<int32_t> turn2 = turn1;
    turn2.insert(turn2.end(), r1.tokens.begin(), r1.tokens.end());
    const std::vector<int32_t> instruction2 = RandomTokens(rng, 6);
    turn2.insert(turn2.end(), instruction2.begin(), instruction2.end());
    const StreamResult r2 = GenerateStream(*stub, turn2, 4);
    ASSERT_TRUE(r2.status.ok()) << r2.status.error_message();
    const internal::v1::WorkerStats after2[2] = {stats(0), stats(1)};

    // The same node prefilled it, and served turn 1's full blocks from its cache.
    EXPECT_EQ(after2[served].prefix_query_tokens() - after1[served].prefix_query_tokens(),
              turn2.size());
    EXPECT_EQ(after2[other].prefix_query_tokens(), after1[other].prefix_query_tokens());
    const uint64_t hit = after2[served].prefix_hit_tokens() - after1[served].prefix_hit_tokens();
    const uint64_t cached = r2.usage.cached_prompt_tokens();
    EXPECT_EQ(cached, hit);
    EXPECT_GE(cached, turn1.size() - (kBlockSize - 1)) << "turn 1's full blocks";
    EXPECT_LT(cached, turn2.size());
    EXPECT_EQ(r2.usage.prompt_tokens(), turn2.size());
  }
  EXPECT_TRUE(cluster.Stop(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace deepinfer
