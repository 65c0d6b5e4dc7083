#include "node/spec_config.h"

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::node {
namespace {

using nlohmann::json;

engine::SpecOptions Base(const std::string& drafter = "ngram") {
  engine::SpecOptions spec;
  spec.enabled = true;
  spec.drafter = drafter;
  spec.num_speculative_tokens = 8;
  spec.adaptive = true;
  return spec;
}

TEST(SpecConfigTest, DefaultsAreTheWorkersDefaults) {
  engine::SpecOptions spec = Base();
  ASSERT_TRUE(ApplySpecConfig(nullptr, &spec).ok());
  const auto& sel = spec.select_options;
  EXPECT_EQ(spec.min_n, 1);
  EXPECT_EQ(spec.max_n, 4);
  EXPECT_EQ(spec.profile_context, 512);
  EXPECT_EQ(spec.profile_edge_requests, 0);
  EXPECT_TRUE(spec.select_mode);
  EXPECT_EQ(spec.select_max_length, 0);
  EXPECT_DOUBLE_EQ(sel.freeze_below, 0.99);
  EXPECT_EQ(sel.freeze_epochs, 512);
  EXPECT_EQ(sel.min_gap_epochs, 4);
  EXPECT_EQ(sel.confirm_gap_epochs, 1);
  EXPECT_DOUBLE_EQ(sel.cost_decay, 0.9);
  EXPECT_DOUBLE_EQ(sel.switch_margin, 0.01);
  EXPECT_TRUE(sel.interleave);
  EXPECT_TRUE(sel.trial_any_epoch);
  EXPECT_TRUE(sel.catch_up_charge);
  EXPECT_DOUBLE_EQ(sel.inherit_weight, 1.0);
  EXPECT_TRUE(sel.weigh_cut_trials);
  EXPECT_DOUBLE_EQ(spec.draft_stop_extend, 0.25);
  EXPECT_EQ(spec.draft_stop_extend_min_decoding, 3);
  EXPECT_TRUE(spec.probe_past_stop);
  EXPECT_DOUBLE_EQ(sel.trial_stop_below, 0.8);
  EXPECT_DOUBLE_EQ(sel.trial_stop_sequence_steps, 32.0);
  EXPECT_EQ(sel.trial_run_steps, 3);
  EXPECT_EQ(sel.trial_run_unmeasured, 0);  // auto, n-gram drafts
  EXPECT_DOUBLE_EQ(sel.trial_run_tokens, 16.0);
  EXPECT_EQ(sel.trial_run_max_decoding, 0);
  EXPECT_TRUE(sel.off_epoch_catch_up);
  EXPECT_EQ(sel.catch_up_delay_steps, 0);     // auto, n-gram drafts
  EXPECT_EQ(spec.draft_catch_up_window, 16);  // auto, adaptive with the selector
  EXPECT_EQ(spec.draft_catch_up_window_min_sequences, 2);
}

TEST(SpecConfigTest, AutoValuesFollowTheDrafterAndDraftLength) {
  engine::SpecOptions spec = Base("draft_model");
  ASSERT_TRUE(ApplySpecConfig(nullptr, &spec).ok());
  EXPECT_EQ(spec.select_options.trial_run_unmeasured, 1);
  EXPECT_EQ(spec.select_options.catch_up_delay_steps, 8);
  // A fixed draft length: the window only for drafts of at most 2 tokens.
  spec = Base("draft_model");
  spec.adaptive = false;
  ASSERT_TRUE(ApplySpecConfig(nullptr, &spec).ok());
  EXPECT_EQ(spec.draft_catch_up_window, 0);
  spec = Base("draft_model");
  spec.adaptive = false;
  spec.num_speculative_tokens = 2;
  ASSERT_TRUE(ApplySpecConfig(nullptr, &spec).ok());
  EXPECT_EQ(spec.draft_catch_up_window, 16);
  // The selector off (from the file itself): no window for an 8-token plan.
  spec = Base("draft_model");
  ASSERT_TRUE(ApplySpecConfig(json{{"select", false}}, &spec).ok());
  EXPECT_EQ(spec.draft_catch_up_window, 0);
}

TEST(SpecConfigTest, EveryKeySetsItsField) {
  struct Case {
    const char* key;
    json value;
    std::function<bool(const engine::SpecOptions&)> holds;
  };
  const std::vector<Case> cases = {
      {"ngram_min", 2, [](const auto& s) { return s.min_n == 2; }},
      {"ngram_max", 7, [](const auto& s) { return s.max_n == 7; }},
      {"profile_context", 96, [](const auto& s) { return s.profile_context == 96; }},
      {"profile_edge_requests", 8, [](const auto& s) { return s.profile_edge_requests == 8; }},
      {"select", false, [](const auto& s) { return !s.select_mode; }},
      {"select_max_length", 4, [](const auto& s) { return s.select_max_length == 4; }},
      {"freeze_below", 0.5, [](const auto& s) { return s.select_options.freeze_below == 0.5; }},
      {"freeze_epochs", 64, [](const auto& s) { return s.select_options.freeze_epochs == 64; }},
      {"min_gap_epochs", 16, [](const auto& s) { return s.select_options.min_gap_epochs == 16; }},
      {"confirm_gap_epochs", 2,
       [](const auto& s) { return s.select_options.confirm_gap_epochs == 2; }},
      {"cost_decay", 0.7, [](const auto& s) { return s.select_options.cost_decay == 0.7; }},
      {"switch_margin", 0.03, [](const auto& s) { return s.select_options.switch_margin == 0.03; }},
      {"interleave", false, [](const auto& s) { return !s.select_options.interleave; }},
      {"trial_any_epoch", false, [](const auto& s) { return !s.select_options.trial_any_epoch; }},
      {"catch_up_charge", false, [](const auto& s) { return !s.select_options.catch_up_charge; }},
      {"inherit_weight", 0.25,
       [](const auto& s) { return s.select_options.inherit_weight == 0.25; }},
      {"weigh_cut_trials", false, [](const auto& s) { return !s.select_options.weigh_cut_trials; }},
      {"draft_stop_extend", 0.5, [](const auto& s) { return s.draft_stop_extend == 0.5; }},
      {"draft_stop_extend_min_decoding", 1,
       [](const auto& s) { return s.draft_stop_extend_min_decoding == 1; }},
      {"probe_past_stop", false, [](const auto& s) { return !s.probe_past_stop; }},
      {"trial_stop_below", 0.0,
       [](const auto& s) { return s.select_options.trial_stop_below == 0.0; }},
      {"trial_stop_sequence_steps", 64,
       [](const auto& s) { return s.select_options.trial_stop_sequence_steps == 64.0; }},
      {"trial_run_steps", 2, [](const auto& s) { return s.select_options.trial_run_steps == 2; }},
      {"trial_run_unmeasured", 2,
       [](const auto& s) { return s.select_options.trial_run_unmeasured == 2; }},
      {"trial_run_tokens", 8.5,
       [](const auto& s) { return s.select_options.trial_run_tokens == 8.5; }},
      {"trial_run_max_decoding", 16,
       [](const auto& s) { return s.select_options.trial_run_max_decoding == 16; }},
      {"off_epoch_catch_up", false,
       [](const auto& s) { return !s.select_options.off_epoch_catch_up; }},
      {"catch_up_delay_steps", 3,
       [](const auto& s) { return s.select_options.catch_up_delay_steps == 3; }},
      {"draft_catch_up_window", 48, [](const auto& s) { return s.draft_catch_up_window == 48; }},
      {"draft_catch_up_window_min_sequences", 5,
       [](const auto& s) { return s.draft_catch_up_window_min_sequences == 5; }},
  };
  std::map<std::string, int> tested;
  for (const Case& c : cases) {
    engine::SpecOptions spec = Base();
    const absl::Status s = ApplySpecConfig(json{{c.key, c.value}}, &spec);
    ASSERT_TRUE(s.ok()) << c.key << ": " << s;
    EXPECT_TRUE(c.holds(spec)) << c.key;
    // Only that key changed: the same value given by itself applied to the defaults differs.
    engine::SpecOptions defaults = Base();
    ASSERT_TRUE(ApplySpecConfig(nullptr, &defaults).ok());
    EXPECT_FALSE(c.holds(defaults)) << c.key;
    ++tested[c.key];
  }
  for (const SpecConfigKey& k : SpecConfigKeys()) EXPECT_EQ(tested[k.name], 1) << k.name;
  EXPECT_EQ(tested.size(), SpecConfigKeys().size());
}

TEST(SpecConfigTest, BadValuesNameTheKey) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json{{"ngram_min", 0}}, "spec_config: ngram_min: expected an integer in [1, 64], got 0"},
      {json{{"ngram_min", 3}, {"ngram_max", 2}},
       "spec_config: ngram_max: expected an integer in [3, 64], got 2"},
      {json{{"profile_context", 0}}, "spec_config: profile_context: expected an integer >= 1"},
      {json{{"profile_edge_requests", -1}}, "spec_config: profile_edge_requests:"},
      {json{{"select", "yes"}}, "spec_config: select: expected true or false, got \"yes\""},
      {json{{"select_max_length", 16}},
       "spec_config: select_max_length: expected an integer in [0, 8], got 16"},
      {json{{"freeze_below", 1.5}}, "spec_config: freeze_below: expected a number in [0, 1]"},
      {json{{"freeze_epochs", 0}}, "spec_config: freeze_epochs:"},
      {json{{"min_gap_epochs", 0}}, "spec_config: min_gap_epochs:"},
      {json{{"min_gap_epochs", 129}}, "spec_config: min_gap_epochs:"},
      {json{{"confirm_gap_epochs", 5}},
       "spec_config: confirm_gap_epochs: expected an integer in [1, 4], got 5"},
      {json{{"cost_decay", 1.0}}, "spec_config: cost_decay: expected a number in [0, 1)"},
      {json{{"cost_decay", -0.1}}, "spec_config: cost_decay:"},
      {json{{"switch_margin", 1.0}}, "spec_config: switch_margin:"},
      {json{{"inherit_weight", 0.0}}, "spec_config: inherit_weight: expected a number in (0, 1]"},
      {json{{"draft_stop_extend", 1.0}}, "spec_config: draft_stop_extend:"},
      {json{{"draft_stop_extend_min_decoding", 0}}, "spec_config: draft_stop_extend_min_decoding:"},
      {json{{"trial_stop_below", -0.1}}, "spec_config: trial_stop_below:"},
      {json{{"trial_stop_sequence_steps", -1}}, "spec_config: trial_stop_sequence_steps:"},
      {json{{"trial_run_steps", 0}}, "spec_config: trial_run_steps:"},
      {json{{"trial_run_unmeasured", -1}},
       "spec_config: trial_run_unmeasured: expected \"auto\" or an integer >= 0, got -1"},
      {json{{"trial_run_unmeasured", "one"}}, "spec_config: trial_run_unmeasured:"},
      {json{{"trial_run_tokens", -1}},
       "spec_config: trial_run_tokens: expected \"auto\" or a finite number >= 0, got -1"},
      {json{{"trial_run_tokens", "sixteen"}}, "spec_config: trial_run_tokens:"},
      {json{{"trial_run_max_decoding", -1}}, "spec_config: trial_run_max_decoding:"},
      {json{{"catch_up_delay_steps", "soon"}}, "spec_config: catch_up_delay_steps:"},
      {json{{"draft_catch_up_window", -2}}, "spec_config: draft_catch_up_window:"},
      {json{{"draft_catch_up_window_min_sequences", 0}},
       "spec_config: draft_catch_up_window_min_sequences: expected an integer >= 1, got 0"},
      {json{{"ngram_history", true}}, "spec_config: unknown key \"ngram_history\" (known: "},
      {json::array({1, 2}), "spec_config: expected a JSON object, got array"},
  };
  for (const auto& [config, prefix] : cases) {
    engine::SpecOptions spec = Base();
    const absl::Status s = ApplySpecConfig(config, &spec);
    ASSERT_FALSE(s.ok()) << config.dump();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()).rfind(prefix, 0), 0u)
        << "want " << prefix << ", got " << s.message();
  }
}

