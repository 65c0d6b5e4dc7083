#include "node/spec_config.h"

#include <cmath>
#include <deque>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deepinfer::node {
namespace {

// "auto" defaults (see SpecConfigKeys for why).
constexpr double kAutoTrialRunTokens = 16.0;
constexpr int kAutoDraftModelCatchUpDelaySteps = 8;
constexpr int kAutoDraftCatchUpWindow = 16;
constexpr int kAutoDraftCatchUpWindowMaxFixedLength = 2;

// Reads one key of the config (or its default) with range checks whose messages name it.
class Reader {
 public:
  explicit Reader(const nlohmann::json& config) : config_(config) {}

  const nlohmann::json& Value(const char* key) {
    seen_.insert(key);
    if (config_.is_object() && config_.contains(key)) return config_.at(key);
    for (const SpecConfigKey& k : SpecConfigKeys()) {
      if (std::string(k.name) == key) {
        defaults_.push_back(nlohmann::json::parse(k.default_json));
        return defaults_.back();
      }
    }
    defaults_.push_back(nullptr);  // unreachable: every key read is listed
    return defaults_.back();
  }

  absl::Status Bool(const char* key, bool* out) {
    const nlohmann::json& v = Value(key);
    if (!v.is_boolean()) return Error(key, "true or false", v);
    *out = v.get<bool>();
    return absl::OkStatus();
  }

  absl::Status Int(const char* key, int lo, int hi, int* out) {
    const nlohmann::json& v = Value(key);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      return Error(key, Range(lo, hi), v);
    }
    *out = static_cast<int>(v.get<int64_t>());
    return absl::OkStatus();
  }

  // A number in [lo, hi] (hi_open: [lo, hi); lo_open: (lo, hi]).
  absl::Status Double(const char* key, double lo, double hi, bool lo_open, bool hi_open,
                      double* out) {
    const nlohmann::json& v = Value(key);
    const std::string range =
        absl::StrCat("a number in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
    if (!v.is_number()) return Error(key, range, v);
    const double d = v.get<double>();
    if (!std::isfinite(d) || (lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi)) {
      return Error(key, range, v);
    }
    *out = d;
    return absl::OkStatus();
  }

  // "auto" (then `automatic`) or an integer >= 0.
  absl::Status AutoCount(const char* key, int automatic, int* out) {
    const nlohmann::json& v = Value(key);
    if (v.is_string() && v.get<std::string>() == "auto") {
      *out = automatic;
      return absl::OkStatus();
    }
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (1 << 30)) {
      return Error(key, "\"auto\" or an integer >= 0", v);
    }
    *out = static_cast<int>(v.get<int64_t>());
    return absl::OkStatus();
  }

