// The disaggregated cluster end to end, as real processes on loopback (deploy/local/
// local_cluster.h starts //router:router, //prefill_node:prefill_node and
// //decode_node:decode_node; KV moves between them over UCX shared memory):
//   * greedy outputs through the cluster equal engine::GenerateOne (the library behind
//     //engine:generate) on the same checkpoint, for many concurrent requests sharing prefixes,
//     disaggregated and colocated;
//   * malformed requests get INVALID_ARGUMENT naming the field and the cluster keeps serving;
//   * streams cancelled at random points leave no KV block reserved or held on any node.
// Node failures (SIGKILL mid-stream / mid-transfer) and drains are in cluster_faults_test.cc.
#include <atomic>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "deploy/local/local_cluster.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/model_assets.h"
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

class ClusterE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = engine::Model::Load(testutil::kModelDir, engine::ModelOptions{1});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
    auto cluster = deploy::LocalCluster::Start(ClusterConfig("e2e", 1, 1, false));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop(absl::Seconds(20)).ok());
    }
    delete cluster_;
    delete model_;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(cluster_->router_address(), grpc::InsecureChannelCredentials()));
  }

  static engine::Model* model_;
  static deploy::LocalCluster* cluster_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};
engine::Model* ClusterE2eTest::model_ = nullptr;
deploy::LocalCluster* ClusterE2eTest::cluster_ = nullptr;

// Prompts sharing prefixes of several lengths (block size 4), plus unrelated ones.
std::vector<std::vector<int32_t>> Prompts() {
  std::mt19937 rng(7);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % 700));
    return t;
  };
  std::vector<std::vector<int32_t>> out;
  const std::vector<int32_t> shared = random_tokens(37);
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + 8 + 4 * i);
    auto tail = random_tokens(1 + i % 5);
    p.insert(p.end(), tail.begin(), tail.end());
    out.push_back(p);
  }
  for (int i = 0; i < 6; ++i) out.push_back(random_tokens(3 + 11 * i));
  out.push_back(shared);  // exactly the shared prefix, twice: the second is a full cache hit
  out.push_back(shared);
  return out;
}

TEST_F(ClusterE2eTest, ConcurrentGreedyOutputsEqualGenerate) {
  const auto prompts = Prompts();
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(Reference(*model_, p, 12));
  for (int round = 0; round < 2; ++round) {  // round 2 hits the prefix caches
    std::vector<testutil::StreamResult> got(prompts.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i) {
      threads.emplace_back([&, i] { got[i] = GenerateStream(*stub_, prompts[i], 12); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << "round " << round << " prompt " << i << ": "
                                      << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, want[i]) << "round " << round << " prompt " << i;
      EXPECT_EQ(got[i].finish_reason, v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(got[i].usage.prompt_tokens(), prompts[i].size());
      EXPECT_EQ(got[i].usage.completion_tokens(), 12u);
      // Round 2: every prompt with a full block before its last token hit a prefix cache
      // (block size 4).
      if (round == 1 && prompts[i].size() > 4) {
        EXPECT_GT(got[i].usage.cached_prompt_tokens(), 0u) << i;
      }
    }
  }
  ASSERT_TRUE(WaitNoBlocksInUse(*cluster_, absl::Seconds(10)).ok());
}

TEST_F(ClusterE2eTest, ChatUsesTheTemplateAndMatchesGenerate) {
  auto assets = engine::ModelAssets::Load(testutil::kModelDir);
  ASSERT_TRUE(assets.ok());
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  messages.push_back({{"role", "system"}, {"content", "You are terse."}});
  messages.push_back({{"role", "user"}, {"content", "Move the login button to the top right."}});
  auto ids = (*assets)->RenderAndTokenize(messages, true);
  ASSERT_TRUE(ids.ok());
  const std::vector<int32_t> want = Reference(*model_, *ids, 10);

  v1::ChatRequest req;
  for (const auto& m : messages) {
    auto* msg = req.add_messages();
    msg->set_role(m["role"].get<std::string>());
    msg->add_content()->set_text(m["content"].get<std::string>());
  }
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(10);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub_->Chat(&ctx, req);
  v1::ChatChunk chunk;
  std::vector<int32_t> got;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&chunk)) {
    for (uint32_t t : chunk.token_ids()) got.push_back(static_cast<int32_t>(t));
    text += chunk.text_delta();
    if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish = chunk.finish_reason();
  }
  grpc::Status st = reader->Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(got, want);
  EXPECT_EQ(finish, v1::FINISH_REASON_LENGTH);
  auto decoded = (*assets)->tokenizer().Decode(want, /*skip_special_tokens=*/true);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(text, *decoded);
}

