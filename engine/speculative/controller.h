// The speculative-decoding controller: everything the engine (engine/llm_engine.h) needs to
// decide, draft and learn for speculative decoding, behind a small per-step interface.
//
// It owns the drafter (n-gram or draft model), the acceptance estimates (NgramSurvivalStats or
// DraftCalibration), the cost tables (profiled at creation or given), the forward-cost fit, the
// per-step overhead averages, the probe schedule, the measured-rate check and the mode selector
// (mode_selector.h). It knows the engine's sequences only through DecodeView and the engine's
// steps only through StepRecord (which the engine stores beside each step) and StepOutcome.
//
// One step, as the engine drives it (scheduler thread):
//   1. Plan(decodes, ...)        before scheduling: may the step draft (then the engine first
//                                processes the step in flight), does it probe, which mode.
//   2. PrepareStep(plan, ...)    while scheduling: the drafts of each decoding sequence (within
//                                the step's spare token budget), or a draft model's upkeep.
//   3. OnVerified(...)           per sequence whose drafts the step verified.
//   4. OnStepProcessed(...)      once the step's outputs are processed: timing, estimates, stats.
//   Release(seq_id)              when a sequence finishes or is preempted.
// Every decision in 1 and 2 uses only earlier steps' estimates and times and the step count,
// never the drafts being verified, so verification stays lossless (budget.h).
//
// Units: seconds (double) for times, tokens for counts, time points from std::chrono::
// steady_clock. Thread-safety: not thread-safe; the engine calls every method from its scheduler
// thread. Failures: Create returns kInvalidArgument naming the SpecOptions field for bad options
// or a draft model that does not load; a cost profile that fails only turns the adaptive plan
// off (every draft is verified, with a warning). A drafter error during a step drafts nothing
// for that step (logged at debug level); decoding goes on without drafts.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_CONTROLLER_H_
#define DEEPINFER_ENGINE_SPECULATIVE_CONTROLLER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/speculative/budget.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/mode_selector.h"
#include "engine/speculative/options.h"
#include "engine/speculative/stats.h"

