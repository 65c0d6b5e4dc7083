#include "node/worker_flags.h"

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

TEST_F(WorkerFlagsTest, SpeculativeFlagsBecomeSpecOptions) {
  absl::SetFlag(&FLAGS_speculative, "ngram");
  absl::SetFlag(&FLAGS_num_speculative_tokens, 6);
  absl::SetFlag(&FLAGS_ngram_min, 2);
  absl::SetFlag(&FLAGS_ngram_max, 3);
  absl::SetFlag(&FLAGS_spec_adaptive, true);
  auto o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->speculative.enabled);
  EXPECT_EQ(o->speculative.drafter, "ngram");
  EXPECT_EQ(o->speculative.num_speculative_tokens, 6);
  EXPECT_EQ(o->speculative.min_n, 2);
  EXPECT_EQ(o->speculative.max_n, 3);
  EXPECT_TRUE(o->speculative.adaptive);
  EXPECT_EQ(o->speculative.profile_context, 512);
  EXPECT_EQ(o->speculative.profile_edge_requests, 0);  // auto
  absl::SetFlag(&FLAGS_spec_profile_context, 96);
  absl::SetFlag(&FLAGS_spec_profile_edge_requests, 8);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.profile_context, 96);
  EXPECT_EQ(o->speculative.profile_edge_requests, 8);
  const internal::v1::SpeculativeConfig c = ToSpeculativeConfig(o->speculative);
  EXPECT_EQ(c.method(), "ngram");
  EXPECT_EQ(c.num_speculative_tokens(), 6u);
  EXPECT_EQ(c.min_n(), 2u);
  EXPECT_EQ(c.max_n(), 3u);
  EXPECT_TRUE(c.adaptive());
  EXPECT_TRUE(o->speculative.select_options.interleave);  // trials alternate by default
  absl::SetFlag(&FLAGS_spec_interleave, false);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->speculative.select_options.interleave);
  EXPECT_TRUE(o->speculative.select_options.trial_any_epoch);
  absl::SetFlag(&FLAGS_spec_trial_any_epoch, false);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->speculative.select_options.trial_any_epoch);
  EXPECT_TRUE(o->speculative.select_options.catch_up_charge);
  absl::SetFlag(&FLAGS_spec_catch_up_charge, false);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->speculative.select_options.catch_up_charge);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.inherit_weight, 1.0);
  absl::SetFlag(&FLAGS_spec_inherit_weight, 0.25);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->speculative.select_options.inherit_weight, 0.25);
  absl::SetFlag(&FLAGS_spec_inherit_weight, 0.0);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  EXPECT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("--spec_inherit_weight"), std::string::npos);
  absl::SetFlag(&FLAGS_spec_inherit_weight, 1.0);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->speculative.select_options.weigh_cut_trials);
  absl::SetFlag(&FLAGS_spec_weigh_cut_trials, false);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->speculative.select_options.weigh_cut_trials);
  absl::SetFlag(&FLAGS_spec_carry_over_correction, true);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->speculative.select_options.freeze_below, 0.99);
  EXPECT_EQ(o->speculative.select_options.freeze_epochs, 512);
  absl::SetFlag(&FLAGS_spec_freeze_below, 0.0);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.select_options.freeze_below, 0.0);
  EXPECT_DOUBLE_EQ(o->speculative.draft_stop_extend, 0.25);
  EXPECT_EQ(o->speculative.draft_stop_extend_min_decoding, 3);
  EXPECT_TRUE(o->speculative.probe_past_stop);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_stop_below, 0.8);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_stop_sequence_steps, 32.0);
  EXPECT_EQ(o->speculative.select_options.trial_run_steps, 3);
  EXPECT_EQ(o->speculative.select_options.trial_run_unmeasured, 0);  // auto with n-gram drafts
  // auto: runs of text with n-gram drafts.
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_run_tokens, kTrialRunTokens);
  EXPECT_EQ(o->speculative.select_options.trial_run_max_decoding, 0);
  EXPECT_TRUE(o->speculative.select_options.off_epoch_catch_up);
  EXPECT_EQ(o->speculative.select_options.catch_up_delay_steps, 0);  // auto with n-gram drafts
  absl::SetFlag(&FLAGS_spec_ngram_history, true);
  absl::SetFlag(&FLAGS_spec_draft_model_history, true);
  absl::SetFlag(&FLAGS_spec_draft_stop_measured_rate, true);
  absl::SetFlag(&FLAGS_spec_draft_stop_extend, 0.5);
  absl::SetFlag(&FLAGS_spec_draft_stop_extend_min_decoding, 1);
  absl::SetFlag(&FLAGS_spec_draft_length_check, true);
  absl::SetFlag(&FLAGS_spec_probe_past_stop, false);
  absl::SetFlag(&FLAGS_spec_trial_stop_below, 0.0);
  absl::SetFlag(&FLAGS_spec_trial_stop_sequence_steps, 64.0);
  absl::SetFlag(&FLAGS_spec_trial_run_steps, 2);
  absl::SetFlag(&FLAGS_spec_trial_run_max_decoding, 16);
  absl::SetFlag(&FLAGS_spec_trial_run_tokens, "8.5");
  absl::SetFlag(&FLAGS_spec_trial_run_unmeasured, "2");
  absl::SetFlag(&FLAGS_spec_off_epoch_catch_up, false);
  absl::SetFlag(&FLAGS_spec_catch_up_delay_steps, "3");
  absl::SetFlag(&FLAGS_spec_catch_up_gate, true);
  absl::SetFlag(&FLAGS_spec_freeze_epochs, 64);
  EXPECT_EQ(o->speculative.select_options.min_gap_epochs, 4);
  EXPECT_EQ(o->speculative.select_options.confirm_gap_epochs, 1);
  absl::SetFlag(&FLAGS_spec_confirm_gap_epochs, 3);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.cost_decay, 0.9);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.switch_margin, 0.01);
  absl::SetFlag(&FLAGS_spec_min_gap_epochs, 16);
  EXPECT_EQ(o->speculative.select_max_length, 0);  // the fixed lengths go up to k
  absl::SetFlag(&FLAGS_spec_cost_decay, 0.7);
  absl::SetFlag(&FLAGS_spec_switch_margin, 0.03);
  absl::SetFlag(&FLAGS_spec_select_max_length, 2);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.select_max_length, 2);
  EXPECT_EQ(o->speculative.select_options.min_gap_epochs, 16);
  EXPECT_EQ(o->speculative.select_options.confirm_gap_epochs, 3);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.cost_decay, 0.7);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.switch_margin, 0.03);
  EXPECT_DOUBLE_EQ(o->speculative.draft_stop_extend, 0.5);
  EXPECT_EQ(o->speculative.draft_stop_extend_min_decoding, 1);
  EXPECT_FALSE(o->speculative.probe_past_stop);
  EXPECT_EQ(o->speculative.select_options.trial_stop_below, 0.0);
  EXPECT_EQ(o->speculative.select_options.trial_stop_sequence_steps, 64.0);
  EXPECT_EQ(o->speculative.select_options.trial_run_steps, 2);
  EXPECT_EQ(o->speculative.select_options.trial_run_max_decoding, 16);
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_run_tokens, 8.5);
  EXPECT_EQ(o->speculative.select_options.trial_run_unmeasured, 2);
  EXPECT_FALSE(o->speculative.select_options.off_epoch_catch_up);
  EXPECT_EQ(o->speculative.select_options.catch_up_delay_steps, 3);
  EXPECT_EQ(o->speculative.select_options.freeze_epochs, 64);
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
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_run_tokens, 8.5);  // as given
  EXPECT_EQ(o->speculative.select_options.catch_up_delay_steps, 3);       // as given
  EXPECT_EQ(o->speculative.select_options.trial_run_unmeasured, 2);     // as given
  absl::SetFlag(&FLAGS_spec_trial_run_tokens, "auto");
  absl::SetFlag(&FLAGS_spec_catch_up_delay_steps, "auto");
  absl::SetFlag(&FLAGS_spec_trial_run_unmeasured, "auto");
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->speculative.select_options.trial_run_tokens, kTrialRunTokens);
  EXPECT_EQ(o->speculative.select_options.trial_run_unmeasured, 1);
  EXPECT_EQ(o->speculative.select_options.catch_up_delay_steps, kDraftModelCatchUpDelaySteps);
  absl::SetFlag(&FLAGS_draft_kv_blocks, 512);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.draft_num_blocks, 512);
  // auto: the window under the adaptive selector (on here), and for fixed drafts of up to 2.
  EXPECT_EQ(o->speculative.draft_catch_up_window, kDraftCatchUpWindow);
  EXPECT_EQ(o->speculative.draft_catch_up_window_min_sequences, 2);
  absl::SetFlag(&FLAGS_draft_catch_up_window, "48");
  absl::SetFlag(&FLAGS_draft_catch_up_window_min_sequences, 5);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.draft_catch_up_window, 48);
  EXPECT_EQ(o->speculative.draft_catch_up_window_min_sequences, 5);
  absl::SetFlag(&FLAGS_draft_catch_up_window, "auto");
  absl::SetFlag(&FLAGS_spec_select, false);
  const int k = absl::GetFlag(FLAGS_num_speculative_tokens);
  absl::SetFlag(&FLAGS_num_speculative_tokens, kDraftCatchUpWindowMaxFixedLength + 1);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.draft_catch_up_window, 0);  // a long fixed draft: none
  absl::SetFlag(&FLAGS_num_speculative_tokens, kDraftCatchUpWindowMaxFixedLength);
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.draft_catch_up_window, kDraftCatchUpWindow);
  absl::SetFlag(&FLAGS_num_speculative_tokens, k);
  absl::SetFlag(&FLAGS_draft_catch_up_window, "0");
  o = WorkerOptionsFromFlags(internal::v1::WORKER_ROLE_DECODE);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->speculative.draft_catch_up_window, 0);  // every token fed
  absl::SetFlag(&FLAGS_draft_catch_up_window, "auto");
  absl::SetFlag(&FLAGS_spec_select, true);
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
      {[] { absl::SetFlag(&FLAGS_spec_profile_context, 0); },
       "--spec_profile_context: expected >= 1, got 0"},
      {[] { absl::SetFlag(&FLAGS_spec_profile_edge_requests, -1); },
       "--spec_profile_edge_requests: expected >= 0, got -1"},
      {[] { absl::SetFlag(&FLAGS_spec_freeze_below, 1.5); }, "--spec_freeze_below:"},
      {[] { absl::SetFlag(&FLAGS_spec_freeze_epochs, 0); }, "--spec_freeze_epochs:"},
      {[] { absl::SetFlag(&FLAGS_spec_min_gap_epochs, 0); }, "--spec_min_gap_epochs:"},
      {[] { absl::SetFlag(&FLAGS_spec_min_gap_epochs, 129); }, "--spec_min_gap_epochs:"},
      {[] { absl::SetFlag(&FLAGS_spec_confirm_gap_epochs, 0); },
       "--spec_confirm_gap_epochs: expected 1..4 (--spec_min_gap_epochs), got 0"},
      {[] { absl::SetFlag(&FLAGS_spec_confirm_gap_epochs, 5); }, "--spec_confirm_gap_epochs:"},
      {[] { absl::SetFlag(&FLAGS_draft_catch_up_window_min_sequences, 0); },
       "--draft_catch_up_window_min_sequences: expected >= 1, got 0"},
      {[] { absl::SetFlag(&FLAGS_spec_cost_decay, 1.0); }, "--spec_cost_decay:"},
      {[] { absl::SetFlag(&FLAGS_spec_cost_decay, -0.1); }, "--spec_cost_decay:"},
      {[] { absl::SetFlag(&FLAGS_spec_switch_margin, -0.01); }, "--spec_switch_margin:"},
      {[] { absl::SetFlag(&FLAGS_spec_switch_margin, 1.0); }, "--spec_switch_margin:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_stop_below, -0.1); }, "--spec_trial_stop_below:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_stop_sequence_steps, -1.0); },
       "--spec_trial_stop_sequence_steps:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_steps, 0); }, "--spec_trial_run_steps:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_unmeasured, "-1"); },
       "--spec_trial_run_unmeasured: expected auto or an integer >= 0, got \"-1\""},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_unmeasured, "one"); },
       "--spec_trial_run_unmeasured:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_tokens, "-1"); },
       "--spec_trial_run_tokens: expected auto or a finite number >= 0, got \"-1\""},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_tokens, "inf"); }, "--spec_trial_run_tokens:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_tokens, "nan"); }, "--spec_trial_run_tokens:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_tokens, "sixteen"); }, "--spec_trial_run_tokens:"},
      {[] { absl::SetFlag(&FLAGS_spec_catch_up_delay_steps, "-1"); },
       "--spec_catch_up_delay_steps: expected auto or an integer >= 0, got \"-1\""},
      {[] { absl::SetFlag(&FLAGS_spec_catch_up_delay_steps, "soon"); },
       "--spec_catch_up_delay_steps:"},
      {[] { absl::SetFlag(&FLAGS_spec_trial_run_max_decoding, -1); },
       "--spec_trial_run_max_decoding:"},
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
         absl::SetFlag(&FLAGS_speculative, "draft_model");
         absl::SetFlag(&FLAGS_draft_model, "/models/tiny-draft");
         absl::SetFlag(&FLAGS_draft_catch_up_window, "-2");
       },
       "--draft_catch_up_window: expected auto or an integer >= 0 (0: feed every token), got "
       "\"-2\""},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_ngram_min, 0);
       },
       "--ngram_min: expected >= 1, got 0"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_ngram_min, 3);
         absl::SetFlag(&FLAGS_ngram_max, 2);
       },
       "--ngram_max: expected [--ngram_min = 3, 64], got 2"},
      {[] {
         absl::SetFlag(&FLAGS_speculative, "ngram");
         absl::SetFlag(&FLAGS_num_speculative_tokens, 8);
         absl::SetFlag(&FLAGS_spec_select_max_length, 16);
       },
       "--spec_select_max_length: expected [0, --num_speculative_tokens = 8], got 16"},
      {[] { absl::SetFlag(&FLAGS_spec_draft_stop_extend, 1.0); },
       "--spec_draft_stop_extend: expected a fraction in [0, 1), got 1"},
      {[] { absl::SetFlag(&FLAGS_spec_draft_stop_extend_min_decoding, 0); },
       "--spec_draft_stop_extend_min_decoding: expected >= 1, got 0"},
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
