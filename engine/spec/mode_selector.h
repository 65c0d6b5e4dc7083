#ifndef DEEPINFER_ENGINE_SPEC_MODE_SELECTOR_H_
#define DEEPINFER_ENGINE_SPEC_MODE_SELECTOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer::engine::spec {

// Measured selection of how the adaptive engine drafts: the per-step plan (budget.h) against
// fixed draft lengths and no drafting at all.
//
// The plan predicts each step's time from models, and some costs stay outside any per-step
// model: a draft model that skipped steps first catches up on every token it missed, drafting
// steps run synchronously instead of overlapped, the machine's speed drifts. Steady fixed-length
// drafting (k = 1, say) can then realise more tokens per second than the plan's intermittent
// drafting, or none than either. So the engine runs in *modes* (0: no drafting; a fixed length
// L: draft L tokens per sequence, verify all; the plan) for *epochs* of at least `epoch_steps`
// steps and `epoch_seconds` of measured time, and measures each mode's realised tokens per second
// (tokens emitted over measured step periods) per bucket of decoding-sequence count (1, 2, 3-4,
// 5-8, ..., powers of two). The first `warmup_steps` steps after a change of mode are run but
// not measured (a draft model's catch-up, the switch between overlapped and synchronous steps
// belong to the change, not to the mode's steady rate). A mode's sums decay with its own measured
// time (factor exp(-seconds / memory_seconds)), so its rate follows the last seconds it ran.
//
// At each epoch's start (for the bucket of the step that starts it): a mode never measured in
// the bucket runs first (in the order given); otherwise the best measured mode runs, except
// that a losing mode with deficit d = 1 - rate / best_rate is revisited for one epoch once
// clamp(d / explore_cost, min_gap_epochs, max_gap_epochs) epochs of the bucket have passed since
// it last ran (most overdue first): each loser then costs about explore_cost of the run, modes
// close to the best are revisited often (they may have overtaken it), bad ones rarely.
//
// Lossless: the mode of a step depends only on earlier steps' measurements and counts.
// Not thread-safe: one caller (the engine's scheduler thread).
class DraftModeSelector {
 public:
  // The plan's mode in `lengths` (any other value >= 0 is a fixed draft length, 0 none).
  static constexpr int kPlan = -1;

  struct Options {
    int epoch_steps = 16;         // >= 1
    double epoch_seconds = 0.25;  // >= 0
    int warmup_steps = 2;         // >= 0
    double memory_seconds = 1.0;  // > 0
    double explore_cost = 0.005;  // > 0
    int min_gap_epochs = 4;       // >= 1
    int max_gap_epochs = 256;     // >= min_gap_epochs
  };

  struct Choice {
    int mode = 0;          // index into the modes given to Create
    bool measured = true;  // false for the warm-up steps after a change of mode
  };

  // `modes`: the modes' draft lengths (kPlan, 0 or a fixed length), distinct, non-empty.
  static absl::StatusOr<DraftModeSelector> Create(std::vector<int> modes, const Options& options);

  // The mode of the next step, which has `decoding` (>= 1) decoding sequences. Starts a new
  // epoch (for that count's bucket) when the current one has run its steps and seconds.
  Choice Choose(int decoding);
  // A step that ran in mode `mode` (as Choose returned it) with `decoding` decoding sequences:
  // its emitted tokens (>= 0) and measured period (> 0 seconds); `measured` as Choose said.
  // Counts toward the epoch either way; only measured steps feed the rates. Invalid values and
  // unknown modes are ignored.
  void Observe(int decoding, int mode, bool measured, double tokens, double seconds);

  int num_modes() const { return static_cast<int>(lengths_.size()); }
  int length(int mode) const { return lengths_[mode]; }
  // Measured rate of a mode in the bucket of `decoding` (0 without data).
  double Rate(int decoding, int mode) const;
  // The current epoch's mode.
  int current() const { return current_; }
  int64_t epochs() const { return epochs_; }
  int64_t explorations() const { return explorations_; }  // epochs run by a losing mode
  static int Bucket(int decoding);

 private:
  struct ModeStats {
    double tokens = 0.0;
    double seconds = 0.0;
    int64_t last_epoch = -1;  // the bucket's epoch count when the mode last started an epoch
  };
  struct BucketStats {
    std::vector<ModeStats> modes;
    int64_t epochs = 0;
  };
  DraftModeSelector(std::vector<int> lengths, const Options& options);
  BucketStats& BucketOf(int decoding);
  int Decide(BucketStats& bucket);

  std::vector<int> lengths_;
  Options options_;
  std::vector<BucketStats> buckets_;
  int current_ = 0;
  bool started_ = false;
  int epoch_steps_ = 0;         // steps observed in the current epoch
  double epoch_seconds_ = 0.0;  // their measured time
  int warmup_left_ = 0;         // Choose calls left unmeasured after a change
  int64_t epochs_ = 0;
  int64_t explorations_ = 0;
};

}  // namespace deepinfer::engine::spec

#endif  // DEEPINFER_ENGINE_SPEC_MODE_SELECTOR_H_
