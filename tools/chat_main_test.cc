// //tools:chat as a process against an in-process Inference service that streams fixed chunks:
// request building from flags, streamed and buffered output, the summary line and the usage
// details after it (prefix cache, drafts, the cluster's timing), JSON output, a follow-up turn,
// and the error path.
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/deepinfer/v1/inference.grpc.pb.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Streams "Hel" (1 token), "lo" (2 tokens) and a final chunk with usage (5 drafts, 3 accepted;
// timing: 1 ms queued, 2 ms prefill, first token at 4 ms, 10 ms in all), 20 ms apart; a user
// message "fail" gets INVALID_ARGUMENT instead.
class ScriptedInference final : public v1::Inference::Service {
 public:
  grpc::Status Chat(grpc::ServerContext*, const v1::ChatRequest* request,
                    grpc::ServerWriter<v1::ChatChunk>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      last_request_ = *request;
      ++requests_;
    }
    if (request->messages_size() > 0 && request->messages(0).content_size() > 0 &&
        request->messages(request->messages_size() - 1).content(0).text() == "fail") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "messages[0]: rejected");
    }
    v1::ChatChunk chunk;
    chunk.set_request_id("req-1");
    chunk.add_token_ids(10);
    chunk.set_text_delta("Hel");
    writer->Write(chunk);
    std::string pace_path;
    {
      absl::MutexLock lock(&mu_);
      pace_path = pace_path_;
    }
    if (!pace_path.empty()) {
      // The client has read the first chunk once it printed it.
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (ReadFile(pace_path).find("Hel") == std::string::npos && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
    chunk.clear_token_ids();
    chunk.add_token_ids(11);
    chunk.add_token_ids(12);
    chunk.set_text_delta("lo");
    writer->Write(chunk);
    absl::SleepFor(absl::Milliseconds(20));
    v1::ChatChunk last;
    last.set_request_id("req-1");
    last.set_finish_reason(v1::FINISH_REASON_LENGTH);
    last.mutable_usage()->set_prompt_tokens(7);
    last.mutable_usage()->set_cached_prompt_tokens(4);
    last.mutable_usage()->set_completion_tokens(3);
    last.mutable_usage()->set_draft_tokens(5);
    last.mutable_usage()->set_accepted_draft_tokens(3);
    v1::Timing* timing = last.mutable_usage()->mutable_timing();
    timing->set_queued_us(1000);
    timing->set_prefill_us(2000);
    timing->set_first_token_us(4000);
    timing->set_total_us(10000);
    writer->Write(last);
    return grpc::Status::OK;
  }

  v1::ChatRequest last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }

  int requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

  // From now on the second chunk is written 20 ms after the client printed the first to `path`
  // (its output), not 20 ms after the first was written: the gap the client measures between
  // reading them is then at least 20 ms however late its threads run (a client that read the
  // first chunk late, after both had arrived, measured ~0).
  void PaceByClientOutput(const std::string& path) {
    absl::MutexLock lock(&mu_);
    pace_path_ = path;
  }

 private:
  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  absl::Mutex mu_;
  v1::ChatRequest last_request_ ABSL_GUARDED_BY(mu_);
  int requests_ ABSL_GUARDED_BY(mu_) = 0;
  std::string pace_path_ ABSL_GUARDED_BY(mu_);
};

class ChatMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options;
    options.services = {&service_};
    auto server = GrpcServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->SetServing(true);
  }

  // Runs the chat binary with `args`; returns its exit code and fills `output`.
  // The output file of the `run`th RunChat call.
  static std::string LogPath(int run) {
    const char* tmp = getenv("TEST_TMPDIR");
    return absl::StrCat(tmp ? tmp : "/tmp", "/chat.", run, ".log");
  }

  int RunChat(std::vector<std::string> args, std::string* output) {
    const std::string log = LogPath(++runs_);
    SubprocessOptions options;
    options.argv = {"tools/chat", absl::StrCat("--router=", server_->address())};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.log_path = log;
    auto chat = Subprocess::Start(options);
    EXPECT_TRUE(chat.ok()) << chat.status();
    if (!chat.ok()) return -1;
    absl::StatusOr<ExitStatus> status = (*chat)->Wait(absl::Seconds(30));
    EXPECT_TRUE(status.ok()) << status.status();
    std::ifstream in(log);
    output->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return status.ok() && status->exited ? status->exit_code : -1;
  }

  ScriptedInference service_;
  std::unique_ptr<GrpcServer> server_;
  int runs_ = 0;
};

