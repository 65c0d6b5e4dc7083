// The load generator against a real gRPC server implementing deepinfer.v1.Inference that streams
// a fixed answer with known delays.
#include "tools/bench/runner.h"

#include <atomic>
#include <mutex>
#include <thread>

#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

namespace deepinfer::bench {
namespace {

class FakeInference final : public v1::Inference::Service {
 public:
  grpc::Status Chat(grpc::ServerContext*, const v1::ChatRequest* req,
                    grpc::ServerWriter<v1::ChatChunk>* writer) override {
    const int now = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      requests_.push_back(*req);
    }
    absl::SleepFor(absl::Milliseconds(40));  // "prefill"
    const uint32_t n = req->sampling().max_tokens();
    for (uint32_t i = 0; i < n; ++i) {
      v1::ChatChunk c;
      c.add_token_ids(5);
      c.set_text_delta("x");
      if (i + 1 == n) {
        c.set_finish_reason(v1::FINISH_REASON_LENGTH);
        c.mutable_usage()->set_prompt_tokens(10 * req->messages_size());
        c.mutable_usage()->set_cached_prompt_tokens(5);
        c.mutable_usage()->set_completion_tokens(n);
      }
      writer->Write(c);
      absl::SleepFor(absl::Milliseconds(5));
    }
    --in_flight_;
    return grpc::Status::OK;
  }
  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* resp) override {
    resp->add_models()->set_id("m");
    return grpc::Status::OK;
  }
  std::vector<v1::ChatRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::atomic<int> in_flight_{0}, max_in_flight_{0};

 private:
  std::mutex mu_;
  std::vector<v1::ChatRequest> requests_;
};

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions o;
    o.services = {&service_};
    auto s = GrpcServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    server_->SetServing(true);
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }
  FakeInference service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(RunnerTest, ClosedLoopMultiTurnRecordsEveryTokenAndResendsAnswers) {
  WorkloadOptions w;
  w.kind = "coding";
  w.sessions = 4;
  w.coding_turns = 3;
  w.coding_answer_tokens = 4;
  auto sessions = GenerateWorkload(w);
  ASSERT_TRUE(sessions.ok());
  RunnerOptions o;
  o.target = server_->address();
  o.mode = "closed";
  o.concurrency = 2;
  o.warmup_sessions = 1;
  auto records = RunWorkload(*sessions, o);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 12u);
  EXPECT_LE(service_.max_in_flight_.load(), 2);
  int warm = 0;
  for (const RequestRecord& r : *records) {
    EXPECT_TRUE(r.ok) << r.error;
    warm += r.warmup;
    EXPECT_EQ(r.completion_tokens, 4);
    ASSERT_EQ(r.chunk_times_s.size(), 4u);
    EXPECT_GE(r.chunk_times_s[0] - r.send_s, 0.035);  // the server's 40 ms "prefill"
    EXPECT_GE(r.end_s, r.chunk_times_s.back());
  }
  EXPECT_EQ(warm, 3);  // one session of three turns
  // Turn 3 of a session carries system + 2 * (user, assistant) + user, and the assistant
  // messages are the answers the server streamed.
  int third_turns = 0;
  for (const v1::ChatRequest& req : service_.requests()) {
    if (req.messages_size() != 6) continue;
    ++third_turns;
    EXPECT_EQ(req.messages(2).role(), "assistant");
    EXPECT_EQ(req.messages(2).content(0).text(), "xxxx");
    EXPECT_TRUE(req.sampling().ignore_eos());
  }
  EXPECT_EQ(third_turns, 4);
  Summary s = Summarize(*records, 1000, 100);
  EXPECT_EQ(s.completed, 9);
  EXPECT_GT(s.ttft_ms.mean, 35);
}

TEST_F(RunnerTest, OpenLoopRunsSessionsConcurrently) {
  WorkloadOptions w;
  w.sessions = 8;
  w.chat_output_tokens = 10;
  w.sigma = 0;
  auto sessions = GenerateWorkload(w);
  ASSERT_TRUE(sessions.ok());
  RunnerOptions o;
  o.target = server_->address();
  o.mode = "open";
  o.rate = 200;  // far faster than one request's ~90 ms: they must overlap
  o.warmup_sessions = 0;
  auto records = RunWorkload(*sessions, o);
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->size(), 8u);
  EXPECT_GT(service_.max_in_flight_.load(), 1);
}

TEST(RunnerOptionsTest, BadOptionsAndUnreachableRouter) {
  std::vector<SessionPlan> one(1);
  one[0].turns.push_back({"hi", 1});
  RunnerOptions o;
  o.mode = "sideways";
  EXPECT_EQ(RunWorkload(one, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.mode = "open";
  o.rate = 0;
  EXPECT_NE(RunWorkload(one, o).status().message().find("rate:"), std::string::npos);
  o.rate = 1;
  o.target = "127.0.0.1:1";  // nothing listens there
  EXPECT_EQ(RunWorkload(one, o).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deepinfer::bench