namespace deepinfer::engine::speculative {

class ModelDrafter;

// What the controller needs to know of the engine it serves (EngineOptions and the model).
struct EngineLimits {
  int vocab_size = 0;
  int num_blocks = 0;  // KV cache blocks of block_size tokens
  int block_size = 0;
  int max_batch_tokens = 0;  // token budget per step
  int max_running = 0;       // sequences in the running batch
  int64_t max_position_embeddings = 0;
  uint64_t hash_seed = 0;  // seeds a draft model's sampling
  // Tokens the backend's projections multiply per pass over the weights (0: not a CPU backend).
  int rows_per_pass = 0;
};

// Runs one decode-like forward pass on the target for the cost profile: `requests` sequences,
// each with a context of `context` cached tokens, feed `tokens` new tokens in all (spread evenly)
// with logits for every one; returns its wall time in seconds. Called only by Create.
using ProfileStepFn =
    std::function<absl::StatusOr<double>(int tokens, int requests, int64_t context)>;

// A decoding sequence as the controller sees it: exactly one known token to feed next.
struct DecodeView {
  int64_t seq_id = 0;
  absl::Span<const int32_t> context;  // prompt + generated tokens so far
  float temperature = 0.0f;
  // Draft tokens it may still take: max_tokens - generated - samples in flight - 1 (a step
  // emits up to drafts + 1 tokens; never past max_tokens).
  int64_t room = 0;
};

// The controller's decision for the next step (Plan).
struct StepPlan {
  bool may_draft = false;  // false: the step is scheduled like one without speculation
  bool probe = false;      // verify one draft more than the adaptive plan (probe_interval)
  // The mode selector's choice: its mode index (-1 without one), whether the step is measured,
  // and for a fixed-length mode that length (-1: the adaptive plan decides).
  int mode = -1;
  bool mode_measured = false;
  int fixed_length = -1;
  // Whether a step that drafts nothing feeds the draft model (upkeep), and whether that feeding
  // also catches up sequences far behind.
  bool upkeep = true;
  bool upkeep_catch_up = true;
};

// The controller's record of one step, kept by the engine beside the step from PrepareStep to
// OnStepProcessed. The engine sets `overlapped` (and `start` then) and `prompt_tokens`; the
// controller fills the rest.
struct StepRecord {
  // Adaptive: the step's period is timed, from `start` (the previous step's processing, or its
  // scheduling after an idle engine) through its own processing.
  bool timed = false;
  std::chrono::steady_clock::time_point start;
  // Ran on the executor while the next step was scheduled (no drafts): its overhead feeds the
  // overlapped-step average.
  bool overlapped = false;
  // The step also computes prompt tokens (a prefill chunk beside the decodes): left out of the
  // selector's measurements.
  bool prompt_tokens = false;
  double draft_predicted = 0.0;      // predicted drafting seconds (draft model)
  double draft_model_seconds = 0.0;  // measured drafting seconds of a draft model
  double draft_seconds = 0.0;        // measured drafting seconds, any drafter
  // The measured-rate check: decoding sequences when planned, and whether the plan drafted (1),
  // did not (0), or the step is not compared (-1: a probe, or a selector's fixed mode).
  int decoding = 0;
  int drafting = -1;
  // The selector's mode for the step (-1: none), whether it is measured, and the decoding
  // sequences when it was planned.
  int mode = -1;
  bool mode_measured = false;
  int mode_decoding = 0;
  // The draft model caught up on a whole prompt in this step: left out of the selector's
  // measurements (a per-request cost of every mode).
  bool prompt_catch_up = false;
  double upkeep_seconds = 0.0;    // feeding the draft model while drafting nothing
  double catch_up_seconds = 0.0;  // of drafting and upkeep, catching up beyond a steady round
  // Whether the selector counts this step.
  bool SelectorMeasured() const { return mode_measured && !prompt_catch_up && !prompt_tokens; }
};

// What a processed step did (OnStepProcessed).
struct StepOutcome {
  int64_t tokens = 0;            // tokens the step computed
  int requests = 0;              // sequences in the step
  double forward_seconds = 0.0;  // the measured forward pass (and sampling)
  double emitted = 0.0;          // tokens emitted: one per sampling sequence + accepted drafts
};

// The controller's estimates a step-trace log line reports.
struct TraceFigures {
  int mode_length = -2;  // the step's selector mode's draft length (-1: plan), -2: none
  double fit_scale = 1.0;
  double fit_offset_seconds = 0.0;
  double fit_per_request_seconds = 0.0;
  double overhead_seconds = 0.0;
  double overlap_overhead_seconds = 0.0;
  double draft_scale = 1.0;
};

class SpeculativeController {
 public:
  // Validates `options` (enabled), builds the drafter (loads a draft model), and with `adaptive`
  // takes the cost tables (given, or profiled through `profile_step` and the draft model) and
  // sets up the mode selector. `drafter` (optional, for tests): used instead of the one
  // `options.drafter` names, as a drafter without a draft model.
  static absl::StatusOr<std::unique_ptr<SpeculativeController>> Create(
      const SpecOptions& options, const EngineLimits& limits, const ProfileStepFn& profile_step,
      std::unique_ptr<Drafter> drafter = nullptr);
  SpeculativeController(const SpeculativeController&) = delete;
  SpeculativeController& operator=(const SpeculativeController&) = delete;
  ~SpeculativeController();

  // Whether the next step may draft, from earlier steps only. `decodes`: the decoding sequences
  // the step will have once the step in flight (if any) is processed; `prefill_tokens` and
  // `prefills`: the tokens and sequences of the prompts it continues.
  StepPlan Plan(const std::vector<DecodeView>& decodes, int64_t prefill_tokens, int prefills);

  // Fills `record` and, when `plan.may_draft` and `all_known` (nothing in flight: every decode's
  // latest token is in its context), `*drafts` (resized to decodes.size(); empty proposals
  // elsewhere) with the drafts each decoding sequence verifies this step, within the `budget`
  // tokens the step has left before the decodes and `prefill_tokens` are planned. A draft model
  // that drafts nothing this step may be fed instead (upkeep). `period_start`: where the step's
  // timed period begins.
  void PrepareStep(const StepPlan& plan, const std::vector<DecodeView>& decodes, bool all_known,
                   int64_t prefill_tokens, int prefills, int64_t budget,
                   std::chrono::steady_clock::time_point period_start, StepRecord* record,
                   std::vector<DraftProposal>* drafts);

  // The step verified `draft` (as PrepareStep proposed it, trimmed to what was planned) for
  // `seq_id`: `verified` tokens checked, the first `accepted` of them accepted.
  void OnVerified(int64_t seq_id, const DraftProposal& draft, int verified, int accepted);

  // The step recorded in `record` was processed at `processed_at`: learns the overhead, the
  // forward-cost fit, the rate check and the selector's rates from its period.
  void OnStepProcessed(const StepRecord& record, const StepOutcome& outcome,
                       std::chrono::steady_clock::time_point processed_at);

  // Forgets a finished or preempted sequence's drafter state.
  void Release(int64_t seq_id);

