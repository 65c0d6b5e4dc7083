#ifndef DEEPINFER_ENGINE_SPECULATIVE_MODE_SELECTOR_H_
#define DEEPINFER_ENGINE_SPECULATIVE_MODE_SELECTOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer::engine::speculative {

// Measured selection of how the adaptive engine drafts: the per-step plan (budget.h) against
// fixed draft lengths and no drafting at all. The design, and the measurements behind every option
// and default, are in docs/speculative-decoding.md ("Mode selector").
//
// The plan predicts each step's time from models, and some costs stay outside any per-step model
// (a draft model catching up, synchronous drafting steps, contexts beyond the profile), so the
// engine runs in *modes* (the plan = kPlan; a fixed length L: draft L tokens per sequence and
// verify all; 0: no drafting) and this class picks, per bucket of decoding-sequence count (1, 2,
// 3-4, 5-8, ... powers of two), the mode that realises the most tokens per second:
//
// - Epochs: a mode runs for at least `epoch_steps` measured steps and `epoch_seconds` of measured
//   time (or `short_epoch_steps` covering `short_epoch_sequence_steps` sequence-steps); the first
//   `warmup_steps` after a change of mode (more while StillWarming says so, up to
//   `max_warmup_steps`) run unmeasured. An epoch belongs to the bucket of the step that started
//   it; with `follow_bucket` it ends early when the count enters a bucket held by another mode.
// - Incumbent and trials: each bucket has an incumbent mode. Every other mode is measured in
//   *trials* (`interleave`): one epoch whose steps alternate between it and the incumbent (in runs
//   of `trial_run_steps` steps, or of `trial_run_tokens` tokens per sequence, up to
//   `trial_run_max_decoding` sequences; `trial_run_unmeasured` first steps of each run left out),
//   giving one observation of log(its rate / the incumbent's); a mode's score is their mean
//   (weight `cost_decay` on older ones). Without interleave, adjacent epochs are compared, rates
//   split into tokens per step (averaged, `content_decay`) and seconds per step (compared).
// - Switching: a mode compared `min_comparisons` times whose score (minus `switch_z` standard
//   errors) exceeds `switch_margin` becomes the incumbent; scores are rebased on it.
// - Exploration: a loser with deficit d is revisited after clamp(d / `explore_cost`,
//   `min_gap_epochs`, `max_gap_epochs`) epochs of its bucket (weighed by its epochs' duration with
//   `explore_by_time`); a challenger short of min_comparisons after `confirm_gap_epochs`. A trial
//   whose mode runs below `trial_stop_below` of the incumbent ends early once each side covers
//   `trial_stop_sequence_steps` x log(trial_stop_below) / log(ratio) sequence-steps.
// - Pruning: draft lengths past a neighbour measured below `prune_below` of the incumbent (on the
//   way to the best length) are neither toured nor revisited; no drafting and the plan never are.
// - Freezing: a bucket whose incumbent drafts nothing and whose other modes all measure below
//   `freeze_below` of it freezes: Choice::upkeep turns off (no draft-model upkeep), and its losers
//   are revisited together every `freeze_epochs` epochs; a trial above freeze_below thaws it.
//   `catch_up_delay_steps`: short dips of the count out of a frozen bucket keep its mode.
// - Catch-up charge (`catch_up_charge`): while a drafting mode holds a bucket, the catch-up time of
//   drafting modes' unmeasured steps (Observe's catch_up_seconds, decayed over
//   `catch_up_horizon_seconds`) lowers every drafting mode's score against no drafting.
// - A new bucket inherits its nearest bucket's incumbent and scores (as at most
//   `inherit_weight` comparisons); trials cut short by the count leaving the bucket weigh as the
//   share of a trial they ran (`weigh_cut_trials`).
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
    // An epoch also ends (its seconds run) after short_epoch_steps measured steps once they cover
    // short_epoch_sequence_steps sequence-steps (steps x decoding sequences): a step of 32
    // sequences measures tokens per sequence-step as well as 32 steps of one, and takes 20-30
    // times as long on a CPU, so 16 of them would make epochs of seconds and learning slow.
    int short_epoch_steps = 4;                  // >= 1 (above epoch_steps: epoch_steps)
    double short_epoch_sequence_steps = 128.0;  // >= 0
    int warmup_steps = 2;                       // >= 0
    int max_warmup_steps = 16;                  // >= warmup_steps: with StillWarming
    double cost_decay = 0.9;                    // in [0, 1)
    double content_decay = 0.95;                // in [0, 1)
    double switch_margin = 0.01;                // >= 0
    // Uncertainty and pruning (in the docs): standard errors in a switch's pessimistic score and a
    // revisit's optimistic one, the sd of one observation assumed before (and blended with) the
    // measured spread, and the relative rate below which a neighbour prunes the lengths past
    // it. Off by default (point estimates, every loser revisited): docs: "Defaults".
    double switch_z = 0.0;        // >= 0
    double explore_z = 0.0;       // >= 0
    double prior_log_sd = 0.25;   // >= 0
    double prune_below = 0.9;     // in [0, 1]; 0: no pruning
    bool explore_by_time = true;  // revisit gaps weighed by the epochs' wall time (docs)
    // An epoch ends early when the decoding count enters a bucket whose incumbent is another
    // mode (docs).
    bool follow_bucket = true;
    // Revisits and tours are interleaved trials (docs); false: adjacent epochs are compared.
    bool interleave = true;
    // With interleave: a trial may start at any epoch of its bucket (a revisit: one right after
    // an epoch of the incumbent there), not only right after a finished epoch of the same
    // bucket (in the docs); false: only then, as adjacent epochs need.
    bool trial_any_epoch = true;
    double trial_stop_below = 0.8;  // in [0, 1]: trials of clear losers end early; 0: never
    // ... and only once each side's steps cover this many sequence-steps (steps x decoding
    // sequences) x log(trial_stop_below) / log(its ratio) (docs).
    double trial_stop_sequence_steps = 32.0;  // >= 0
    // A trial alternates runs of this many steps of each side, the first step of each run left
    // unmeasured when above 1; 1: single steps, every one measured.
    int trial_run_steps = 3;  // >= 1
    // Of each run (trial_run_steps above 1), this many first steps are not measured (at most
    // trial_run_steps - 1): docs: "Runs of steps and the step before".
    int trial_run_unmeasured = 1;  // >= 0 (0: every step; docs: "Runs of text")
    // > 0: a run lasts until its measured steps have emitted this many tokens per decoding
    // sequence instead of trial_run_steps steps, where runs apply (trial_run_max_decoding): see
    // "Runs of text". 0: runs of steps.
    double trial_run_tokens = 0.0;  // >= 0, finite
    // Runs of trial_run_steps only in buckets of at most this many decoding sequences (single
    // steps above); 0: every bucket. Docs: "Runs only where steps are cheap".
    int trial_run_max_decoding = 4;  // >= 0
    double freeze_below = 0.99;      // in [0, 1]: frozen buckets (docs); 0: none
    int freeze_epochs = 512;         // >= 1: their revisits' gap, in epochs of the bucket
    double explore_cost = 0.002;     // > 0: five losers cost about 1% of a long run
    int min_gap_epochs = 4;          // >= 1
    int max_gap_epochs = 128;        // >= min_gap_epochs
    // A loser compared fewer times than this is revisited after min_gap_epochs whatever its
    // deficit, and a challenger takes over only once compared this many times: one pair of
    // epochs is too noisy to set a long gap on, or to hand the bucket to.
    int min_comparisons = 3;  // >= 1
    // A challenger short of min_comparisons is revisited after this many epochs of the bucket,
    // before any loser that is due (docs: "Challengers").
    int confirm_gap_epochs = 1;  // in [1, min_gap_epochs]
    // Catch-up charge (docs), and the step time (seconds, > 0) over which its figures decay
    // (weight exp(-t / horizon) on what is t seconds of the bucket's steps old, counted while a
    // drafting mode holds it).
    bool catch_up_charge = true;
    double catch_up_horizon_seconds = 30.0;
    // What a new bucket inherits of its neighbour's scores counts as this many comparisons (at
    // most; in (0, 1]) against the bucket's own (docs: "The first bucket").
    double inherit_weight = 1.0;
    // A trial cut short by the count leaving its bucket weighs as the share of a whole trial's
    // steps its thinner side ran (docs: "Trials cut short"); false: as a whole trial.
    bool weigh_cut_trials = true;
    // Whether the upkeep of an incumbent's epochs that draft nothing also catches up sequences
    // far behind (Choice::catch_up; docs: "Catching up while not drafting").
    bool off_epoch_catch_up = true;
    // Entry delay (docs: "Short dips out of a frozen bucket"): while a frozen bucket's
    // incumbent epoch runs without upkeep, a count that moves to a bucket held by a drafting mode
    // hands over only after this many consecutive steps there; 0: at once.
    int catch_up_delay_steps = 8;  // >= 0
  };

  struct Choice {
    int mode = 0;          // index into the modes given to Create
    bool measured = true;  // false for the warm-up steps after a change of mode
    // Whether a step that drafts nothing should keep a draft model's cache up to date: false
    // in a frozen bucket's epochs of its incumbent (in the docs).
    bool upkeep = true;
    // With upkeep: whether it also feeds sequences far behind (a whole new prompt, or what a
    // frozen bucket skipped); false in the epochs of an incumbent that drafts nothing when
    // off_epoch_catch_up is off.
    bool catch_up = true;
  };

  // `modes`: the modes' draft lengths (kPlan, 0 or a fixed length), distinct, non-empty.
  static absl::StatusOr<DraftModeSelector> Create(std::vector<int> modes, const Options& options);

  // The mode of the next step, which has `decoding` (>= 1) decoding sequences. Ends the current
  // epoch and starts one (for that count's bucket) once the current one has run its measured
  // steps and seconds.
  Choice Choose(int decoding);
  // A step that ran in mode `mode` (as Choose returned it) with `decoding` decoding sequences:
  // its emitted tokens (>= 0) and measured period (> 0 seconds); `measured` as Choose said.
  // Only measured steps count toward the epoch; only those of the epoch's mode and bucket feed
  // its rate. Invalid values and unknown modes are ignored. `catch_up_seconds` (in [0, seconds]):
  // of the period, the time a draft model spent catching up beyond a steady round (docs: "Catch-up
  // charge"); counted only for an unmeasured step of a drafting mode (a measured step's
  // rate already holds it) in a bucket whose incumbent drafts.
  void Observe(int decoding, int mode, bool measured, double tokens, double seconds,
               double catch_up_seconds = 0.0);
  // The step Choose last returned as unmeasured (a warm-up step) was still paying for the change
  // of mode (a draft model catching up on the tokens of steps it skipped, more than a steady
  // round feeds): the next step is left out too, up to max_warmup_steps after the change.
  void StillWarming();

  int num_modes() const { return static_cast<int>(lengths_.size()); }
  int length(int mode) const { return lengths_[mode]; }
  // In the bucket of `decoding`: the incumbent (-1 before any epoch there), and a mode's
  // estimated rate relative to it, exp(score) (1 for the incumbent, 0 if never compared).
  int Incumbent(int decoding) const;
  double Relative(int decoding, int mode) const;
  // The current epoch's mode (in an interleaved trial the mode on trial).
  int current() const { return current_; }
  // In an interleaved trial the incumbent it alternates with, else -1.
  int partner() const { return partner_; }
  int64_t epochs() const { return epochs_; }
  int64_t explorations() const { return explorations_; }  // epochs run by a non-incumbent
  int64_t switches() const { return switches_; }          // changes of incumbent
  // Steps a frozen bucket's epoch ran on in another bucket (catch_up_delay_steps).
  int64_t held_steps() const { return held_steps_; }
  // The rate (tokens/s) of the last finished epoch that could be compared, and its mode (-1:
  // none). For logs.
  double last_epoch_rate() const { return last_.rate; }
  int last_epoch_mode() const { return last_.mode; }
  // The last finished interleaved trial (epoch -1: none yet): its epoch, bucket, mode on trial
  // and the incumbent it alternated with, its observation log(rate / the incumbent's) and weight,
  // each side's measured steps in the bucket, and the mode's score right after it (before any
  // switch). For logs.
  struct LastTrial {
    int64_t epoch = -1;
    int bucket = -1;
    int mode = -1;
    int incumbent = -1;
    double log_ratio = 0.0;
    double weight = 0.0;
    int steps = 0;
    int incumbent_steps = 0;
    double score = 0.0;
  };
  const LastTrial& last_trial() const { return last_trial_; }
  static int Bucket(int decoding);
  // A bucket's decoding counts, "1", "3-4", "17-32".
  static std::string BucketName(int bucket);
  // Per bucket with data: each mode's rate relative to the incumbent in percent, the incumbent
  // marked with '*', e.g. "1: plan 91 k1 100* k2 97 off 70; 5-8: ...". For logs.
  std::string DebugString() const;

 private:
  // Exponentially weighted mean and spread of observations (weighted Welford), each new one of
  // weight 1, older ones decayed.
  struct Spread {
    double weight = 0.0;   // sum of weights
    double weight2 = 0.0;  // sum of squared weights (the mean's effective number: w^2 / w2)
    double mean = 0.0;
    double m2 = 0.0;  // sum of weight x (x - mean)^2
    // One observation x of weight w (in (0, 1]).
    void Add(double x, double decay, double w = 1.0);
    // Squared standard error of the mean, the variance blended with one pseudo-observation of
    // `prior_var`; prior_var when empty.
    double MeanVariance(double prior_var) const;
  };
  static constexpr double kEpochTimeWeight = 0.3;
  struct ModeStats {
    double cost = 0.0;       // log(seconds per step / the incumbent's), averaged
    double weight = 0.0;     // decayed number of comparisons (0: never compared)
    double comparisons = 0;  // undecayed; a trial counts as its weight (weigh_cut_trials)
    Spread cost_spread;      // of the comparisons (its mean shifts with rebasing; not used)
    Spread content_spread;   // of its epochs' log(tokens per sequence-step)
    Spread paired;           // interleave: its trials' log(rate / the incumbent's)
    double tokens = 0.0;     // emitted tokens and sequence-steps (steps x decoding sequences)
    double seq_steps = 0.0;  // of its epochs (content_decay)
    // Inherited from a neighbouring bucket (until own data): log(tokens per sequence-step)
    // relative to that bucket's incumbent's.
    bool has_prior = false;
    double prior_log_tps = 0.0;
    int64_t last_epoch = -1;  // the bucket's epoch count when the mode last ran an epoch
    // Mean wall time of its epochs begun in this bucket (every step of the epoch's mode, warm-up
    // included; weight kEpochTimeWeight on the newest), 0 before the first.
    double epoch_seconds = 0.0;
  };
  struct BucketStats {
    std::vector<ModeStats> modes;
    int incumbent = -1;
    int64_t epochs = 0;  // epochs of this bucket
    // Frozen: the epoch at which the latest round of revisits began, and whether it runs.
    int64_t thaw_round = -1;
    bool thaw_start = false;
    // Catch-up charge: decayed time of the bucket's steps while a drafting mode was its
    // incumbent, and of it the drafting modes' unmeasured steps' catch-up time.
    double charge_base_seconds = 0.0;
    double catch_up_seconds = 0.0;
  };
  // The last finished epoch whose rate could be compared (global epoch index).
  struct LastEpoch {
    int64_t epoch = -1;
    int bucket = -1;
    int mode = -1;
    double rate = 0.0;  // tokens per second
    double seconds_per_step = 0.0;
  };
  DraftModeSelector(std::vector<int> lengths, const Options& options);
  BucketStats& BucketAt(int b);
  int Decide(int b);
  void FinishEpoch();
  void Compare(BucketStats& bucket, int mode, double observed_cost);
  // Interleaved trials: one observation of `mode`'s log rate relative to the incumbent, of
  // weight w in (0, 1] (weigh_cut_trials).
  void ComparePaired(BucketStats& bucket, int mode, double log_ratio, double w);
  // The weight of the trial now ending (weigh_cut_trials): 1 if it ran whole.
  double TrialWeight() const;
  // Whether the epoch has run its steps and seconds (each side of a trial).
  bool EpochOver() const;
  void MaybeSwitch(BucketStats& bucket);
  double Score(const BucketStats& bucket, int mode) const;
  // log(T / (T - C)) of the catch-up charge (0 without one): what a drafting mode's score loses
  // against no drafting in the bucket.
  double CatchUpCharge(const BucketStats& bucket) const;
  // Whether the bucket is frozen (in the docs).
  bool Frozen(const BucketStats& bucket) const;
  // Whether a fixed length is pruned (in the docs) in this bucket.
  bool Pruned(const BucketStats& bucket, int mode) const;
  // The standard error of Score (0 for the incumbent).
  double ScoreError(const BucketStats& bucket, int mode) const;

  std::vector<int> lengths_;
  Options options_;
  std::vector<BucketStats> buckets_;
  int current_ = 0;
  int epoch_bucket_ = -1;  // -1 before the first epoch
  // One mode's measured steps in the current epoch.
  struct Side {
    int steps = 0;             // measured steps
    double seq_steps = 0.0;    // their sequence-steps
    double seconds = 0.0;      // their time
    double rate_tokens = 0.0;  // tokens and seconds of those in the epoch's bucket
    double rate_seconds = 0.0;
    int rate_steps = 0;
    double rate_seq_steps = 0.0;
    // Tokens per second in the epoch's bucket (rate_seconds > 0).
    double Rate() const { return rate_tokens / rate_seconds; }
  };
  Side side_[2];                     // the epoch's mode, and in a trial its partner
  int partner_ = -1;                 // interleaved trial: the incumbent alternated with
  bool partner_next_ = false;        // whose turn after the warm-up: the partner's
  int run_taken_ = 0;                // steps of the current side's run (trial_run_steps)
  int run_steps_ = 1;                // the current epoch's run length (trial_run_max_decoding)
  double run_tokens_ = 0.0;          // tokens per decoding sequence of the run (trial_run_tokens)
  bool text_run_step_ = false;       // the step Choose last returned belongs to a run of text
  bool epoch_upkeep_ = true;         // Choice::upkeep of the epoch's steps
  bool epoch_catch_up_ = true;       // Choice::catch_up of the epoch's steps
  double epoch_wall_seconds_ = 0.0;  // every step of the epoch's mode, measured or not
  int warmup_left_ = 0;              // Choose calls left unmeasured after a change
  int warmup_taken_ = 0;             // of them, returned since the change
  bool last_unmeasured_ = false;     // the latest Choose returned measured = false
  LastEpoch last_;
  LastTrial last_trial_;
  int64_t epochs_ = 0;
  int64_t explorations_ = 0;
  int64_t switches_ = 0;
  int delay_streak_ = 0;  // consecutive steps held (catch_up_delay_steps)
  int64_t held_steps_ = 0;
};

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_MODE_SELECTOR_H_