TEST_F(ClusterE2eTest, MalformedRequestsAreInvalidArgumentAndTheClusterKeepsServing) {
  struct Case {
    std::string field;
    std::function<void(v1::ChatRequest*)> mutate;
  };
  const std::vector<Case> chat_cases = {
      {"messages", [](v1::ChatRequest* r) { r->clear_messages(); }},
      {"messages[0].role", [](v1::ChatRequest* r) { r->mutable_messages(0)->set_role("robot"); }},
      {"messages[0].content", [](v1::ChatRequest* r) { r->mutable_messages(0)->clear_content(); }},
      {"sampling.top_p", [](v1::ChatRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }},
      {"sampling.temperature",
       [](v1::ChatRequest* r) { r->mutable_sampling()->set_temperature(-1.0f); }},
      {"sampling.top_k", [](v1::ChatRequest* r) { r->mutable_sampling()->set_top_k(-7); }},
      {"sampling.max_tokens",
       [](v1::ChatRequest* r) { r->mutable_sampling()->set_max_tokens(1000000); }},
      {"sampling.stop_token_ids",
       [](v1::ChatRequest* r) { r->mutable_sampling()->add_stop_token_ids(100000); }},
      {"priority", [](v1::ChatRequest* r) { r->set_priority(1000); }},
      {"request_id", [](v1::ChatRequest* r) { r->set_request_id(std::string(200, 'x')); }},
      {"model", [](v1::ChatRequest* r) { r->set_model("no-such-model"); }},
      {"messages[0].content[0].image",
       [](v1::ChatRequest* r) {
         r->mutable_messages(0)->mutable_content(0)->mutable_image()->set_url("http://x/y.png");
       }},
  };
  for (const Case& c : chat_cases) {
    v1::ChatRequest req;
    auto* m = req.add_messages();
    m->set_role("user");
    m->add_content()->set_text("hello");
    req.mutable_sampling()->set_max_tokens(4);
    c.mutate(&req);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub_->Chat(&ctx, req);
    v1::ChatChunk chunk;
    while (reader->Read(&chunk)) {
    }
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field << ": "
                                                                  << st.error_message();
    EXPECT_NE(st.error_message().find(c.field), std::string::npos)
        << "expected the message to name " << c.field << ", got: " << st.error_message();
  }
  // Generate: token ids out of the vocabulary, and none at all.
  for (const auto& [field, prompt] :
       std::vector<std::pair<std::string, std::vector<int32_t>>>{{"prompt_token_ids[1]", {5, 5000}},
                                                                 {"prompt_token_ids", {}}}) {
    auto r = GenerateStream(*stub_, prompt, 4);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(r.status.error_message().find(field), std::string::npos) << r.status.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::AbortRequest req;
    v1::AbortResponse resp;
    grpc::Status st = stub_->Abort(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("request_id"), std::string::npos);
  }
  // Still serving.
  auto ok = GenerateStream(*stub_, {1, 2, 3, 4, 5}, 6);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, Reference(*model_, {1, 2, 3, 4, 5}, 6));
}

TEST_F(ClusterE2eTest, RandomCancelsLeaveNoBlockReservedOrHeld) {
  std::mt19937 rng(11);
  std::vector<std::thread> threads;
  std::atomic<int> cancelled{0};
  for (int i = 0; i < 24; ++i) {
    const int prompt_len = 1 + static_cast<int>(rng() % 600);
    const int cancel_after_us = static_cast<int>(rng() % 40000);
    std::vector<int32_t> prompt;
    for (int k = 0; k < prompt_len; ++k) prompt.push_back(static_cast<int32_t>(rng() % 700));
    threads.emplace_back([&, prompt, cancel_after_us] {
      v1::GenerateRequest req;
      for (int32_t t : prompt) req.add_prompt_token_ids(t);
      req.mutable_sampling()->set_temperature(0);
      req.mutable_sampling()->set_max_tokens(400);
      req.mutable_sampling()->set_ignore_eos(true);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = stub_->Generate(&ctx, req);
      std::thread canceller([&] {
        absl::SleepFor(absl::Microseconds(cancel_after_us));
        ctx.TryCancel();
      });
      v1::GenerateChunk chunk;
      while (reader->Read(&chunk)) {
      }
      grpc::Status st = reader->Finish();
      canceller.join();
      if (st.error_code() == grpc::StatusCode::CANCELLED) ++cancelled;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(cancelled.load(), 0);
  absl::Status clean = WaitNoBlocksInUse(*cluster_, absl::Seconds(15));
  EXPECT_TRUE(clean.ok()) << clean;
  auto ok = GenerateStream(*stub_, {9, 8, 7}, 5);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens, Reference(*model_, {9, 8, 7}, 5));
}

TEST(ClusterColocatedTest, DecodeNodesPrefillThemselvesWithIdenticalOutputs) {
  auto model = engine::Model::Load(testutil::kModelDir, engine::ModelOptions{1});
  ASSERT_TRUE(model.ok());
  auto cluster = deploy::LocalCluster::Start(ClusterConfig("colocated", 0, 2, true));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto stub = v1::Inference::NewStub(
      grpc::CreateChannel((*cluster)->router_address(), grpc::InsecureChannelCredentials()));
  const auto prompts = Prompts();
  std::vector<testutil::StreamResult> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = GenerateStream(*stub, prompts[i], 8); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, Reference(**model, prompts[i], 8)) << i;
  }
  // Both decode nodes took work.
  for (int w = 0; w < 2; ++w) {
    auto stats = (*cluster)->GetStats(w);
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->requests_ok(), 0u) << "decode-" << w;
  }
  EXPECT_TRUE((*cluster)->Stop(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace deepinfer