  const SpecStats& stats() const { return stats_; }
  TraceFigures Trace(const StepRecord& record) const;

 private:
  SpeculativeController(const SpecOptions& options, const EngineLimits& limits);
  absl::Status Init(const ProfileStepFn& profile_step, std::unique_ptr<Drafter> drafter);
  absl::Status InitAdaptive(const ProfileStepFn& profile_step);
  absl::Status ProfileCost(const ProfileStepFn& profile_step);
  void ProfileDraftCost();
  absl::Status CreateSelector();

  bool adaptive() const { return options_.adaptive && cost_ != nullptr; }
  // The per-step overhead (seconds, >= 0) of a synchronous step.
  double SyncOverheadSeconds() const;
  // The planner's view of a synchronous (drafting) step.
  StepShape SyncStepShape(int sampling_requests, int step_tokens, int step_requests) const;
  // Plan's adaptive part: whether the estimates say drafting pays for the step.
  bool PlanDrafts(const std::vector<DecodeView>& decodes, const std::vector<int>& caps,
                  int64_t prefill_tokens, int prefills);
  void Draft(const std::vector<DecodeView>& decodes, int64_t spare, int step_tokens,
             int step_requests, bool probe, int fixed_length, StepRecord* record,
             std::vector<DraftProposal>* drafts);
  // Draft's parts: the draft-model length plan (sets `keep_threshold`, `probe_seq`), the
  // drafter call, and the adaptive verification budget.
  bool PlanDraftModelLength(const std::vector<DecodeView>& decodes, const StepShape& shape,
                            bool probe, int k, std::vector<int>* caps, double* keep_threshold,
                            int* probe_seq);
  void RunDrafter(const std::vector<DecodeView>& decodes, const std::vector<int>& caps,
                  double keep_threshold, int probe_seq, bool probe, bool adaptive, int k,
                  double* draft_profiled, StepRecord* record, std::vector<DraftProposal>* drafts,
                  double* draft_seconds, int64_t* drafted);
  void BudgetVerification(const std::vector<DecodeView>& decodes, StepShape shape,
                          double draft_predicted, bool probe, std::vector<int>* verify_len,
                          const std::vector<DraftProposal>& drafts) const;
  // A draft model, a step that drafts nothing: feeds the sequences whose draft KV lags by
  // draft_upkeep_tokens or more (with `catch_up` false only those within the steady bound).
  void Upkeep(const std::vector<DecodeView>& decodes, bool catch_up, StepRecord* record);
  // Of a lag of the draft KV behind the context, the tokens beyond what steady drafting or the
  // upkeep leaves behind (2 x draft_upkeep_tokens + k + 1); > 0: a whole-prompt catch-up.
  int64_t CatchUpExcess(int64_t lag) const;
  void ObserveSelector(const StepRecord& record, double emitted, double measured);
  void LogSelectorEpoch();

  const SpecOptions options_;
  const EngineLimits limits_;
  std::unique_ptr<Drafter> drafter_;
  ModelDrafter* model_drafter_ = nullptr;  // drafter_ when it is a draft model
  std::unique_ptr<NgramSurvivalStats> survival_;
  std::unique_ptr<DraftCalibration> calibration_;  // draft model: instead of survival_
  std::unique_ptr<CostTable> cost_;                // null: verify every draft
  int64_t cost_context_ = 0;                       // the context the profile ran at; 0: given
  std::unique_ptr<CostTable> draft_cost_;          // draft model round cost; null: free
  // The step period outside the target's forward pass and a draft model's drafting, averaged:
  // synchronous (drafting) steps and overlapped ones apart.
  double overhead_ema_ = 0.0;
  bool have_overhead_ = false;
  double overlap_overhead_ema_ = 0.0;
  bool have_overlap_overhead_ = false;
  ForwardCostFit forward_fit_;
  // Measured tokens/s of drafting and non-drafting plan steps by batch size; vetoes the plan's
  // drafting where it measured slower.
  DraftingRateCheck rate_check_;
  std::optional<DraftModeSelector> selector_;
  int64_t logged_trial_epoch_ = -1;  // the selector's last trial already logged
  int steps_since_probe_ = 0;
  // Steps between probes now (probe_interval, doubled while no plan drafted in between, up to
  // kMaxProbeBackoff x), and whether a plan drafted since the last probe.
  static constexpr int kMaxProbeBackoff = 16;
  int probe_gap_ = 0;
  bool planned_draft_since_probe_ = false;
  double draft_scale_ = 1.0;  // measured / profiled drafting time of the draft model, averaged
  SpecStats stats_;
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_CONTROLLER_H_
