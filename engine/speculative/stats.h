// Counters and estimates of speculative decoding, exported through EngineStats (whose spec_*
// fields they are). All 0 (or their initial value) when speculation is off. Plain data: the
// controller fills its copy on the scheduler thread and the engine copies it under its lock.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_STATS_H_
#define DEEPINFER_ENGINE_SPECULATIVE_STATS_H_

#include <cstdint>
#include <vector>

namespace deepinfer::engine::speculative {

struct SpecStats {
  int64_t spec_steps = 0;             // steps that verified at least one draft token
  int64_t spec_drafted_tokens = 0;    // tokens the drafter proposed (capped by k and max_tokens)
  int64_t spec_verified_tokens = 0;   // of those, fed to the model for verification
  int64_t spec_accepted_tokens = 0;   // of those, accepted
  bool spec_adaptive_active = false;  // adaptive budget in use (a usable cost table exists)
  int64_t spec_cost_context = 0;      // the context the cost table was profiled at; 0: given
  // Adaptive steps with decoding sequences: their predicted time (forward scale x cost table +
  // overhead + predicted drafting, with the estimates before the step), their measured time
  // (period through output processing; SpecOptions::adaptive), and the current per-step overhead
  // estimate of synchronous steps in the objective (average of the period - the measured forward
  // pass - measured draft-model drafting, clamped >= 0).
  int64_t spec_timed_steps = 0;
  double spec_predicted_step_seconds = 0.0;
  double spec_measured_step_seconds = 0.0;
  double spec_overhead_seconds = 0.0;
  // Drafting time: measured (the drafter's calls) and, for a draft model, predicted.
  double spec_draft_seconds = 0.0;
  double spec_draft_predicted_seconds = 0.0;
  double spec_draft_cost_scale = 1.0;  // draft model: measured / profiled drafting, averaged
  // Measured target forward time ~= scale x profiled + offset + per_request x requests
  // (speculative::ForwardCostFit).
  double spec_forward_scale = 1.0;
  double spec_forward_offset_seconds = 0.0;
  double spec_forward_per_request_seconds = 0.0;
  int64_t spec_no_draft_steps = 0;  // draft model, adaptive: steps that chose L = 0
  // Draft model: sequences whose draft KV was evicted to make room (SpecOptions::draft_num_blocks)
  int64_t spec_draft_evictions = 0;
  // Draft model: context tokens whose draft KV a new request adopted from a finished one's
  int64_t spec_draft_reused_tokens = 0;
  // Draft model: context tokens never fed to it, skipped by SpecOptions::draft_catch_up_window
  int64_t spec_draft_skipped_tokens = 0;
  // Draft model, adaptive: context tokens fed to the draft model on steps that drafted nothing
  // (SpecOptions::draft_upkeep_tokens), and the time spent feeding them.
  int64_t spec_draft_upkeep_tokens = 0;
  double spec_draft_upkeep_seconds = 0.0;
  // Adaptive with select_mode and a draft model: steps in which the draft model caught up on a
  // whole prompt, left out of the selector's measurements (a per-request cost of every mode).
  int64_t spec_prompt_catch_up_steps = 0;
  int64_t spec_probe_steps = 0;  // adaptive steps that probed (probe_interval)
  // Adaptive: steps the plan would have drafted in but did not, because drafting steps measured
  // fewer tokens/s than non-drafting ones at that many decoding sequences (DraftingRateCheck).
  int64_t spec_rate_vetoed_steps = 0;
  // Adaptive with select_mode (speculative::DraftModeSelector): steps run by the plan, at a fixed
  // draft length and without drafting; epochs; epochs given to a mode that was not the best
  // measured; the current epoch's mode (-1: the plan, else its fixed draft length, 0: none).
  int64_t spec_select_plan_steps = 0;
  int64_t spec_select_fixed_steps = 0;
  int64_t spec_select_off_steps = 0;
  // Steps of the selector's modes that also computed prompt tokens (a local prefill's chunk):
  // left out of its measurements.
  int64_t spec_select_prompt_steps = 0;
  int64_t spec_select_epochs = 0;
  int64_t spec_select_explorations = 0;
  int64_t spec_select_mode = -1;
  // The longest fixed draft length a selector step ran (0: none), and the most draft tokens one
  // sequence verified in one step (any mode).
  int64_t spec_select_longest_fixed = 0;
  int64_t spec_longest_verified = 0;
  // The fixed draft lengths the selector measures against the plan, ascending (empty: no
  // selector; SpecOptions::select_max_length).
  std::vector<int> spec_select_lengths;
  // Adaptive with overlap: the per-step overhead of overlapped steps (no drafts), averaged as
  // spec_overhead_seconds but over the time between consecutive steps' completions; the plan
  // compares drafting (synchronous, spec_overhead_seconds) against not drafting at this cost.
  double spec_overlap_overhead_seconds = 0.0;
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_STATS_H_
