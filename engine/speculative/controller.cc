#include "engine/speculative/controller.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/model.h"
#include "engine/speculative/model_drafter.h"
#include "engine/speculative/ngram_drafter.h"
#include "spdlog/spdlog.h"

namespace deepinfer::engine::speculative {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Weight of each step's overhead sample in the running average.
constexpr double kOverheadWeight = 0.1;
// The most a sample counts for, as a multiple of the average (or of a floor): a step the OS
// descheduled moves the average by at most 30%, and a lasting change is still followed.
constexpr double kOutlierFactor = 4.0;

double BoundedEmaStep(double ema, double sample, double floor) {
  return ema + kOverheadWeight * (std::min(sample, kOutlierFactor * std::max(ema, floor)) - ema);
}
// Every this many epochs of the mode selector, its measured rates go to the log.
constexpr int64_t kSelectorLogEpochs = 64;
// A draft model drafts a longer draft (or any) only when the plan expects it to beat the best
// shorter one by this much: a near tie is decided by estimation noise, and drafts are paid for.
constexpr double kDraftLengthMinGain = 0.03;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status ValidateOptions(const SpecOptions& so) {
  if (so.drafter != "ngram" && so.drafter != "draft_model") {
    return Invalid(absl::StrCat(
        "speculative.drafter: expected \"ngram\" or \"draft_model\", got \"", so.drafter, "\""));
  }
  if (so.num_speculative_tokens < 1 || so.num_speculative_tokens > 64) {
    return Invalid(absl::StrCat("speculative.num_speculative_tokens: expected [1, 64], got ",
                                so.num_speculative_tokens));
  }
  if (so.select_max_length < 0 || so.select_max_length > so.num_speculative_tokens) {
    return Invalid(
        absl::StrCat("speculative.select_max_length: expected [0, num_speculative_tokens = ",
                     so.num_speculative_tokens, "], got ", so.select_max_length));
  }
  if (so.adaptive && so.profile_runs < 5) {
    return Invalid(absl::StrCat("speculative.profile_runs: expected >= 5, got ", so.profile_runs));
  }
  if (so.adaptive && so.profile_edge_requests < 0) {
    return Invalid(absl::StrCat("speculative.profile_edge_requests: expected >= 0, got ",
                                so.profile_edge_requests));
  }
  if (so.adaptive && so.profile_context < 1) {
    return Invalid(
        absl::StrCat("speculative.profile_context: expected >= 1, got ", so.profile_context));
  }
  if (so.probe_interval < 0) {
    return Invalid(
        absl::StrCat("speculative.probe_interval: expected >= 0, got ", so.probe_interval));
  }
  if (!(so.draft_stop_extend >= 0.0 && so.draft_stop_extend < 1.0)) {
    return Invalid(
        absl::StrCat("speculative.draft_stop_extend: expected [0, 1), got ", so.draft_stop_extend));
  }
  if (so.draft_stop_extend_min_decoding < 1) {
    return Invalid(absl::StrCat("speculative.draft_stop_extend_min_decoding: expected >= 1, got ",
                                so.draft_stop_extend_min_decoding));
  }
  if (so.drafter == "draft_model") {
    if (so.draft_model_path.empty()) {
      return Invalid("speculative.draft_model_path: required with drafter \"draft_model\"");
    }
    if (so.draft_num_blocks < 0) {
      return Invalid(absl::StrCat(
          "speculative.draft_num_blocks: expected >= 0 (0: the target's num_blocks), got ",
          so.draft_num_blocks));
    }
    if (so.draft_catch_up_window < 0) {
      return Invalid(absl::StrCat(
          "speculative.draft_catch_up_window: expected >= 0 (0: feed every token), got ",
          so.draft_catch_up_window));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> LoadDraftModel(const SpecOptions& so,
                                                             const EngineLimits& limits) {
  ModelDrafterOptions mo;
  mo.num_blocks = so.draft_num_blocks > 0 ? so.draft_num_blocks : limits.num_blocks;
  mo.block_size = limits.block_size;
  mo.seed = limits.hash_seed ^ 0x5eedd4a7ULL;
  mo.max_catch_up = std::max(so.draft_catch_up_tokens, 0);
  mo.catch_up_window = so.draft_catch_up_window;
  mo.catch_up_window_min_sequences = so.draft_catch_up_window_min_sequences;
  absl::StatusOr<std::unique_ptr<ModelDrafter>> loaded = ModelDrafter::Load(
      so.draft_model_path, limits.vocab_size, mo, ModelOptions{so.draft_threads});
  if (!loaded.ok()) {
    return Invalid(absl::StrCat(
        "speculative.draft_model_path: \"", so.draft_model_path,
        "\": ", absl::StripPrefix(loaded.status().message(), "speculative.draft_model: ")));
  }
  return loaded;
}

}  // namespace

SpeculativeController::SpeculativeController(const SpecOptions& options, const EngineLimits& limits)
    : options_(options), limits_(limits) {}

SpeculativeController::~SpeculativeController() = default;

absl::StatusOr<std::unique_ptr<SpeculativeController>> SpeculativeController::Create(
    const SpecOptions& options, const EngineLimits& limits, const ProfileStepFn& profile_step,
    std::unique_ptr<Drafter> drafter) {
  DI_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<SpeculativeController> controller(new SpeculativeController(options, limits));
  DI_RETURN_IF_ERROR(controller->Init(profile_step, std::move(drafter)));
  return controller;
}

absl::Status SpeculativeController::Init(const ProfileStepFn& profile_step,
                                         std::unique_ptr<Drafter> drafter) {
  const SpecOptions& so = options_;
  if (drafter != nullptr) {
    drafter_ = std::move(drafter);
  } else if (so.drafter == "draft_model") {
    DI_ASSIGN_OR_RETURN(std::unique_ptr<ModelDrafter> loaded, LoadDraftModel(so, limits_));
    model_drafter_ = loaded.get();
    drafter_ = std::move(loaded);
  } else {
    absl::StatusOr<std::unique_ptr<NgramDrafter>> ngram =
        NgramDrafter::Create({so.min_n, so.max_n});
    if (!ngram.ok()) return Invalid(absl::StrCat("speculative: ", ngram.status().message()));
    drafter_ = std::move(*ngram);
  }
  survival_ = std::make_unique<NgramSurvivalStats>(
      /*max_match_length=*/so.max_n, SurvivalOptions{/*max_positions=*/so.num_speculative_tokens});
  if (model_drafter_ != nullptr) {
    CalibrationOptions co;
    co.positions.max_positions = so.num_speculative_tokens;
    calibration_ = std::make_unique<DraftCalibration>(co);
  }
  if (so.adaptive) DI_RETURN_IF_ERROR(InitAdaptive(profile_step));
  return absl::OkStatus();
}

absl::Status SpeculativeController::InitAdaptive(const ProfileStepFn& profile_step) {
  const SpecOptions& so = options_;
  absl::Status profiled = absl::OkStatus();
  if (so.cost_table != nullptr) {
    cost_ = std::make_unique<CostTable>(*so.cost_table);
  } else {
    profiled = ProfileCost(profile_step);
  }
  if (!profiled.ok()) {
    spdlog::warn("speculative: no cost table ({}); verifying every draft token",
                 profiled.ToString());
    cost_.reset();
  } else if (cost_->IsFlat()) {
    spdlog::warn("speculative: cost table is flat ({}); verifying every draft token",
                 cost_->DebugString());
  } else {
    spdlog::info("speculative: adaptive verification with cost table {}{}",
                 cost_context_ > 0
                     ? absl::StrCat("(profiled at ", cost_context_, " cached tokens) ")
                     : std::string(),
                 cost_->DebugString());
  }
  if (model_drafter_ != nullptr) ProfileDraftCost();
  const bool active = cost_ != nullptr && !cost_->IsFlat();
  if (active && so.select_mode) DI_RETURN_IF_ERROR(CreateSelector());
  stats_.spec_adaptive_active = active;
  stats_.spec_cost_context = cost_context_;
  return absl::OkStatus();
}

void SpeculativeController::ProfileDraftCost() {
  // The draft model's cost per round, for choosing the draft length (one pass of n sequences x
  // 1 token, n up to the running batch).
  if (options_.draft_cost_table != nullptr) {
    draft_cost_ = std::make_unique<CostTable>(*options_.draft_cost_table);
  } else {
    std::vector<int> sizes;
    const int most = std::min(limits_.max_running, 256);
    for (int n = 1; n < most; n *= 2) sizes.push_back(n);
    sizes.push_back(most);
    absl::StatusOr<CostTable> draft =
        model_drafter_->ProfileRoundCost(sizes, options_.profile_runs);
    if (draft.ok()) {
      draft_cost_ = std::make_unique<CostTable>(*std::move(draft));
    } else {
      spdlog::warn("speculative: draft model not profiled ({}); drafting counted as free",
                   draft.status().ToString());
    }
  }
  if (draft_cost_ != nullptr) {
    spdlog::info("speculative: draft model round cost {}", draft_cost_->DebugString());
  }
}

absl::Status SpeculativeController::CreateSelector() {
  // The plan first, then none, then fixed lengths 1, 2, 4, ... up to select_max_length (default
  // k; the order in which a new bucket tries them), with the length whose one sequence fills a
  // pass of the projections (SpecOptions::select_max_length).
  const SpecOptions& so = options_;
  std::vector<int> lengths;
  const int longest = so.select_max_length > 0 ? so.select_max_length : so.num_speculative_tokens;
  for (int l = 1; l < longest; l *= 2) lengths.push_back(l);
  lengths.push_back(longest);
  const int fill_pass = limits_.rows_per_pass - 1;
  if (fill_pass > 1 && fill_pass < longest &&
      std::find(lengths.begin(), lengths.end(), fill_pass) == lengths.end()) {
    lengths.insert(std::upper_bound(lengths.begin(), lengths.end(), fill_pass), fill_pass);
  }
  std::vector<int> modes = {DraftModeSelector::kPlan, 0};
  modes.insert(modes.end(), lengths.begin(), lengths.end());
  absl::StatusOr<DraftModeSelector> selector =
      DraftModeSelector::Create(std::move(modes), so.select_options);
  if (!selector.ok()) return selector.status();
  selector_.emplace(*std::move(selector));
  stats_.spec_select_lengths = std::move(lengths);
  return absl::OkStatus();
}

absl::Status SpeculativeController::ProfileCost(const ProfileStepFn& profile_step) {
  // Decode-like steps: `requests` sequences with a context of `context` tokens each feed
  // tokens / requests new tokens with logits for all of them.
  const int k = options_.num_speculative_tokens;
  const int bs = limits_.block_size;
  // SpecOptions::profile_context, less where the model's positions or the KV cache would not hold
  // the largest row (up to 32 requests) at k + 1 tokens a request; at least 1.
  const int64_t widest = std::min(32, limits_.max_running);
  const int64_t context =
      std::max<int64_t>(1, std::min({static_cast<int64_t>(options_.profile_context),
                                     limits_.max_position_embeddings - (k + 1),
                                     (limits_.num_blocks / widest) * bs - (k + 1)}));
  cost_context_ = context;
  // The CPU's projections multiply several tokens per pass over the weights: the one-request row
  // also measures the edges where one token more starts a pass (CostProfileShapes). A GPU
  // backend's passes are not the CPU's: none.
  constexpr int kEdgeShapes = 24;
  const int rows_per_pass = limits_.rows_per_pass;
  const int edge_requests = options_.profile_edge_requests > 0 ? options_.profile_edge_requests
                            : rows_per_pass >= SpecOptions::kAutoEdgeRowsPerPass ? 8
                                                                                 : 1;
  const std::vector<std::pair<int, int>> shapes = CostProfileShapes(
      k, limits_.max_running, rows_per_pass, kEdgeShapes, edge_requests,
      [&](int tokens, int requests) {
        const int per_request = (tokens + requests - 1) / requests;
        const int64_t blocks_needed = requests * ((context + per_request + bs - 1) / bs);
        return tokens <= limits_.max_batch_tokens && blocks_needed <= limits_.num_blocks;
      });
  if (shapes.size() < 2) {
    return absl::FailedPreconditionError(
        "speculative: the KV cache or the step budget is too small to profile the step cost");
  }
  auto run_step = [&](int tokens, int requests) { return profile_step(tokens, requests, context); };
  // ProfileCostTable warms each shape (buffers, rope tables, caches) before measuring it.
  DI_ASSIGN_OR_RETURN(CostTable table, ProfileCostTable(run_step, shapes, options_.profile_runs));
  cost_ = std::make_unique<CostTable>(std::move(table));
  return absl::OkStatus();
}

double SpeculativeController::SyncOverheadSeconds() const {
  // Before any synchronous step was measured, the overlapped steps' overhead (a lower bound:
  // overlap hides the scheduling) stands in for it; with neither, the pure table.
  if (have_overhead_) return std::max(0.0, overhead_ema_);
  if (have_overlap_overhead_) return std::max(0.0, overlap_overhead_ema_);
  return 0.0;
}

StepShape SpeculativeController::SyncStepShape(int sampling_requests, int step_tokens,
                                               int step_requests) const {
  StepShape shape;
  shape.sampling_requests = sampling_requests;
  shape.step_tokens = step_tokens;
  shape.step_requests = step_requests;
  shape.extra_seconds = SyncOverheadSeconds() + forward_fit_.Offset(step_requests);
  shape.cost_scale = forward_fit_.Scale();
  return shape;
}

StepPlan SpeculativeController::Plan(const std::vector<DecodeView>& decodes, int64_t prefill_tokens,
                                     int prefills) {
  StepPlan plan;
  if (decodes.empty()) return plan;
  const SpecOptions& so = options_;
  const int k = so.num_speculative_tokens;
  const int64_t budget = limits_.max_batch_tokens;
  const int64_t n = static_cast<int64_t>(decodes.size());
  const int64_t spare = std::max<int64_t>(budget - n - prefill_tokens, 0);
  std::vector<int> caps(decodes.size(), 0);
  int longest = 0;
  for (size_t i = 0; i < decodes.size(); ++i) {
    caps[i] = spare > 0 ? static_cast<int>(std::clamp<int64_t>(decodes[i].room, 0, k)) : 0;
    longest = std::max(longest, caps[i]);
  }
  if (adaptive() && selector_.has_value()) {
    // Measured modes (DraftModeSelector): no drafting, a fixed length, or the plan below.
    const DraftModeSelector::Choice choice = selector_->Choose(static_cast<int>(n));
    plan.mode = choice.mode;
    plan.mode_measured = choice.measured;
    plan.upkeep = choice.upkeep;
    plan.upkeep_catch_up = choice.catch_up;
    const int length = selector_->length(choice.mode);
    if (length != DraftModeSelector::kPlan) {
      plan.fixed_length = length;
      plan.may_draft = length > 0 && longest > 0;
      return plan;
    }
  }
  // Probes count steps with decoding sequences; a probe due waits for a step that can draft.
  // The gap doubles (up to kMaxProbeBackoff x probe_interval) while the plan keeps saying "no
  // draft" between probes, and returns to probe_interval once it drafts again.
  if (probe_gap_ <= 0) probe_gap_ = so.probe_interval;
  if (adaptive() && so.probe_interval > 0 && ++steps_since_probe_ >= probe_gap_ && longest > 0) {
    plan.probe = true;
    steps_since_probe_ = 0;
    probe_gap_ = planned_draft_since_probe_
                     ? so.probe_interval
                     : std::min(probe_gap_ * 2, so.probe_interval * kMaxProbeBackoff);
    planned_draft_since_probe_ = false;
  }
  if (longest == 0) return plan;  // nothing could be drafted or verified
  plan.may_draft = true;
  if (!adaptive() || plan.probe) return plan;
  if (!PlanDrafts(decodes, caps, prefill_tokens, prefills)) plan.may_draft = false;
  return plan;
}

bool SpeculativeController::PlanDrafts(const std::vector<DecodeView>& decodes,
                                       const std::vector<int>& caps, int64_t prefill_tokens,
                                       int prefills) {
  // The planner's decision from earlier steps' estimates (as Draft makes it): drafting runs
  // synchronously at the measured synchronous overhead; not drafting overlaps, at the measured
  // overlapped overhead once known.
  const int64_t budget = limits_.max_batch_tokens;
  const int64_t n = static_cast<int64_t>(decodes.size());
  const StepShape shape =
      SyncStepShape(static_cast<int>(n), static_cast<int>(std::min(n + prefill_tokens, budget)),
                    static_cast<int>(n) + prefills);
  double draft_rate = 0.0;  // expected tokens per second of the best plan that drafts
  bool drafts = true;
  if (calibration_ != nullptr) {
    std::vector<std::vector<double>> priors(decodes.size());
    for (size_t i = 0; i < decodes.size(); ++i) calibration_->PositionPrior(caps[i], &priors[i]);
    absl::StatusOr<DraftLengthPlan> length = PlanDraftLength(
        shape, priors, cost_.get(), draft_cost_.get(), draft_scale_, kDraftLengthMinGain);
    if (length.ok() && length->adaptive) {
      drafts = length->length > 0;
      draft_rate = length->tokens_per_second;
    }
  } else {
    // n-gram drafts: the match length is known only after drafting; the most optimistic row
    // over match lengths bounds what any draft could be worth (B = 0 there: B = 0 for all).
    std::vector<VerifyCandidate> candidates(decodes.size());
    std::vector<double> row;
    for (size_t i = 0; i < decodes.size(); ++i) {
      std::vector<double>& best = candidates[i].prior;
      best.assign(caps[i], 0.0);
      for (int m = 1; m <= options_.max_n; ++m) {
        survival_->Survival(m, caps[i], &row);
        for (int j = 0; j < caps[i] && j < static_cast<int>(row.size()); ++j) {
          best[j] = std::max(best[j], row[j]);
        }
      }
    }
    absl::StatusOr<VerifyPlan> plan = PlanVerification(shape, candidates, cost_.get());
    if (plan.ok() && plan->adaptive) {
      drafts = plan->budget > 0;
      draft_rate = plan->tokens_per_second;
    }
  }
  if (drafts && have_overlap_overhead_) {
    const double plain =
        forward_fit_.Predict(
            cost_->StepSeconds(static_cast<double>(shape.step_tokens), shape.step_requests),
            shape.step_requests) +
        std::max(0.0, overlap_overhead_ema_);
    if (plain > 0.0 && static_cast<double>(n) / plain >= draft_rate) drafts = false;
  }
  // Measured: at this many decoding sequences, the steps the plan drafted in emitted fewer
  // tokens per second than those it did not (DraftingRateCheck).
  const bool vetoed = drafts && !rate_check_.DraftingPays(static_cast<int>(n));
  if (vetoed) drafts = false;
  if (drafts) planned_draft_since_probe_ = true;
  if (!drafts) {
    if (vetoed) ++stats_.spec_rate_vetoed_steps;
    if (calibration_ != nullptr) ++stats_.spec_no_draft_steps;
  }
  return drafts;
}

void SpeculativeController::PrepareStep(const StepPlan& plan,
                                        const std::vector<DecodeView>& decodes, bool all_known,
                                        int64_t prefill_tokens, int prefills, int64_t budget,
                                        Clock::time_point period_start, StepRecord* record,
                                        std::vector<DraftProposal>* drafts) {
  drafts->assign(decodes.size(), DraftProposal());
  if (decodes.empty()) return;
  record->timed = adaptive();
  record->start = period_start;
  if ((!plan.may_draft || all_known) && plan.fixed_length < 0) {
    // The plan's steps only (no fixed-length or no-drafting mode of the selector).
    record->decoding = static_cast<int>(decodes.size());
    record->drafting = plan.probe ? -1 : (plan.may_draft ? 1 : 0);
  }
  if (plan.mode >= 0) {
    record->mode = plan.mode;
    record->mode_measured = plan.mode_measured;
    record->mode_decoding = static_cast<int>(decodes.size());
  }
  if (plan.may_draft && all_known) {
    // Drafts take what one token per decode and the running prefills leave of the budget.
    const int64_t n = static_cast<int64_t>(decodes.size());
    const int64_t spare = std::max<int64_t>(budget - n - prefill_tokens, 0);
    Draft(decodes, spare, static_cast<int>(std::min(n + prefill_tokens, budget)),
          static_cast<int>(n) + prefills, plan.probe, plan.fixed_length, record, drafts);
  }
  if (model_drafter_ != nullptr && record->timed && options_.draft_upkeep_tokens > 0) {
    bool drafted = false;
    for (const DraftProposal& d : *drafts) drafted = drafted || !d.tokens.empty();
    if (!drafted && plan.upkeep) Upkeep(decodes, plan.upkeep_catch_up, record);
  }
}

int64_t SpeculativeController::CatchUpExcess(int64_t lag) const {
  const int64_t steady = 2 * static_cast<int64_t>(std::max(options_.draft_upkeep_tokens, 0)) +
                         options_.num_speculative_tokens + 1;
  return std::max<int64_t>(lag - steady, 0);
}

void SpeculativeController::Upkeep(const std::vector<DecodeView>& decodes, bool catch_up,
                                   StepRecord* record) {
  const int64_t lag_min = options_.draft_upkeep_tokens;
  model_drafter_->set_decoding(static_cast<int64_t>(decodes.size()));
  std::vector<DraftRequest> requests;
  int64_t lags = 0;
  int64_t excess = 0;  // beyond what steady drafting or upkeep leaves behind (CatchUpExcess)
  for (const DecodeView& seq : decodes) {
    // Feeding stops before the last known token (the next proposal feeds it for its logits).
    const int64_t lag =
        model_drafter_->Lag(seq.seq_id, static_cast<int64_t>(seq.context.size()) - 1);
    if (lag < lag_min) continue;
    const int64_t beyond = CatchUpExcess(lag);
    if (!catch_up && beyond > 0) continue;
    if (beyond > 0) {
      record->prompt_catch_up = true;
      excess += beyond;
    }
    lags += lag;
    DraftRequest r;
    r.seq_id = seq.seq_id;
    r.context = seq.context;
    requests.push_back(r);
  }
  if (requests.empty()) return;
  const int64_t fed_before = model_drafter_->computed_tokens();
  const auto t0 = Clock::now();
  absl::Status fed = model_drafter_->Feed(requests);
  const double seconds = Seconds(t0, Clock::now());
  if (!fed.ok()) spdlog::debug("speculative: draft model upkeep: {}", fed.ToString());
  stats_.spec_draft_upkeep_tokens += model_drafter_->computed_tokens() - fed_before;
  stats_.spec_draft_upkeep_seconds += seconds;
  stats_.spec_draft_skipped_tokens = model_drafter_->skipped_tokens();
  record->upkeep_seconds += seconds;
  // A catch-up fed here is part of the catch-up the selector charges drafting for.
  if (excess > 0 && lags > 0) {
    record->catch_up_seconds += seconds * static_cast<double>(excess) / static_cast<double>(lags);
  }
}

bool SpeculativeController::PlanDraftModelLength(const std::vector<DecodeView>& decodes,
                                                 const StepShape& shape, bool probe, int k,
                                                 std::vector<int>* caps, double* keep_threshold,
                                                 int* probe_seq) {
  const SpecOptions& so = options_;
  // A draft model pays for every token it drafts, verified or not: one draft length for the
  // step, chosen before drafting from the prior rows and the target's and the draft's costs.
  std::vector<std::vector<double>> priors(decodes.size());
  for (size_t i = 0; i < decodes.size(); ++i) calibration_->PositionPrior((*caps)[i], &priors[i]);
  absl::StatusOr<DraftLengthPlan> length = PlanDraftLength(
      shape, priors, cost_.get(), draft_cost_.get(), draft_scale_, kDraftLengthMinGain);
  int l = length.ok() ? length->length : k;
  if (!probe && length.ok() && model_drafter_ != nullptr &&
      static_cast<int>(decodes.size()) >= so.draft_stop_extend_min_decoding) {
    // Up to the longest L nearly as good as the best: the confidence stop below cuts each
    // sequence's draft where the next token is not worth it (SpecOptions::draft_stop_extend).
    l = ExtendDraftLength(*length, so.draft_stop_extend);
  }
  const bool no_draft = l == 0 && *std::max_element(caps->begin(), caps->end()) > 0;
  // A probe drafts one token more for one sequence: the one whose draft cache lags least (a
  // sequence not drafted for a while first feeds everything since into the draft model, which
  // for a whole batch would cost more than the probe learns). Chosen from the contexts only.
  if (probe && model_drafter_ != nullptr) {
    int64_t least = 0;
    for (size_t i = 0; i < decodes.size(); ++i) {
      if ((*caps)[i] <= 0) continue;
      const int64_t lag =
          model_drafter_->Lag(decodes[i].seq_id, static_cast<int64_t>(decodes[i].context.size()));
      if (*probe_seq < 0 || lag < least) {
        *probe_seq = static_cast<int>(i);
        least = lag;
      }
    }
  }
  for (size_t i = 0; i < caps->size(); ++i) {
    const int allowed = static_cast<int>(i) == *probe_seq || (probe && model_drafter_ == nullptr)
                            ? std::min(k, l + 1)
                            : l;
    (*caps)[i] = std::min((*caps)[i], allowed);
  }
  if ((probe ? so.probe_past_stop && l >= 1 : l > 1) && length.ok() && length->adaptive &&
      model_drafter_ != nullptr) {
    // Within the plan's L, each sequence stops drafting early once the draft's own confidence
    // (known before each token is drawn) says the next token is not worth its time: position
    // j >= 1 is drafted (and then verified) while its calibrated survival a_j is at least the
    // plan's rate x (one more verified token + its share of a draft round). A probe's sequence
    // drafts one position past its stop (ConfidenceStop).
    const double t0 = static_cast<double>(shape.step_tokens + length->budget);
    const double verify_token =
        shape.cost_scale * (cost_->StepSeconds(t0 + 1.0, shape.step_requests) -
                            cost_->StepSeconds(t0, shape.step_requests));
    const int n = static_cast<int>(decodes.size());
    const double draft_token =
        draft_cost_ != nullptr ? draft_scale_ * draft_cost_->StepSeconds(n, n) / n : 0.0;
    *keep_threshold = length->tokens_per_second * (verify_token + draft_token);
  }
  return no_draft;
}

void SpeculativeController::RunDrafter(const std::vector<DecodeView>& decodes,
                                       const std::vector<int>& caps, double keep_threshold,
                                       int probe_seq, bool probe, bool adaptive, int k,
                                       double* draft_profiled, StepRecord* record,
                                       std::vector<DraftProposal>* drafts, double* draft_seconds,
                                       int64_t* drafted) {
  // All decoding sequences are drafted together (a draft model batches its forward passes).
  std::vector<DraftRequest> requests;
  std::vector<size_t> asked;
  for (size_t i = 0; i < decodes.size(); ++i) {
    if (caps[i] <= 0) continue;
    DraftRequest r;
    r.seq_id = decodes[i].seq_id;
    r.context = decodes[i].context;
    r.k = caps[i];
    r.temperature = decodes[i].temperature;
    if (keep_threshold >= 0.0) {
      // a_j = prod_{i<=j} c(confidence_i): the first token is always drafted (the catch-up
      // round that computes it is paid once drafting is on), later ones while a_j is worth it.
      r.keep_drafting = ConfidenceStop(calibration_.get(), keep_threshold,
                                       static_cast<int>(i) == probe_seq ? 1 : 0);
    }
    requests.push_back(r);
    asked.push_back(i);
  }
  if (requests.empty()) return;
  std::vector<DraftProposal> proposals;
  const int64_t fed_before = model_drafter_ != nullptr ? model_drafter_->computed_tokens() : 0;
  if (model_drafter_ != nullptr) {
    for (const DraftRequest& r : requests) {
      const int64_t lag = model_drafter_->Lag(r.seq_id, static_cast<int64_t>(r.context.size()));
      if (CatchUpExcess(lag) > 0) record->prompt_catch_up = true;
    }
  }
  const auto t0 = Clock::now();
  absl::Status proposed = drafter_->ProposeBatch(requests, &proposals);
  *draft_seconds = Seconds(t0, Clock::now());
  if (calibration_ != nullptr) record->draft_model_seconds = *draft_seconds;
  record->draft_seconds = *draft_seconds;
  // What a steady round feeds: per sequence the tokens accepted since its last draft (at most
  // its previous draft length + the bonus token) and its new drafts. More means the draft cache
  // caught up on a whole new prompt: a one-off prefill the per-round profile does not describe.
  int64_t steady_tokens = 0;
  for (const DraftRequest& r : requests) steady_tokens += 2 * r.k + 2;
  const int64_t fed =
      model_drafter_ != nullptr ? model_drafter_->computed_tokens() - fed_before : 0;
  const bool caught_up = fed > steady_tokens;
  if (caught_up) {
    // The catch-up's share of the drafting time, by tokens fed (the selector's catch-up charge).
    record->catch_up_seconds =
        *draft_seconds * static_cast<double>(fed - steady_tokens) / static_cast<double>(fed);
  }
  if (keep_threshold >= 0.0 && draft_cost_ != nullptr) {
    // Drafts stopped by confidence ran fewer rounds than the caps: predict from the rounds each
    // sequence took part in (its tokens, plus the round whose token it declined).
    std::vector<int> rounds(requests.size(), 0);
    for (size_t i = 0; i < requests.size() && i < proposals.size(); ++i) {
      const int m = static_cast<int>(proposals[i].tokens.size());
      rounds[i] = std::min(requests[i].k, m + 1);
    }
    *draft_profiled = DraftSeconds(*draft_cost_, rounds, k);
    record->draft_predicted = draft_scale_ * *draft_profiled;
  }
  if (caught_up && selector_.has_value() && record->mode >= 0 && !record->mode_measured) {
    // Right after a change of mode: the draft model is still catching up on the steps it
    // skipped, which belongs to the change, not to the new mode's steady rate.
    selector_->StillWarming();
  }
  if (adaptive && !probe && !caught_up && *draft_profiled > 0.0 && *draft_seconds > 0.0) {
    // Learn how far real drafting is from the profile. Probes and catch-up rounds are left out:
    // they also prefill the draft cache.
    draft_scale_ = BoundedEmaStep(draft_scale_, *draft_seconds / *draft_profiled, 0.0);
  }
  if (!proposed.ok()) spdlog::debug("speculative: drafter: {}", proposed.ToString());
  for (size_t i = 0; i < asked.size() && i < proposals.size(); ++i) {
    (*drafts)[asked[i]] = std::move(proposals[i]);
    *drafted += static_cast<int64_t>((*drafts)[asked[i]].tokens.size());
  }
}

void SpeculativeController::BudgetVerification(const std::vector<DecodeView>& decodes,
                                               StepShape shape, double draft_predicted, bool probe,
                                               std::vector<int>* verify_len,
                                               const std::vector<DraftProposal>& drafts) const {
  // The budget comes from earlier steps' acceptance estimates (keyed by match length and
  // position), never from the drafted tokens themselves: lossless (budget.h). The drafting just
  // done is part of the step's time.
  std::vector<VerifyCandidate> candidates(decodes.size());
  for (size_t i = 0; i < decodes.size(); ++i) {
    if (calibration_ != nullptr) {
      // Prior from per-position rates sizes B; the current row (confidences known before each
      // token was chosen) hands out the slots.
      calibration_->PositionPrior((*verify_len)[i], &candidates[i].prior);
      if (drafts[i].confidence.size() == static_cast<size_t>((*verify_len)[i])) {
        calibration_->Survival(drafts[i].confidence, &candidates[i].current);
      }
    } else {
      survival_->Survival(drafts[i].match_length, (*verify_len)[i], &candidates[i].prior);
    }
  }
  shape.extra_seconds += draft_predicted;
  absl::StatusOr<VerifyPlan> plan = PlanVerification(shape, candidates, cost_.get());
  if (!plan.ok()) return;
  // A probe verifies one draft more than the plan per sequence: whether d_j is verified still
  // depends only on a_1..a_{j-1} of its own row.
  for (size_t i = 0; i < decodes.size(); ++i) {
    (*verify_len)[i] = std::min((*verify_len)[i], plan->verify_len[i] + (probe ? 1 : 0));
  }
}

void SpeculativeController::Draft(const std::vector<DecodeView>& decodes, int64_t spare,
                                  int step_tokens, int step_requests, bool probe, int fixed_length,
                                  StepRecord* record, std::vector<DraftProposal>* drafts) {
  const SpecOptions& so = options_;
  // A fixed-length mode of the selector drafts and verifies like the non-adaptive engine.
  const int k = fixed_length > 0 ? std::min(fixed_length, so.num_speculative_tokens)
                                 : so.num_speculative_tokens;
  const bool adaptive = this->adaptive() && fixed_length < 0;
  // Every decision below (draft length, budget, probe: Plan) uses only estimates and times from
  // earlier steps and the step count, never the drafts themselves: lossless (budget.h).
  const StepShape shape =
      SyncStepShape(static_cast<int>(decodes.size()), step_tokens, step_requests);
  probe = probe && adaptive;
  if (model_drafter_ != nullptr) model_drafter_->set_decoding(static_cast<int64_t>(decodes.size()));
  std::vector<int> caps(decodes.size());
  for (size_t i = 0; i < decodes.size(); ++i) {
    // Never draft past max_tokens: the step emits up to drafts + 1 tokens.
    caps[i] = static_cast<int>(std::clamp<int64_t>(decodes[i].room, 0, k));
  }
  // No room left in the step's token budget: nothing drafted could be verified.
  if (spare <= 0) std::fill(caps.begin(), caps.end(), 0);
  bool no_draft = false;
  double keep_threshold = -1.0;  // >= 0: draft-model drafts stop by confidence
  int probe_seq = -1;            // a probe's sequence (index into decodes), if any
  if (adaptive && calibration_ != nullptr && spare > 0) {
    no_draft = PlanDraftModelLength(decodes, shape, probe, k, &caps, &keep_threshold, &probe_seq);
  }
  double draft_profiled = 0.0;  // the round-cost table's prediction, unscaled
  if (calibration_ != nullptr && draft_cost_ != nullptr) {
    draft_profiled = DraftSeconds(*draft_cost_, caps, k);
  }
  record->draft_predicted = draft_scale_ * draft_profiled;
  double draft_seconds = 0.0;
  int64_t drafted = 0;
  RunDrafter(decodes, caps, keep_threshold, probe_seq, probe, adaptive, k, &draft_profiled, record,
             drafts, &draft_seconds, &drafted);
  std::vector<int> verify_len(decodes.size());
  for (size_t i = 0; i < decodes.size(); ++i) {
    verify_len[i] = static_cast<int>((*drafts)[i].tokens.size());
  }
  if (adaptive && drafted > 0 && keep_threshold < 0.0) {
    // (Drafts stopped by confidence are verified whole: each token was drafted only because its
    // survival, known before it was drawn, paid for its verification.)
    BudgetVerification(decodes, shape, record->draft_predicted, probe, &verify_len, *drafts);
  }
  // Whatever the plan, the step's token budget has the last word (in running order).
  for (size_t i = 0; i < decodes.size(); ++i) {
    const int64_t len = std::min<int64_t>(verify_len[i], spare);
    (*drafts)[i].tokens.resize(len);
    spare -= len;
  }
  stats_.spec_drafted_tokens += drafted;
  stats_.spec_draft_seconds += draft_seconds;
  stats_.spec_draft_predicted_seconds += record->draft_predicted;
  if (no_draft) ++stats_.spec_no_draft_steps;
  stats_.spec_draft_cost_scale = draft_scale_;
  if (model_drafter_ != nullptr) {
    stats_.spec_draft_evictions = model_drafter_->evictions();
    stats_.spec_draft_reused_tokens = model_drafter_->reused_tokens();
    stats_.spec_draft_skipped_tokens = model_drafter_->skipped_tokens();
  }
  if (probe) ++stats_.spec_probe_steps;
}

void SpeculativeController::OnVerified(int64_t seq_id, const DraftProposal& draft, int verified,
                                       int accepted) {
  ++stats_.spec_steps;
  stats_.spec_verified_tokens += verified;
  stats_.spec_accepted_tokens += accepted;
  stats_.spec_longest_verified = std::max<int64_t>(stats_.spec_longest_verified, verified);
  if (calibration_ != nullptr) {
    calibration_->Observe(draft.confidence, verified, accepted);
  } else {
    survival_->Observe(draft.match_length, verified, accepted);
  }
  drafter_->OnVerified(seq_id, draft, verified, accepted);
}

void SpeculativeController::Release(int64_t seq_id) { drafter_->Release(seq_id); }

void SpeculativeController::OnStepProcessed(const StepRecord& record, const StepOutcome& outcome,
                                            Clock::time_point processed_at) {
  if (!record.timed || cost_ == nullptr || outcome.requests <= 0) return;
  // The step's period is modelled as s x T(tokens) (the target's forward pass: the cost table
  // scaled by how much slower it runs in service) + drafting + E.
  const double measured = Seconds(record.start, processed_at);
  const double table = cost_->StepSeconds(static_cast<double>(outcome.tokens), outcome.requests);
  double& ema = record.overlapped ? overlap_overhead_ema_ : overhead_ema_;
  bool& have = record.overlapped ? have_overlap_overhead_ : have_overhead_;
  const double predicted = forward_fit_.Predict(table, outcome.requests) + record.draft_predicted +
                           (have ? std::max(0.0, ema) : 0.0);
  // Contention and contexts longer than the profile's make forward passes slower than the
  // table: by a factor, per sequence and per step (ForwardCostFit).
  forward_fit_.Observe(table, outcome.requests, outcome.forward_seconds);
  // The rest of the period: scheduling, n-gram drafting, sampling bookkeeping, output. A draft
  // model's drafting is modelled by its own table: its measured time stays out. Synchronous and
  // overlapped steps have their own overhead: the plan weighs drafting at the first against not
  // drafting at the second.
  const double sample = measured - outcome.forward_seconds - record.draft_model_seconds;
  ema = have ? BoundedEmaStep(ema, sample, 100e-6) : sample;
  have = true;
  if (record.drafting >= 0) {
    rate_check_.Observe(record.decoding, record.drafting == 1, outcome.emitted, measured);
  }
  if (selector_.has_value() && record.mode >= 0) {
    ObserveSelector(record, outcome.emitted, measured);
  }
  ++stats_.spec_timed_steps;
  stats_.spec_predicted_step_seconds += predicted;
  stats_.spec_measured_step_seconds += measured;
  stats_.spec_overhead_seconds = std::max(0.0, overhead_ema_);
  stats_.spec_overlap_overhead_seconds = std::max(0.0, overlap_overhead_ema_);
  stats_.spec_forward_scale = forward_fit_.Scale();
  stats_.spec_forward_offset_seconds = forward_fit_.offset();
  stats_.spec_forward_per_request_seconds = forward_fit_.per_request();
}

void SpeculativeController::ObserveSelector(const StepRecord& record, double emitted,
                                            double measured) {
  if (record.prompt_catch_up) ++stats_.spec_prompt_catch_up_steps;
  if (record.prompt_tokens) ++stats_.spec_select_prompt_steps;
  // No drafting is rated as it runs in a frozen bucket, without the draft model's upkeep: that
  // upkeep is a cost of keeping drafting possible, not of not drafting.
  const int length = selector_->length(record.mode);
  double seconds = measured;
  if (length == 0) seconds = std::max(measured - record.upkeep_seconds, 0.1 * measured);
  selector_->Observe(record.mode_decoding, record.mode, record.SelectorMeasured(), emitted, seconds,
                     record.catch_up_seconds);
  if (length == DraftModeSelector::kPlan) {
    ++stats_.spec_select_plan_steps;
  } else if (length > 0) {
    ++stats_.spec_select_fixed_steps;
    stats_.spec_select_longest_fixed = std::max<int64_t>(stats_.spec_select_longest_fixed, length);
  } else {
    ++stats_.spec_select_off_steps;
  }
  if (selector_->epochs() != stats_.spec_select_epochs) LogSelectorEpoch();
  stats_.spec_select_epochs = selector_->epochs();
  stats_.spec_select_explorations = selector_->explorations();
  stats_.spec_select_mode = selector_->length(selector_->current());
}

void SpeculativeController::LogSelectorEpoch() {
  const int last = selector_->last_epoch_mode();
  spdlog::debug(
      "speculative: epoch {} runs mode {} (-1: the plan); the last compared ran {} at {:.0f} "
      "tokens/s",
      selector_->epochs(), selector_->length(selector_->current()),
      last >= 0 ? selector_->length(last) : -2, selector_->last_epoch_rate());
  const DraftModeSelector::LastTrial& trial = selector_->last_trial();
  if (trial.epoch >= 0 && trial.epoch != logged_trial_epoch_) {
    logged_trial_epoch_ = trial.epoch;
    spdlog::debug(
        "speculative: trial of mode {} against {} in bucket {} ({} and {} measured steps): "
        "{:.1f}% of its rate, weight {:.2f}; rated {:.1f}%",
        selector_->length(trial.mode), selector_->length(trial.incumbent),
        DraftModeSelector::BucketName(trial.bucket), trial.steps, trial.incumbent_steps,
        100.0 * std::exp(trial.log_ratio), trial.weight, 100.0 * std::exp(trial.score));
  }
  if (selector_->epochs() % kSelectorLogEpochs == 0) {
    spdlog::info(
        "speculative: measured modes (tokens/s by decoding sequences) {}; draft model upkeep {} "
        "tokens in {:.2f} s; {} steps held in a frozen bucket's mode",
        selector_->DebugString(), stats_.spec_draft_upkeep_tokens, stats_.spec_draft_upkeep_seconds,
        selector_->held_steps());
  }
}

TraceFigures SpeculativeController::Trace(const StepRecord& record) const {
  TraceFigures t;
  t.mode_length = selector_.has_value() && record.mode >= 0 ? selector_->length(record.mode) : -2;
  t.fit_scale = forward_fit_.Scale();
  t.fit_offset_seconds = forward_fit_.offset();
  t.fit_per_request_seconds = forward_fit_.per_request();
  t.overhead_seconds = overhead_ema_;
  t.overlap_overhead_seconds = overlap_overhead_ema_;
  t.draft_scale = draft_scale_;
  return t;
}

}  // namespace deepinfer::engine::speculative