TEST_F(ChatMainTest, StreamsTextAndPrintsTheSummary) {
  std::string out;
  ASSERT_EQ(RunChat({"--system=Be brief", "--message=Hi", "--max_tokens=3", "--temperature=0.5",
                     "--top_p=0.9", "--seed=7", "--model=m"},
                    &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("Hello\n"));
  EXPECT_THAT(out, HasSubstr("prompt 7 tokens (4 cached), completion 3 tokens, finish LENGTH"));
  EXPECT_THAT(out, HasSubstr("| TTFT "));
  EXPECT_THAT(out, HasSubstr("| ITL mean "));
  EXPECT_THAT(out, HasSubstr("tokens/s"));
  EXPECT_THAT(out, HasSubstr("-- prefix cache: 4 of 7 prompt tokens reused"));
  EXPECT_THAT(out, HasSubstr("-- speculative decoding: 5 draft tokens verified, 3 accepted (60%)"));
  // Routing and first token: 4 - 1 - 2 ms; decode: 10 - 4 ms.
  EXPECT_THAT(out, HasSubstr("-- where the time went (cluster): queue 1.0 ms, prefill + KV "
                             "transfer 2.0 ms, routing and first token 1.0 ms, decode 6.0 ms, "
                             "total 10.0 ms"));
  EXPECT_EQ(service_.requests(), 1);

  v1::ChatRequest request = service_.last_request();
  EXPECT_EQ(request.model(), "m");
  ASSERT_EQ(request.messages_size(), 2);
  EXPECT_EQ(request.messages(0).role(), "system");
  EXPECT_EQ(request.messages(0).content(0).text(), "Be brief");
  EXPECT_EQ(request.messages(1).role(), "user");
  EXPECT_EQ(request.messages(1).content(0).text(), "Hi");
  EXPECT_EQ(request.sampling().max_tokens(), 3u);
  EXPECT_FLOAT_EQ(request.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(request.sampling().top_p(), 0.9f);
  EXPECT_EQ(request.sampling().seed(), 7u);
}

TEST_F(ChatMainTest, JsonPrintsChunksAndASummaryWithTimings) {
  service_.PaceByClientOutput(LogPath(runs_ + 1));
  std::string out;
  ASSERT_EQ(RunChat({"--messages_json=[{\"role\":\"user\",\"content\":\"Q\"},"
                     "{\"role\":\"assistant\",\"content\":\"A\"},"
                     "{\"role\":\"user\",\"content\":\"Q2\"}]",
                     "--json"},
                    &out),
            0)
      << out;
  std::vector<nlohmann::json> lines;
  std::istringstream stream(out);
  for (std::string line; std::getline(stream, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 4u) << out;
  EXPECT_EQ(lines[0]["text_delta"], "Hel");
  EXPECT_EQ(lines[1]["token_ids"].size(), 2u);
  EXPECT_EQ(lines[2]["finish_reason"], "FINISH_REASON_LENGTH");
  const nlohmann::json& summary = lines[3];
  EXPECT_EQ(summary["completion_tokens"], 3);
  EXPECT_EQ(summary["cached_prompt_tokens"], 4);
  EXPECT_EQ(summary["finish_reason"], "LENGTH");
  EXPECT_EQ(summary["draft_tokens"], 5);
  EXPECT_EQ(summary["accepted_draft_tokens"], 3);
  EXPECT_DOUBLE_EQ(summary["cluster_timing_ms"]["queued"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(summary["cluster_timing_ms"]["prefill"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(summary["cluster_timing_ms"]["first_token"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(summary["cluster_timing_ms"]["total"].get<double>(), 10.0);
  // Two gaps of >= 20 ms by construction: one ITL sample (between the two token chunks), >= 20 ms
  // as the client measures it (PaceByClientOutput).
  EXPECT_GE(summary["itl_ms"]["max"].get<double>(), 15.0);
  EXPECT_GT(summary["ttft_ms"].get<double>(), 0.0);
  EXPECT_GE(summary["e2e_ms"].get<double>(), summary["ttft_ms"].get<double>() + 15.0);

  v1::ChatRequest request = service_.last_request();
  ASSERT_EQ(request.messages_size(), 3);
  EXPECT_EQ(request.messages(1).role(), "assistant");
  EXPECT_EQ(request.messages(2).content(0).text(), "Q2");
  EXPECT_FALSE(request.sampling().has_top_p());  // Not given: the model's default.
  EXPECT_FALSE(request.sampling().has_seed());
  EXPECT_EQ(request.sampling().max_tokens(), 64u);
}

TEST_F(ChatMainTest, BufferedOutputWithoutStream) {
  std::string out;
  ASSERT_EQ(RunChat({"--message=Hi", "--stream=false"}, &out), 0) << out;
  EXPECT_EQ(out.rfind("Hello\n", 0), 0u) << out;
}

TEST_F(ChatMainTest, FollowUpSendsTheFirstAnswerAsHistory) {
  std::string out;
  ASSERT_EQ(RunChat({"--system=S", "--message=Hi", "--follow_up=And then?", "--request_id=r"},
                    &out),
            0)
      << out;
  EXPECT_EQ(service_.requests(), 2);
  v1::ChatRequest request = service_.last_request();
  ASSERT_EQ(request.messages_size(), 4);
  EXPECT_EQ(request.messages(0).content(0).text(), "S");
  EXPECT_EQ(request.messages(1).content(0).text(), "Hi");
  EXPECT_EQ(request.messages(2).role(), "assistant");
  EXPECT_EQ(request.messages(2).content(0).text(), "Hello");
  EXPECT_EQ(request.messages(3).role(), "user");
  EXPECT_EQ(request.messages(3).content(0).text(), "And then?");
  EXPECT_EQ(request.request_id(), "r-2");
  // Both turns print their answer and summary; the second after its own prompt line.
  const size_t second = out.find("\nuser> And then?\nassistant> Hello\n");
  ASSERT_NE(second, std::string::npos) << out;
  EXPECT_NE(out.rfind("-- prompt 7 tokens (4 cached)", second), std::string::npos) << out;
  EXPECT_NE(out.find("-- prompt 7 tokens (4 cached)", second), std::string::npos) << out;
}

TEST_F(ChatMainTest, FollowUpIsNotSentAfterAFailedTurn) {
  std::string out;
  EXPECT_EQ(RunChat({"--message=fail", "--follow_up=again"}, &out), 1);
  EXPECT_EQ(service_.requests(), 1);
  EXPECT_THAT(out, Not(HasSubstr("user> again")));
}

TEST_F(ChatMainTest, ServerErrorsPrintTheCodeAndExitOne) {
  std::string out;
  EXPECT_EQ(RunChat({"--message=fail"}, &out), 1);
  EXPECT_THAT(out, HasSubstr("error: INVALID_ARGUMENT: messages[0]: rejected"));
}

TEST_F(ChatMainTest, BadFlagsExitTwo) {
  std::string out;
  EXPECT_EQ(RunChat({}, &out), 2);
  EXPECT_THAT(out, HasSubstr("--message"));
  EXPECT_EQ(RunChat({"--messages_json=[{\"role\":1}]"}, &out), 2);
  EXPECT_THAT(out, HasSubstr("--messages_json[0]"));
  EXPECT_EQ(RunChat({"--message=x", "--max_tokens=0"}, &out), 2);
  EXPECT_THAT(out, HasSubstr("--max_tokens"));
}

}  // namespace
}  // namespace deepinfer