TEST(SpecConfigTest, FileErrors) {
  engine::SpecOptions spec = Base();
  EXPECT_EQ(LoadSpecConfig("/nonexistent/spec.json", &spec).code(), absl::StatusCode::kNotFound);
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/spec.json";
  std::ofstream(path) << "// tuned for the coding workload\n{\"select_max_length\": 8}\n";
  ASSERT_TRUE(LoadSpecConfig(path, &spec).ok());
  EXPECT_EQ(spec.select_max_length, 8);
  std::ofstream(path) << "{\"select_max_length\": 8";
  EXPECT_EQ(LoadSpecConfig(path, &spec).code(), absl::StatusCode::kInvalidArgument);
}

// docs/spec-config.md's table lists every key with its default, in order.
TEST(SpecConfigTest, DocsListEveryKeyWithItsDefault) {
  std::ifstream in("docs/spec-config.md");
  ASSERT_TRUE(in) << "docs/spec-config.md not found";
  std::stringstream text;
  text << in.rdbuf();
  const std::regex row(R"(\n\| `([a-z_]+)` \| `([^`]*)` \|)");
  std::vector<std::pair<std::string, std::string>> documented;
  const std::string s = text.str();
  for (auto it = std::sregex_iterator(s.begin(), s.end(), row); it != std::sregex_iterator();
       ++it) {
    documented.emplace_back((*it)[1].str(), (*it)[2].str());
  }
  std::vector<std::pair<std::string, std::string>> keys;
  for (const SpecConfigKey& k : SpecConfigKeys()) keys.emplace_back(k.name, k.default_json);
  EXPECT_EQ(documented, keys) << "update the table in docs/spec-config.md";
}

}  // namespace
}  // namespace deepinfer::node
