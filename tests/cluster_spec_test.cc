// Speculative decoding across the prefill/decode split, as real processes on loopback
// (deploy/local/local_cluster.h; KV over UCX shared memory):
//   * with every worker started with --speculative=ngram --num_speculative_tokens=4, greedy
//     outputs through the router equal engine::GenerateOne, disaggregated (the decode node's
//     first draft is anchored on the prefill node's token), and the last chunk's usage relays the
//     decode node's draft counts (some accepted);
//   * a worker whose speculative flags differ from its model's other workers is refused at
//     Register (FAILED_PRECONDITION naming the field), so it never turns SERVING.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "deploy/local/local_cluster.h"
#include "engine/model.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "tests/cluster_test_util.h"

namespace deepinfer {
namespace {

using testutil::ClusterConfig;
using testutil::GenerateStream;
using testutil::Reference;
using testutil::WaitNoBlocksInUse;

constexpr char kSpecFlags[] = "--speculative=ngram";
constexpr char kSpecK4[] = "--num_speculative_tokens=4";

// Prompts with repetition (a short motif repeated, then a tail), so n-gram drafts find matches.
std::vector<std::vector<int32_t>> RepetitivePrompts(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> motif(2 + rng() % 5);
    for (int32_t& t : motif) t = static_cast<int32_t>(rng() % 700);
    std::vector<int32_t> p;
    const int repeats = 2 + static_cast<int>(rng() % 4);
    for (int r = 0; r < repeats; ++r) p.insert(p.end(), motif.begin(), motif.end());
    const int tail = static_cast<int>(rng() % 4);
    for (int j = 0; j < tail; ++j) p.push_back(static_cast<int32_t>(rng() % 700));
    prompts.push_back(p);
  }
  return prompts;
}

TEST(ClusterSpecTest, SpeculatingDecodeNodeMatchesGenerateAndRelaysDraftUsage) {
  auto model = engine::Model::Load(testutil::kModelDir, engine::ModelOptions{1});
  ASSERT_TRUE(model.ok()) << model.status();
  deploy::LocalClusterConfig config = ClusterConfig("spec", 1, 1, /*colocated=*/false);
  for (auto* flags : {&config.prefill_flags, &config.decode_flags}) {
    flags->push_back(kSpecFlags);
    flags->push_back(kSpecK4);
  }
  auto cluster = deploy::LocalCluster::Start(config);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel((*cluster)->router_address(), grpc::InsecureChannelCredentials()));

  constexpr int kMaxTokens = 24;
  uint64_t drafts = 0;
  uint64_t accepted = 0;
  for (const std::vector<int32_t>& prompt : RepetitivePrompts(6, 61)) {
    testutil::StreamResult r = GenerateStream(*stub, prompt, kMaxTokens);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Reference(**model, prompt, kMaxTokens));
    EXPECT_EQ(r.finish_reason, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.usage.completion_tokens(), static_cast<uint32_t>(kMaxTokens));
    EXPECT_LE(r.usage.accepted_draft_tokens(), r.usage.draft_tokens());
    drafts += r.usage.draft_tokens();
    accepted += r.usage.accepted_draft_tokens();
  }
  EXPECT_GT(accepted, 0u);

  EXPECT_TRUE(WaitNoBlocksInUse(**cluster, absl::Seconds(10)).ok());

  // The decode node speculated (and its stats agree with the relayed usage); the prefill node
  // computed prompts only.
  for (const deploy::ClusterProcessInfo& w : (*cluster)->workers()) {
    absl::StatusOr<int> index = (*cluster)->FindWorker(w.name);
    ASSERT_TRUE(index.ok()) << index.status();
    absl::StatusOr<internal::v1::WorkerStats> s = (*cluster)->GetStats(*index);
    // The engine counts a step's drafts just after that step's outputs went out.
    for (int i = 0; i < 100 && s.ok() && w.role == deploy::ClusterRole::kDecode &&
                    s->spec_verified_tokens() < drafts;
         ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      s = (*cluster)->GetStats(*index);
    }
    ASSERT_TRUE(s.ok()) << s.status();
    if (w.role == deploy::ClusterRole::kDecode) {
      EXPECT_EQ(s->spec_verified_tokens(), drafts) << s->DebugString();
      EXPECT_EQ(s->spec_accepted_tokens(), accepted) << s->DebugString();
    } else {
      EXPECT_EQ(s->spec_draft_tokens(), 0u) << s->DebugString();
    }
  }
  EXPECT_TRUE((*cluster)->Stop(absl::Seconds(20)).ok());
}

TEST(ClusterSpecTest, WorkerWithADifferentSpeculativeConfigIsRefused) {
  deploy::LocalClusterConfig config = ClusterConfig("spec-mismatch", 1, 1, /*colocated=*/false);
  config.prefill_flags = {kSpecFlags, "--num_speculative_tokens=2"};
  config.decode_flags.push_back(kSpecFlags);
  config.decode_flags.push_back(kSpecK4);
  // Whichever registers second is refused, keeps retrying, and never turns SERVING.
  config.startup_timeout = absl::Seconds(15);
  auto cluster = deploy::LocalCluster::Start(config);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kDeadlineExceeded) << cluster.status();
  EXPECT_TRUE(absl::StrContains(cluster.status().message(), "FAILED_PRECONDITION"))
      << cluster.status();
  EXPECT_TRUE(absl::StrContains(cluster.status().message(),
                                "worker.speculative.num_speculative_tokens: expected "))
      << cluster.status();
}

}  // namespace
}  // namespace deepinfer
