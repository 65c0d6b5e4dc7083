// The //decode_node:decode_node binary end to end: --help documents the decode flags, bad flags
// exit with status 2 naming the flag, and a standalone colocated node (--can_prefill) serves
// Decode.Generate with the reference greedy output, then drains and exits 0 on SIGTERM.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process_lifecycle.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"

extern char** environ;

namespace {

constexpr char kBinary[] = "decode_node/decode_node";
constexpr char kModel[] = "engine/testdata/models/llama";

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};

CommandResult RunBinary(const std::string& args) {
  CommandResult run;
  const std::string cmd = absl::StrCat(kBinary, " ", args, " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) run.output.append(buf.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

TEST(DecodeNodeMainTest, HelpDocumentsTheFlags) {
  const CommandResult r = RunBinary("--help");
  for (const char* flag : {"--can_prefill", "--prefill_timeout", "--model", "--router",
                           "--kv_transport", "--listen", "--port_file"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << "\n" << r.output;
  }
}

TEST(DecodeNodeMainTest, BadFlagsExitWithStatus2) {
  CommandResult r = RunBinary(absl::StrCat("--model ", kModel, " --prefill_timeout=0s"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prefill_timeout"), std::string::npos) << r.output;
  r = RunBinary(absl::StrCat("--model ", kModel, " --kv_blocks=0"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--kv_blocks"), std::string::npos) << r.output;
}

TEST(DecodeNodeMainTest, ServesColocatedRequestsAndDrainsOnSigterm) {
  const std::string port_file =
      absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                   "/decode_node_port_", getpid());
  std::vector<std::string> args = {kBinary,          "--model",        kModel,
                                   "--can_prefill",  "--kv_transport", "loopback",
                                   "--kv_blocks=64", "--block_size=4", "--threads=1",
                                   "--port_file",    port_file,        "--log_level=warn"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, kBinary, nullptr, nullptr, argv.data(), environ), 0);
  absl::StatusOr<int> port = deepinfer::ReadPortFile(port_file, absl::Seconds(30));
  if (!port.ok()) kill(pid, SIGKILL);
  ASSERT_TRUE(port.ok()) << port.status();

  auto stub = deepinfer::internal::v1::Decode::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials()));
  deepinfer::internal::v1::DecodeRequest request;
  request.set_request_id("main-1");
  const std::vector<int32_t> prompt = {760, 39, 68, 410, 78, 311};
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(6);
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto reader = stub->Generate(&context, request);
  std::vector<int32_t> got;
  deepinfer::v1::GenerateChunk chunk;
  while (reader->Read(&chunk)) {
    for (uint32_t t : chunk.token_ids()) got.push_back(static_cast<int32_t>(t));
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();

  auto model = deepinfer::engine::Model::Load(kModel, deepinfer::engine::ModelOptions{1});
  ASSERT_TRUE(model.ok()) << model.status();
  deepinfer::engine::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 6;
  sp.ignore_eos = true;
  auto ref = deepinfer::engine::GenerateOne(**model, prompt, sp, {});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<int32_t> want;
  for (const auto& s : ref->steps) want.push_back(s.token);
  EXPECT_EQ(got, want);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
}

}  // namespace