  // Every key of the config was read: else the first unknown one.
  absl::Status NoUnknownKeys() const {
    if (!config_.is_object()) return absl::OkStatus();
    for (const auto& [key, value] : config_.items()) {
      if (seen_.count(key) == 0) {
        std::vector<std::string> known;
        for (const SpecConfigKey& k : SpecConfigKeys()) known.push_back(k.name);
        return absl::InvalidArgumentError(absl::StrCat(
            "spec_config: unknown key \"", key, "\" (known: ", absl::StrJoin(known, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  static absl::Status Error(const char* key, absl::string_view expected,
                            const nlohmann::json& got) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_config: ", key, ": expected ", expected, ", got ", got.dump()));
  }

 private:
  static std::string Range(int lo, int hi) {
    if (hi == (1 << 30)) return absl::StrCat("an integer >= ", lo);
    return absl::StrCat("an integer in [", lo, ", ", hi, "]");
  }

  const nlohmann::json& config_;
  std::set<std::string> seen_;
  std::deque<nlohmann::json> defaults_;  // stable addresses for Value's references
};

constexpr int kNoMax = 1 << 30;

}  // namespace

const std::vector<SpecConfigKey>& SpecConfigKeys() {
  static const auto* keys = new std::vector<SpecConfigKey>{
      {"ngram_min", "1", "n-gram drafts: one matching token of recent text already finds a copy."},
      {"ngram_max", "4",
       "n-gram drafts: the longest suffix matched (<= 64); longer matches cost more lookups."},
      {"profile_context", "512",
       "adaptive: cached tokens per sequence in the start-up cost profile, near the contexts "
       "served, since a verified draft attends over its context."},
      {"profile_edge_requests", "0",
       "adaptive on the CPU: rows of the profile that also measure where one token more starts a "
       "pass of the projections; 0 (auto): 8 with AMX (16-row passes), else 1."},
      {"select", "true",
       "adaptive: measure the per-step plan against fixed draft lengths and no drafting, and run "
       "the fastest per count of decoding requests (the plan alone lost to fixed lengths)."},
      {"select_max_length", "0",
       "with select: the longest fixed draft length measured (1, 2, 4, ... up to it); 0: "
       "--num_speculative_tokens."},
      {"freeze_below", "0.99",
       "with select and a draft model: where not drafting is fastest and every drafting mode "
       "below this fraction of it, stop feeding the draft model there."},
      {"freeze_epochs", "512",
       "a frozen bucket re-measures its drafting modes once every this many epochs."},
      {"min_gap_epochs", "4",
       "fewest epochs of a bucket between two trials of one losing mode (<= 128), bounding what "
       "exploration costs."},
      {"confirm_gap_epochs", "1",
       "epochs between trials of a mode rated faster than the bucket's current one but not yet "
       "confirmed (1..min_gap_epochs): a likely winner is confirmed first."},
      {"cost_decay", "0.9",
       "weight of a mode's older trials in its score, in [0, 1): averages about ten trials."},
      {"switch_margin", "0.01",
       "how much faster (log tokens/s) a mode must measure to take a bucket over; each switch "
       "pays a warm-up."},
      {"interleave", "true",
       "a trial alternates its steps with the current mode's, so both see the same machine "
       "speed and text."},
      {"trial_any_epoch", "true",
       "with interleave: a trial may start at any epoch of its bucket, so buckets the count only "
       "passes through are measured too."},
      {"catch_up_charge", "true",
       "with a draft model: charge drafting modes the draft model's catch-up time, which their "
       "measured steps leave out."},
      {"inherit_weight", "1.0",
       "trials' worth, in (0, 1], of its neighbour's measurements a new bucket starts from."},
      {"weigh_cut_trials", "true",
       "a trial cut short by the count leaving its bucket weighs as the share of steps it ran."},
      {"draft_stop_extend", "0.25",
       "adaptive draft model: draft up to the longest length within this fraction of the best "
       "length's predicted rate, each request stopping on its own confidence."},
      {"draft_stop_extend_min_decoding", "3",
       "the fewest decoding requests at which draft_stop_extend applies; a lone request's "
       "calibration is too optimistic for it."},
      {"probe_past_stop", "true",
       "adaptive draft model: a probe drafts one token past the confidence stop, so stopped "
       "positions keep being observed."},
      {"trial_stop_below", "0.8",
       "a trial ends early once the mode on trial realised less than this fraction of the "
       "current mode's tokens/s; 0: trials run whole."},
      {"trial_stop_sequence_steps", "32",
       "sequence-steps each side of a trial must cover before it may end early."},
      {"trial_run_steps", "3",
       "a trial alternates runs of this many steps of either mode; 1: single steps."},
      {"trial_run_unmeasured", "\"auto\"",
       "first steps of each run left unmeasured (they start from the other mode's state); auto: "
       "0 with n-gram drafts, 1 with a draft model."},
      {"trial_run_tokens", "\"auto\"",
       "a run lasts until its steps emitted this many tokens a request, so both sides are "
       "measured on as much of the same text; 0: runs of steps; auto: 16."},
      {"trial_run_max_decoding", "0",
       "runs only while at most this many requests decode, single steps above; 0: at any count."},
      {"off_epoch_catch_up", "true",
       "with a draft model: steps of a bucket held by no drafting feed the draft model what "
       "requests are behind by, so switching drafting back on is cheap."},
      {"catch_up_delay_steps", "\"auto\"",
       "while a frozen bucket skips the draft model, a count moving to a drafting bucket hands "
       "over after this many steps there; auto: 8 with a draft model, 0 with n-gram drafts."},
      {"draft_catch_up_window", "\"auto\"",
       "draft model: a request further behind than this many tokens is fed only the last this "
       "many (0: every token); auto: 16 under the selector or with drafts of <= 2, else 0."},
      {"draft_catch_up_window_min_sequences", "2",
       "the window applies only while at least this many requests decode; a lone request's "
       "drafts see the whole conversation."},
  };
  return *keys;
}

absl::Status ApplySpecConfig(const nlohmann::json& config, engine::SpecOptions* spec) {
  if (!config.is_null() && !config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_config: expected a JSON object, got ", config.type_name()));
  }
  Reader r(config);
  auto& sel = spec->select_options;
  const bool ngram = spec->drafter == "ngram";
  if (absl::Status s = r.Int("ngram_min", 1, 64, &spec->min_n); !s.ok()) return s;
  if (absl::Status s = r.Int("ngram_max", spec->min_n, 64, &spec->max_n); !s.ok()) return s;
  if (absl::Status s = r.Int("profile_context", 1, kNoMax, &spec->profile_context); !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Int("profile_edge_requests", 0, kNoMax, &spec->profile_edge_requests);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Bool("select", &spec->select_mode); !s.ok()) return s;
  if (absl::Status s =
          r.Int("select_max_length", 0, spec->num_speculative_tokens, &spec->select_max_length);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Double("freeze_below", 0.0, 1.0, false, false, &sel.freeze_below);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Int("freeze_epochs", 1, kNoMax, &sel.freeze_epochs); !s.ok()) return s;
  if (absl::Status s = r.Int("min_gap_epochs", 1, sel.max_gap_epochs, &sel.min_gap_epochs);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Int("confirm_gap_epochs", 1, sel.min_gap_epochs, &sel.confirm_gap_epochs);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Double("cost_decay", 0.0, 1.0, false, true, &sel.cost_decay); !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Double("switch_margin", 0.0, 1.0, false, true, &sel.switch_margin);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Bool("interleave", &sel.interleave); !s.ok()) return s;
  if (absl::Status s = r.Bool("trial_any_epoch", &sel.trial_any_epoch); !s.ok()) return s;
  if (absl::Status s = r.Bool("catch_up_charge", &sel.catch_up_charge); !s.ok()) return s;
  if (absl::Status s = r.Double("inherit_weight", 0.0, 1.0, true, false, &sel.inherit_weight);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Bool("weigh_cut_trials", &sel.weigh_cut_trials); !s.ok()) return s;
  if (absl::Status s =
          r.Double("draft_stop_extend", 0.0, 1.0, false, true, &spec->draft_stop_extend);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          r.Int("draft_stop_extend_min_decoding", 1, kNoMax, &spec->draft_stop_extend_min_decoding);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Bool("probe_past_stop", &spec->probe_past_stop); !s.ok()) return s;
  if (absl::Status s = r.Double("trial_stop_below", 0.0, 1.0, false, false, &sel.trial_stop_below);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Double("trial_stop_sequence_steps", 0.0, 1e9, false, false,
                                &sel.trial_stop_sequence_steps);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Int("trial_run_steps", 1, kNoMax, &sel.trial_run_steps); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          r.AutoCount("trial_run_unmeasured", ngram ? 0 : 1, &sel.trial_run_unmeasured);
      !s.ok()) {
    return s;
  }
  {
    const nlohmann::json& v = r.Value("trial_run_tokens");
    if (v.is_string() && v.get<std::string>() == "auto") {
      sel.trial_run_tokens = kAutoTrialRunTokens;
    } else if (v.is_number() && v.get<double>() >= 0.0 && std::isfinite(v.get<double>())) {
      sel.trial_run_tokens = v.get<double>();
    } else {
      return Reader::Error("trial_run_tokens", "\"auto\" or a finite number >= 0", v);
    }
  }
  if (absl::Status s = r.Int("trial_run_max_decoding", 0, kNoMax, &sel.trial_run_max_decoding);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Bool("off_epoch_catch_up", &sel.off_epoch_catch_up); !s.ok()) return s;
  if (absl::Status s =
          r.AutoCount("catch_up_delay_steps", ngram ? 0 : kAutoDraftModelCatchUpDelaySteps,
                      &sel.catch_up_delay_steps);
      !s.ok()) {
    return s;
  }
  const bool window_auto = (spec->adaptive && spec->select_mode) ||
                           spec->num_speculative_tokens <= kAutoDraftCatchUpWindowMaxFixedLength;
  if (absl::Status s =
          r.AutoCount("draft_catch_up_window", window_auto ? kAutoDraftCatchUpWindow : 0,
                      &spec->draft_catch_up_window);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Int("draft_catch_up_window_min_sequences", 1, kNoMax,
                             &spec->draft_catch_up_window_min_sequences);
      !s.ok()) {
    return s;
  }
  return r.NoUnknownKeys();
}

absl::Status LoadSpecConfig(const std::string& path, engine::SpecOptions* spec) {
  if (path.empty()) return ApplySpecConfig(nullptr, spec);
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--spec_config: cannot read \"", path, "\""));
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false,
                                                /*ignore_comments=*/true);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_config: ", path, ": expected a JSON object"));
  }
  return ApplySpecConfig(config, spec);
}

}  // namespace deepinfer::node
