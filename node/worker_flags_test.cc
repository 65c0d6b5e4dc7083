#include "node/worker_flags.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "gtest/gtest.h"

namespace deepinfer::node {
namespace {

class WorkerFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { absl::SetFlag(&FLAGS_model, "engine/testdata/models/llama"); }
  absl::FlagSaver saver_;
};

TEST_F(WorkerFlagsTest, DefaultsBecomeOptions) {
  absl::SetFlag(&FLAGS_kv_transport, "loopback");
  absl::SetFlag(&FLAGS_drain_timeout, absl::Milliseconds(1500));
  absl::SetFlag(&FLAGS_router, "127.0.0.1:7000");
  auto o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->role, internal::v1::WORKER_ROLE_DECODE);
  EXPECT_EQ(o->listen_address, "127.0.0.1:0");
  EXPECT_EQ(o->router_address, "127.0.0.1:7000");
  EXPECT_EQ(o->model_path, "engine/testdata/models/llama");
  EXPECT_EQ(o->kv_blocks, 4096);
  EXPECT_EQ(o->block_size, 16);
  EXPECT_EQ(o->kv_backend, kv_transfer::Backend::kLoopback);
  EXPECT_EQ(o->drain_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(o->metrics_listen, "");  // off
  absl::SetFlag(&FLAGS_metrics_listen, "0.0.0.0:9091");
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->metrics_listen, "0.0.0.0:9091");
  EXPECT_FALSE(o->speculative.enabled);  // off by default
  EXPECT_EQ(o->device, "cpu");
  EXPECT_EQ(o->overlap, "auto");
  absl::SetFlag(&FLAGS_overlap, "off");
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->overlap, "off");
  for (const char* device : {"cuda", "auto"}) {
    absl::SetFlag(&FLAGS_device, device);
    o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_PREFILL);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->device, device);
  }
}

// Writes `text` to a file under the test's temporary directory and returns its path.
std::string WriteConfig(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST_F(WorkerFlagsTest, SpeculativeFlagsBecomeSpecOptions) {
  absl::SetFlag(&FLAGS_speculative, "ngram");
  absl::SetFlag(&FLAGS_num_speculative_tokens, 6);
  absl::SetFlag(&FLAGS_spec_adaptive, true);
  auto o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->speculative.enabled);
  EXPECT_EQ(o->speculative.drafter, "ngram");
  EXPECT_EQ(o->speculative.num_speculative_tokens, 6);
  EXPECT_TRUE(o->speculative.adaptive);
  // Without --spec_config: the knobs' defaults (node/spec_config.h).
  EXPECT_EQ(o->speculative.min_n, 1);
  EXPECT_EQ(o->speculative.max_n, 4);
  EXPECT_EQ(o->speculative.profile_context, 512);
  EXPECT_TRUE(o->speculative.select_mode);
  EXPECT_EQ(o->speculative.select_options.trial_run_unmeasured, 0);  // auto with n-gram drafts
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_run_tokens, 16.0);
  EXPECT_EQ(o->speculative.draft_catch_up_window, 16);  // auto under the selector
  EXPECT_EQ(o->speculative.draft_catch_up_window_min_sequences, 2);
  // With it: the file's keys; "auto" resolves from the flags.
  absl::SetFlag(&FLAGS_spec_config, WriteConfig("spec.json", R"({"ngram_min": 2, "ngram_max": 3,
                                              "profile_context": 96, "select": false,
                                              "trial_run_unmeasured": "auto"})"));
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.min_n, 2);
  EXPECT_EQ(o->speculative.max_n, 3);
  EXPECT_EQ(o->speculative.profile_context, 96);
  EXPECT_FALSE(o->speculative.select_mode);
  EXPECT_EQ(o->speculative.draft_catch_up_window, 0);  // auto: a fixed plan of 6 tokens
  const internal::v1::SpeculativeConfig c = ToSpeculativeConfig(o->speculative);
  EXPECT_EQ(c.method(), "ngram");
  EXPECT_EQ(c.num_speculative_tokens(), 6u);
  EXPECT_EQ(c.min_n(), 2u);
  EXPECT_EQ(c.max_n(), 3u);
  EXPECT_TRUE(c.adaptive());
  absl::SetFlag(&FLAGS_spec_config, "");
  // A draft model: its directory becomes the engine's path and the registered id.
  absl::SetFlag(&FLAGS_speculative, "draft_model");
  absl::SetFlag(&FLAGS_draft_model, "/models/tiny-draft/");
  absl::SetFlag(&FLAGS_threads, 3);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->speculative.enabled);
  EXPECT_EQ(o->speculative.drafter, "draft_model");
  EXPECT_EQ(o->speculative.draft_model_path, "/models/tiny-draft/");
  EXPECT_EQ(o->speculative.draft_threads, 3);
  EXPECT_EQ(o->speculative.draft_num_blocks, 0);  // as many as the target's cache
  EXPECT_EQ(o->speculative.select_options.trial_run_unmeasured, 1);  // auto with a draft model
  EXPECT_EQ(o->speculative.select_options.catch_up_delay_steps, 8);  // auto with a draft model
  absl::SetFlag(&FLAGS_draft_kv_blocks, 512);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.draft_num_blocks, 512);
  EXPECT_EQ(ToSpeculativeConfig(o->speculative).method(), "draft_model");
  EXPECT_EQ(ToSpeculativeConfig(o->speculative).draft_model_id(), "tiny-draft");
  // Off: the other speculative flags are not checked, and the config says only "off".
  absl::SetFlag(&FLAGS_speculative, "off");
  absl::SetFlag(&FLAGS_num_speculative_tokens, 0);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->speculative.enabled);
  EXPECT_EQ(ToSpeculativeConfig(o->speculative).ShortDebugString(), "method: \"off\"");
}

TEST_F(WorkerFlagsTest, BadValuesNameTheFlag) {
  struct Case {
    std::function<void()> set;
    const char* message_prefix;
  };
  const std::vector<Case> cases = {
      {[] { absl::SetFlag(&FLAGS_model, ""); }, "--model:"},
      {[] { absl::SetFlag(&FLAGS_kv_blocks, 0); }, "--kv_blocks: expected > 0, got 0"},
      {[] { absl::SetFlag(&FLAGS_block_size, -1); }, "--block_size:"},
      {[] { absl::SetFlag(&FLAGS_max_batch_tokens, 0); }, "--max_batch_tokens:"},
      {[] { absl::SetFlag(&FLAGS_max_running, 0); }, "--max_running:"},
      {[] { absl::SetFlag(&FLAGS_max_waiting, 0); }, "--max_waiting:"},
      {[] { absl::SetFlag(&FLAGS_threads, -2); }, "--threads:"},
      {[] { absl::SetFlag(&FLAGS_device, "gpu"); },
       "--device: expected cpu, cuda or auto, got \"gpu\""},
      {[] { absl::SetFlag(&FLAGS_overlap, "yes"); },
       "--overlap: expected auto, on or off, got \"yes\""},
      {[] { absl::SetFlag(&FLAGS_listen, "no-port"); }, "--listen:"},
      {[] { absl::SetFlag(&FLAGS_router, "127.0.0.1:0"); }, "--router:"},
      {[] { absl::SetFlag(&FLAGS_kv_transport, "tcp"); }, "--kv_transport:"},
      {[] { absl::SetFlag(&FLAGS_drain_timeout, absl::Seconds(-1)); }, "--drain_timeout:"},
      {[] { absl::SetFlag(&FLAGS_log_level, "loud"); }, "--log_level:"},
      {[] { absl::SetFlag(&FLAGS_metrics_listen, "no-port"); }, "--metrics_listen:"},
      {[] { absl::SetFlag(&FLAGS_worker_id, std::string(129, 'w')); }, "--worker_id:"},
      {[] { absl::SetFlag(&FLAGS_speculative, "eagle"); },
       "--speculative: expected off, ngram or draft_model, got \"eagle\""},
      {[] { absl::SetFlag(&FLAGS_speculative, "draft_model"); },
       "--draft_model: required with --speculative=draft_model"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_num_speculative_tokens, 0);
       },
       "--num_speculative_tokens: expected [1, 64], got 0"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_num_speculative_tokens, 65);
       },
       "--num_speculative_tokens:"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "draft_model");
         absl::SetFlag(&FLAGS_draft_model, "/models/tiny-draft");
         absl::SetFlag(&FLAGS_draft_kv_blocks, -1);
       },
       "--draft_kv_blocks: expected >= 0 (0: as many as --kv_blocks), got -1"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_spec_config, WriteConfig("bad.json", R"({"ngram_min": 0})"));
       },
       "spec_config: ngram_min: expected an integer in [1, 64], got 0"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_spec_config, WriteConfig("typo.json", R"({"selct": false})"));
       },
       "spec_config: unknown key \"selct\""},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_spec_config, WriteConfig("notjson.json", "select = false"));
       },
       "spec_config: "},
  };
  for (const Case& c : cases) {
    absl::FlagSaver restore;
    c.set();
    auto o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_PREFILL);
    ASSERT_FALSE(o.ok()) << c.message_prefix;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(o.status().message().rfind(c.message_prefix, 0), 0u)
        << "want " << c.message_prefix << ", got " << o.status().message();
  }
}

}  // namespace
}  // namespace deepinfer::node
