#include "engine/speculative/mode_selector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::engine::speculative {

absl::StatusOr<DraftModeSelector> DraftModeSelector::Create(std::vector<int> modes,
                                                            const Options& options) {
  if (modes.empty()) return absl::InvalidArgumentError("mode selector: modes: expected >= 1");
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i] < kPlan) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mode selector: modes[", i, "]: expected a length >= 0 or kPlan, got ", modes[i]));
    }
    for (size_t j = 0; j < i; ++j) {
      if (modes[j] == modes[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("mode selector: modes[", i, "]: ", modes[i], " given twice"));
      }
    }
  }
  if (options.epoch_steps < 1 || !(options.epoch_seconds >= 0.0) || options.short_epoch_steps < 1 ||
      !(options.short_epoch_sequence_steps >= 0.0) || options.warmup_steps < 0 ||
      options.max_warmup_steps < options.warmup_steps || !(options.cost_decay >= 0.0) ||
      !(options.cost_decay < 1.0) || !(options.content_decay >= 0.0) ||
      !(options.content_decay < 1.0) || !(options.switch_margin >= 0.0) ||
      !(options.explore_cost > 0.0) || options.min_gap_epochs < 1 ||
      options.max_gap_epochs < options.min_gap_epochs || options.min_comparisons < 1 ||
      options.confirm_gap_epochs < 1 || options.confirm_gap_epochs > options.min_gap_epochs ||
      !(options.switch_z >= 0.0) || !(options.explore_z >= 0.0) || !(options.prior_log_sd >= 0.0) ||
      !(options.prune_below >= 0.0) || !(options.prune_below <= 1.0) ||
      !(options.freeze_below >= 0.0) || !(options.freeze_below <= 1.0) ||
      options.freeze_epochs < 1 || !(options.trial_stop_below >= 0.0) ||
      !(options.trial_stop_below <= 1.0) || !(options.trial_stop_sequence_steps >= 0.0) ||
      options.trial_run_steps < 1 || options.trial_run_unmeasured < 0 ||
      !(options.trial_run_tokens >= 0.0) || !std::isfinite(options.trial_run_tokens) ||
      options.trial_run_max_decoding < 0 || !(options.catch_up_horizon_seconds > 0.0) ||
      !(options.inherit_weight > 0.0) || !(options.inherit_weight <= 1.0) ||
      options.catch_up_delay_steps < 0) {
    return absl::InvalidArgumentError(
        "mode selector: options: expected epoch_steps >= 1, epoch_seconds >= 0, "
        "short_epoch_steps >= 1, short_epoch_sequence_steps >= 0, 0 <= "
        "warmup_steps <= max_warmup_steps, 0 <= cost_decay, content_decay < 1, switch_margin "
        ">= 0, "
        "explore_cost > 0, 1 <= min_gap_epochs <= max_gap_epochs, min_comparisons >= 1, "
        "1 <= confirm_gap_epochs <= min_gap_epochs, "
        "switch_z, explore_z, prior_log_sd >= 0, 0 <= prune_below, freeze_below <= 1, "
        "freeze_epochs >= 1, 0 <= trial_stop_below <= 1, trial_stop_sequence_steps >= 0, "
        "trial_run_steps >= 1, trial_run_unmeasured >= 0, finite trial_run_tokens >= 0, "
        "trial_run_max_decoding >= 0, "
        "catch_up_horizon_seconds > 0, 0 < "
        "inherit_weight <= 1, catch_up_delay_steps >= 0");
  }
  return DraftModeSelector(std::move(modes), options);
}

DraftModeSelector::DraftModeSelector(std::vector<int> lengths, const Options& options)
    : lengths_(std::move(lengths)), options_(options) {}

void DraftModeSelector::Spread::Add(double x, double decay, double w) {
  weight = weight * decay + w;
  weight2 = weight2 * decay * decay + w * w;
  m2 *= decay;
  const double delta = x - mean;
  mean += w * delta / weight;
  m2 += w * delta * (x - mean);
}

double DraftModeSelector::Spread::MeanVariance(double prior_var) const {
  if (weight <= 0.0) return prior_var;
  const double var = (prior_var + std::max(m2, 0.0)) / (1.0 + weight);
  return var * weight2 / (weight * weight);
}

int DraftModeSelector::Bucket(int decoding) {
  int b = 0;
  for (int cap = 1; cap < decoding && b < 30; cap *= 2) ++b;
  return b;
}

std::string DraftModeSelector::BucketName(int bucket) {
  const int hi = 1 << bucket;
  const int lo = bucket == 0 ? 1 : (1 << (bucket - 1)) + 1;
  return lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi);
}

DraftModeSelector::BucketStats& DraftModeSelector::BucketAt(int b) {
  if (buckets_.size() <= static_cast<size_t>(b)) buckets_.resize(b + 1);
  if (buckets_[b].modes.empty()) {
    // A new bucket starts from the nearest bucket with data (relative costs and tokens per step,
    // its incumbent), so it does not tour every mode again; its own measurements replace what it
    // inherited.
    const BucketStats* near = nullptr;
    for (int d = 1; d < static_cast<int>(buckets_.size()) && near == nullptr; ++d) {
      for (int nb : {b - d, b + d}) {
        if (nb >= 0 && nb < static_cast<int>(buckets_.size()) && buckets_[nb].incumbent >= 0) {
          near = &buckets_[nb];
          break;
        }
      }
    }
    BucketStats fresh;
    fresh.modes.resize(lengths_.size());
    if (near != nullptr) {
      fresh.incumbent = near->incumbent;
      for (size_t m = 0; m < fresh.modes.size(); ++m) {
        ModeStats& to = fresh.modes[m];
        const ModeStats& from = near->modes[m];
        to.cost = from.cost;
        // At most inherit_weight comparisons' worth of what the neighbour knew, of the
        // neighbour's spread.
        const double cap = options_.inherit_weight;
        to.weight = std::min(from.weight, cap);
        to.cost_spread = from.cost_spread;
        to.paired = from.paired;
        for (Spread* spread : {&to.cost_spread, &to.paired}) {
          if (spread->weight > cap) {
            spread->m2 *= cap / spread->weight;
            spread->weight = cap;
            spread->weight2 = cap * cap;
          }
        }
        // Each loser is compared here once more before a long gap is set on inherited data.
        to.comparisons = std::min(from.comparisons, options_.min_comparisons - 1.0);
        to.has_prior = from.seq_steps > 0.0 || from.has_prior;
        to.prior_log_tps = Score(*near, static_cast<int>(m)) + from.cost;
        to.epoch_seconds = from.epoch_seconds;
      }
    }
    buckets_[b] = std::move(fresh);
  }
  return buckets_[b];
}

double DraftModeSelector::CatchUpCharge(const BucketStats& bucket) const {
  if (!options_.catch_up_charge || bucket.charge_base_seconds <= 0.0) return 0.0;
  const double c = std::clamp(bucket.catch_up_seconds, 0.0, 0.9 * bucket.charge_base_seconds);
  return std::log(bucket.charge_base_seconds / (bucket.charge_base_seconds - c));
}

double DraftModeSelector::Score(const BucketStats& bucket, int mode) const {
  if (mode == bucket.incumbent) return 0.0;
  const ModeStats& s = bucket.modes[mode];
  // Catch-ups: drafting modes pay them, no drafting does not (relative to the incumbent).
  const double charge = CatchUpCharge(bucket);
  const double catch_up = (lengths_[mode] != 0 ? charge : 0.0) -
                          (bucket.incumbent >= 0 && lengths_[bucket.incumbent] != 0 ? charge : 0.0);
  if (options_.interleave) return (s.paired.weight > 0.0 ? s.paired.mean : 0.0) - catch_up;
  const ModeStats& inc = bucket.modes[bucket.incumbent];
  double log_tps = 0.0;  // log(tokens per sequence-step / the incumbent's)
  if (s.seq_steps > 0.0 && inc.seq_steps > 0.0) {
    log_tps = std::log(std::max(s.tokens / s.seq_steps, 1e-9) /
                       std::max(inc.tokens / inc.seq_steps, 1e-9));
  } else if (s.has_prior && inc.has_prior) {
    log_tps = s.prior_log_tps - inc.prior_log_tps;  // both inherited: relative to one mode
  }
  return log_tps - s.cost - catch_up;
}

double DraftModeSelector::ScoreError(const BucketStats& bucket, int mode) const {
  if (mode == bucket.incumbent) return 0.0;
  const double prior = options_.prior_log_sd * options_.prior_log_sd;
  const ModeStats& s = bucket.modes[mode];
  if (options_.interleave) return std::sqrt(s.paired.MeanVariance(prior));
  const ModeStats& inc = bucket.modes[bucket.incumbent];
  double var = s.cost_spread.MeanVariance(prior);
  // Tokens per step: each side's own epochs, or one epoch's worth when inherited.
  var += s.content_spread.MeanVariance(prior);
  var += inc.content_spread.MeanVariance(prior);
  return std::sqrt(var);
}

void DraftModeSelector::Compare(BucketStats& bucket, int mode, double observed_cost) {
  ModeStats& s = bucket.modes[mode];
  const double old = s.weight * options_.cost_decay;
  s.cost = (s.cost * old + observed_cost) / (old + 1.0);
  s.weight = old + 1.0;
  s.cost_spread.Add(observed_cost, options_.cost_decay);
  ++s.comparisons;
}

void DraftModeSelector::ComparePaired(BucketStats& bucket, int mode, double log_ratio, double w) {
  ModeStats& s = bucket.modes[mode];
  s.paired.Add(log_ratio, options_.cost_decay, w);
  s.weight = s.paired.weight;
  s.comparisons += w;
}

double DraftModeSelector::TrialWeight() const {
  if (!options_.weigh_cut_trials || EpochOver()) return 1.0;
  // Cut short by the count leaving the bucket: the thinner side's share of a whole trial.
  const int short_steps = std::min(options_.short_epoch_steps, options_.epoch_steps);
  double w = 1.0;
  for (const Side& side : side_) {
    const double by_steps = static_cast<double>(side.rate_steps) / options_.epoch_steps;
    const double by_short = std::min(static_cast<double>(side.rate_steps) / short_steps,
                                     options_.short_epoch_sequence_steps > 0.0
                                         ? side.rate_seq_steps / options_.short_epoch_sequence_steps
                                         : 1.0);
    w = std::min(w, std::max(by_steps, by_short));
  }
  return std::clamp(w, 0.0, 1.0);
}

void DraftModeSelector::MaybeSwitch(BucketStats& bucket) {
  int best = bucket.incumbent;
  double best_score = options_.switch_margin;  // the pessimistic score to beat
  for (int m = 0; m < num_modes(); ++m) {
    // One or two pairs of epochs are too noisy to hand a bucket to (a quarter-second's text
    // moves tokens per step by +-30%): a challenger takes over once compared min_comparisons
    // times here (inherited comparisons count, one short of it: BucketAt).
    if (m == bucket.incumbent || bucket.modes[m].weight <= 0.0 ||
        bucket.modes[m].comparisons < options_.min_comparisons) {
      continue;
    }
    const double score = Score(bucket, m) - options_.switch_z * ScoreError(bucket, m);
    if (score > best_score) {
      best = m;
      best_score = score;
    }
  }
  if (best == bucket.incumbent) return;
  // The mode is estimated faster than the incumbent: it becomes the incumbent, and every cost is
  // rebased on it (the old incumbent's on this mode's comparisons).
  ModeStats& s = bucket.modes[best];
  if (options_.interleave) {
    // Scores are relative to the incumbent: rebased on the new one.
    const double shift = s.paired.mean;
    for (ModeStats& m : bucket.modes) m.paired.mean -= shift;
    ModeStats& old = bucket.modes[bucket.incumbent];
    old.paired = s.paired;
    old.paired.mean = -shift;
    old.weight = s.weight;
    old.comparisons = s.comparisons;
    s.paired = Spread();
    bucket.incumbent = best;
    ++switches_;
    return;
  }
  const double shift = s.cost;
  for (ModeStats& m : bucket.modes) m.cost -= shift;
  ModeStats& old = bucket.modes[bucket.incumbent];
  old.weight = s.weight;
  old.comparisons = s.comparisons;
  old.cost_spread = s.cost_spread;  // the same comparisons, seen from the other side
  bucket.incumbent = best;
  s.cost = 0.0;
  ++switches_;
}

void DraftModeSelector::FinishEpoch() {
  if (epoch_wall_seconds_ > 0.0) {
    double& mean = BucketAt(epoch_bucket_).modes[current_].epoch_seconds;
    mean =
        mean > 0.0 ? mean + kEpochTimeWeight * (epoch_wall_seconds_ - mean) : epoch_wall_seconds_;
  }
  const int sides = partner_ >= 0 ? 2 : 1;
  for (int i = 0; i < sides; ++i) {
    const Side& side = side_[i];
    const int need = std::max(1, (side.steps + 1) / 2);  // half the epoch in its bucket
    if (side.rate_steps < need || side.rate_seconds <= 0.0 || side.rate_seq_steps <= 0.0) {
      last_ = LastEpoch();  // too little of the bucket to compare: the chain breaks here
      return;
    }
  }
  BucketStats& bucket = BucketAt(epoch_bucket_);
  for (int i = 0; i < sides; ++i) {
    const Side& side = side_[i];
    ModeStats& stats = bucket.modes[i == 0 ? current_ : partner_];
    stats.tokens = stats.tokens * options_.content_decay + side.rate_tokens;
    stats.seq_steps = stats.seq_steps * options_.content_decay + side.rate_seq_steps;
    stats.content_spread.Add(std::log(std::max(side.rate_tokens / side.rate_seq_steps, 1e-9)),
                             options_.content_decay);
  }
  // Time per sequence-step, as tokens are counted: rate = (tokens / sequence-step) / (seconds /
  // sequence-step) exactly, whatever the number of decoding sequences in each epoch.
  const Side& mine = side_[0];
  const double seconds_per_step = mine.rate_seconds / mine.rate_seq_steps;
  if (options_.interleave) {
    if (partner_ >= 0 && partner_ == bucket.incumbent) {
      // The trial: both modes' rates over the same stretch of time and text.
      const Side& theirs = side_[1];
      const double mine_tokens = mine.rate_tokens;
      const double their_tokens = theirs.rate_tokens;
      const double x = std::log(std::max(mine_tokens, 1e-9) / mine.rate_seconds /
                                (std::max(their_tokens, 1e-9) / theirs.rate_seconds));
      const double w = TrialWeight();
      ComparePaired(bucket, current_, std::clamp(x, -5.0, 5.0), w);
      last_trial_ = LastTrial{.epoch = epochs_,
                              .bucket = epoch_bucket_,
                              .mode = current_,
                              .incumbent = partner_,
                              .log_ratio = x,
                              .weight = w,
                              .steps = mine.rate_steps,
                              .incumbent_steps = theirs.rate_steps,
                              .score = Score(bucket, current_)};
      MaybeSwitch(bucket);
    }
  } else {
    if (last_.epoch == epochs_ - 1 && last_.bucket == epoch_bucket_ && last_.mode != current_) {
      // Back-to-back epochs of one bucket: c_current - c_last = log(t_current / t_last).
      const double x = std::clamp(std::log(seconds_per_step / last_.seconds_per_step), -5.0, 5.0);
      const int inc = bucket.incumbent;
      if (last_.mode == inc) {
        Compare(bucket, current_, x);
      } else if (current_ == inc) {
        Compare(bucket, last_.mode, -x);
      } else if (bucket.modes[last_.mode].weight > 0.0) {
        Compare(bucket, current_, bucket.modes[last_.mode].cost + x);
      }
    }
    MaybeSwitch(bucket);
  }
  last_.epoch = epochs_;
  last_.bucket = epoch_bucket_;
  last_.mode = current_;
  last_.rate = mine.Rate();
  last_.seconds_per_step = seconds_per_step;
}

bool DraftModeSelector::Pruned(const BucketStats& bucket, int mode) const {
  const int length = lengths_[mode];
  // The plan and no drafting are no points on the lengths' curve (see the header).
  if (length == kPlan || length == 0 || options_.prune_below <= 0.0 || bucket.incumbent < 0) {
    return false;
  }
  // Its own estimate keeps it in: the neighbour's says nothing against it.
  const double floor = std::log(options_.prune_below);
  if (mode != bucket.incumbent && bucket.modes[mode].weight > 0.0 && Score(bucket, mode) >= floor) {
    return false;
  }
  // The best draft length (none = 0 included) by its point estimate, among those with one.
  int best = -1;
  double best_score = 0.0;
  for (int m = 0; m < num_modes(); ++m) {
    if (lengths_[m] == kPlan) continue;
    if (m != bucket.incumbent && bucket.modes[m].weight <= 0.0) continue;
    const double score = Score(bucket, m);
    if (best < 0 || score > best_score) {
      best = m;
      best_score = score;
    }
  }
  if (best < 0 || mode == best) return false;
  // The neighbour on the way to the best length: the next shorter length above it, the next
  // longer one below it.
  const int best_length = lengths_[best];
  int neighbour = -1;
  for (int m = 0; m < num_modes(); ++m) {
    const int l = lengths_[m];
    if (l == kPlan) continue;
    const bool between =
        length > best_length ? (l >= best_length && l < length) : (l <= best_length && l > length);
    if (!between) continue;
    if (neighbour < 0 ||
        (length > best_length ? l > lengths_[neighbour] : l < lengths_[neighbour])) {
      neighbour = m;
    }
  }
  // The neighbour must lie strictly between: being slower than the best, it shows that the
  // peak is not beyond it (and the mode, further out, is slower still).
  if (neighbour < 0 || neighbour == best || neighbour == bucket.incumbent) return false;
  // Past a pruned neighbour, pruned too (slower than it).
  if (Pruned(bucket, neighbour)) return true;
  const ModeStats& n = bucket.modes[neighbour];
  if (n.weight <= 0.0 || n.comparisons < options_.min_comparisons) return false;
  const double optimistic =
      Score(bucket, neighbour) + options_.explore_z * ScoreError(bucket, neighbour);
  return optimistic < floor;
}

bool DraftModeSelector::Frozen(const BucketStats& bucket) const {
  const int inc = bucket.incumbent;
  if (options_.freeze_below <= 0.0 || inc < 0 || lengths_[inc] != 0) return false;
  for (int m = 0; m < num_modes(); ++m) {
    if (m == inc || Pruned(bucket, m)) continue;
    const ModeStats& s = bucket.modes[m];
    if (s.weight <= 0.0 || s.comparisons < options_.min_comparisons) return false;
    const double optimistic = Score(bucket, m) + options_.explore_z * ScoreError(bucket, m);
    if (optimistic >= std::log(options_.freeze_below)) return false;
  }
  return true;
}

namespace {
// Added to an overdue challenger's overdue epochs: it goes before every overdue loser.
constexpr double kChallengerPriority = 1e9;
}  // namespace

int DraftModeSelector::Decide(int b) {
  BucketStats& bucket = BucketAt(b);
  const int64_t epoch = bucket.epochs++;
  if (bucket.incumbent < 0) bucket.incumbent = 0;
  const int inc = bucket.incumbent;
  // Another mode runs only right after an epoch of this bucket, so it is compared at once. An
  // interleaved trial compares within itself: with trial_any_epoch also after any epoch of the
  // incumbent in this bucket, whatever ran since (see the header).
  const bool after_own = last_.epoch == epochs_ && last_.bucket == b;
  const bool any_epoch = options_.interleave && options_.trial_any_epoch;
  const bool after_own_incumbent = epoch > 0 && bucket.modes[inc].last_epoch == epoch - 1;
  const bool fresh = after_own || (any_epoch && after_own_incumbent);
  // Revisits follow an epoch of the incumbent (which then also follows them).
  const bool after_incumbent = any_epoch ? after_own_incumbent : last_.mode == inc;
  const bool frozen = Frozen(bucket);
  if (!frozen) bucket.thaw_round = -1;
  int pick = inc;
  if (fresh) {
    // First tour: modes never compared, in order, each against the epoch before it.
    for (int m = 0; m < num_modes() && pick == inc; ++m) {
      if (m != inc && bucket.modes[m].weight <= 0.0 && !Pruned(bucket, m)) pick = m;
    }
    if (pick == inc && after_incumbent && frozen) {
      // A frozen bucket revisits its losers in rounds, one after another (each after an epoch of
      // the incumbent), so the draft cache's catch-up at the first trial serves them all.
      if (bucket.thaw_round < 0) {
        bucket.thaw_round = epoch;  // just frozen: the comparisons that froze it were a round
        bucket.thaw_start = false;
      } else if (epoch - bucket.thaw_round >= options_.freeze_epochs) {
        bucket.thaw_round = epoch;
        bucket.thaw_start = true;
      }
      for (int m = 0; m < num_modes(); ++m) {
        if (m == inc || Pruned(bucket, m) || bucket.modes[m].last_epoch >= bucket.thaw_round ||
            !bucket.thaw_start) {
          continue;
        }
        if (pick == inc || bucket.modes[m].last_epoch < bucket.modes[pick].last_epoch) pick = m;
      }
      if (pick == inc) bucket.thaw_start = false;  // the round is over
    } else if (pick == inc && after_incumbent) {
      // Revisits (after an epoch of the incumbent, which then also follows them).
      double most_overdue = -1.0;
      for (int m = 0; m < num_modes(); ++m) {
        if (m == inc || Pruned(bucket, m)) continue;
        const ModeStats& s = bucket.modes[m];
        const double optimistic = Score(bucket, m) + options_.explore_z * ScoreError(bucket, m);
        const double deficit = std::max(0.0, 1.0 - std::exp(optimistic));
        // A revisit costs the deficit over the loser's epoch, in the incumbent's epochs.
        double duration = 1.0;
        const double inc_seconds = bucket.modes[inc].epoch_seconds;
        if (options_.explore_by_time && s.epoch_seconds > 0.0 && inc_seconds > 0.0) {
          duration = std::clamp(s.epoch_seconds / inc_seconds, 0.25, 4.0);
        }
        // A challenger (rated above the incumbent by more than the switch margin, short of the
        // comparisons to take over) is confirmed first and soon: see "Challengers" in the header.
        const bool challenger = s.comparisons < options_.min_comparisons && s.weight > 0.0 &&
                                Score(bucket, m) > options_.switch_margin;
        const double gap = challenger ? options_.confirm_gap_epochs
                           : s.comparisons < options_.min_comparisons
                               ? options_.min_gap_epochs * std::max(duration, 1.0)
                               : std::clamp(deficit * duration / options_.explore_cost,
                                            static_cast<double>(options_.min_gap_epochs),
                                            static_cast<double>(options_.max_gap_epochs));
        double overdue = static_cast<double>(epoch - s.last_epoch) - gap;
        if (challenger && overdue >= 0.0) overdue += kChallengerPriority;
        if (overdue >= 0.0 && overdue > most_overdue) {
          pick = m;
          most_overdue = overdue;
        }
      }
    }
  }
  bucket.modes[pick].last_epoch = epoch;
  if (pick != inc) ++explorations_;
  epoch_upkeep_ = pick != inc || !frozen;
  epoch_catch_up_ = pick != inc || lengths_[inc] != 0 || options_.off_epoch_catch_up;
  return pick;
}

bool DraftModeSelector::EpochOver() const {
  if (partner_ >= 0 && options_.trial_stop_below > 0.0) {
    // A clear loser's trial ends once each side has its short epoch's steps in the bucket,
    // covering enough sequence-steps for its deficit: trial_stop_sequence_steps x
    // log trial_stop_below / log ratio, all of them just below trial_stop_below, a third at half
    // the incumbent's rate.
    const int early = std::min(options_.short_epoch_steps, options_.epoch_steps);
    const Side& mine = side_[0];
    const Side& theirs = side_[1];
    if (mine.rate_steps >= early && theirs.rate_steps >= early && mine.rate_seconds > 0.0 &&
        theirs.rate_seconds > 0.0 && theirs.rate_tokens > 0.0) {
      const double ratio = mine.Rate() / theirs.Rate();
      if (ratio < options_.trial_stop_below) {
        const double clear =
            ratio > 0.0 ? std::log(options_.trial_stop_below) / std::log(ratio) : 0.0;
        const double need = options_.trial_stop_sequence_steps * clear;
        if (std::min(mine.rate_seq_steps, theirs.rate_seq_steps) >= need) return true;
      }
    }
  }
  for (int i = 0; i < (partner_ >= 0 ? 2 : 1); ++i) {
    const Side& side = side_[i];
    const bool enough_steps =
        side.steps >= options_.epoch_steps ||
        (side.steps >= std::min(options_.short_epoch_steps, options_.epoch_steps) &&
         side.seq_steps >= options_.short_epoch_sequence_steps);
    if (!enough_steps || side.seconds < options_.epoch_seconds) return false;
  }
  return true;
}

DraftModeSelector::Choice DraftModeSelector::Choose(int decoding) {
  const int b = Bucket(std::max(decoding, 1));
  // The count moved to a bucket that runs another mode: its incumbent takes over at once. So it
  // does where a trial runs (even one of that bucket's incumbent): the trial's partner is the
  // incumbent of the bucket it began in, whose steps would run on here, uncounted.
  const bool left = options_.follow_bucket && epoch_bucket_ >= 0 && b != epoch_bucket_ &&
                    static_cast<size_t>(b) < buckets_.size() && buckets_[b].incumbent >= 0 &&
                    (buckets_[b].incumbent != current_ || partner_ >= 0);
  // A frozen bucket's epoch without upkeep runs on through a short dip into a bucket held by a
  // drafting mode, whose first step would catch up everything the draft model skipped (see
  // "Short dips out of a frozen bucket").
  const bool dip = epoch_bucket_ >= 0 && !epoch_upkeep_ && partner_ < 0 && b != epoch_bucket_ &&
                   static_cast<size_t>(b) < buckets_.size() && buckets_[b].incumbent >= 0 &&
                   buckets_[b].incumbent != current_;
  if (!dip) {
    delay_streak_ = 0;
  } else if (delay_streak_ < options_.catch_up_delay_steps) {
    ++delay_streak_;
    ++held_steps_;
    text_run_step_ = false;
    last_unmeasured_ = false;
    Choice held;
    held.mode = current_;
    held.measured = false;
    held.upkeep = epoch_upkeep_;
    held.catch_up = epoch_catch_up_;
    return held;
  }
  if (epoch_bucket_ < 0 || EpochOver() || left) {
    if (epoch_bucket_ >= 0) FinishEpoch();
    const int mode = Decide(b);
    if (epoch_bucket_ < 0 || mode != current_) {
      warmup_left_ = options_.warmup_steps;
      warmup_taken_ = 0;
    }
    const int incumbent = BucketAt(b).incumbent;
    partner_ = options_.interleave && mode != incumbent ? incumbent : -1;
    partner_next_ = false;
    run_taken_ = 0;
    run_tokens_ = 0.0;
    // Bucket b holds up to 2^b decoding sequences.
    run_steps_ = options_.trial_run_max_decoding == 0 ||
                         (b < 30 && (int64_t{1} << b) <= options_.trial_run_max_decoding)
                     ? options_.trial_run_steps
                     : 1;
    current_ = mode;
    epoch_bucket_ = b;
    side_[0] = side_[1] = Side();
    epoch_wall_seconds_ = 0.0;
    ++epochs_;
  }
  Choice choice;
  choice.mode = current_;
  const bool warmup = warmup_left_ > 0;
  choice.measured = !warmup;
  choice.upkeep = epoch_upkeep_;
  choice.catch_up = epoch_catch_up_;
  text_run_step_ = false;
  if (warmup) {
    --warmup_left_;
    ++warmup_taken_;
  } else if (partner_ >= 0 && run_steps_ > 1 && options_.trial_run_tokens > 0) {
    // A trial in runs of text: the run's measured steps so far have their tokens (Observe); it
    // ends once they reach trial_run_tokens per decoding sequence.
    const int unmeasured = options_.trial_run_unmeasured;
    if (run_taken_ > unmeasured && run_tokens_ >= options_.trial_run_tokens) {
      run_taken_ = 0;
      run_tokens_ = 0.0;
      partner_next_ = !partner_next_;
    }
    if (partner_next_) choice.mode = partner_;
    if (run_taken_ < unmeasured) choice.measured = false;
    ++run_taken_;
    text_run_step_ = true;
  } else if (partner_ >= 0) {
    // A trial: the mode on trial and the incumbent take turns, in runs of trial_run_steps steps
    // whose first trial_run_unmeasured steps (which start from the other side's state) are not
    // measured (at least one step of each run is).
    if (partner_next_) choice.mode = partner_;
    if (run_steps_ > 1 && run_taken_ < std::min(options_.trial_run_unmeasured, run_steps_ - 1)) {
      choice.measured = false;
    }
    if (++run_taken_ >= run_steps_) {
      run_taken_ = 0;
      partner_next_ = !partner_next_;
    }
  }
  // Only a warm-up step can be extended by StillWarming (not a run's first step).
  last_unmeasured_ = warmup;
  return choice;
}

void DraftModeSelector::StillWarming() {
  if (last_unmeasured_ && warmup_taken_ + warmup_left_ < options_.max_warmup_steps) {
    warmup_left_ = std::max(warmup_left_, 1);
  }
}

void DraftModeSelector::Observe(int decoding, int mode, bool measured, double tokens,
                                double seconds, double catch_up_seconds) {
  if (decoding < 1 || mode < 0 || mode >= num_modes() || !(tokens >= 0.0) || !(seconds > 0.0) ||
      !std::isfinite(tokens) || !std::isfinite(seconds)) {
    return;
  }
  if (mode == current_) epoch_wall_seconds_ += seconds;
  // A run of text counts its side's measured steps (Choose switches sides before the step, so
  // partner_next_ still names the run's side). Counting the unmeasured first steps as well would
  // leave a long draft's runs on easy text mostly unmeasured: one step of 8 tokens unmeasured,
  // one measured, against 1 of k = 1's 8.
  if (measured && text_run_step_ && partner_ >= 0 &&
      mode == (partner_next_ ? partner_ : current_)) {
    run_tokens_ += tokens / decoding;
  }
  if (options_.catch_up_charge) {
    // Measured while a drafting mode holds the bucket, the cost it pays there: a trial's
    // catch-up (after the incumbent's steps without drafts) is what that one trial costs, and
    // would charge drafting for every revisit of a frozen bucket.
    const size_t b = static_cast<size_t>(Bucket(decoding));
    if (b < buckets_.size() && buckets_[b].incumbent >= 0 && lengths_[buckets_[b].incumbent] != 0) {
      BucketStats& bucket = buckets_[b];
      const double charged = !measured && lengths_[mode] != 0 && std::isfinite(catch_up_seconds)
                                 ? std::clamp(catch_up_seconds, 0.0, seconds)
                                 : 0.0;
      const double keep = std::exp(-seconds / options_.catch_up_horizon_seconds);
      bucket.charge_base_seconds = bucket.charge_base_seconds * keep + seconds;
      bucket.catch_up_seconds = bucket.catch_up_seconds * keep + charged;
    }
  }
  if (!measured) return;
  Side* side = mode == current_ ? &side_[0] : (mode == partner_ ? &side_[1] : nullptr);
  if (side == nullptr) return;
  ++side->steps;
  side->seq_steps += decoding;
  side->seconds += seconds;
  if (Bucket(decoding) == epoch_bucket_) {
    side->rate_tokens += tokens;
    side->rate_seconds += seconds;
    ++side->rate_steps;
    side->rate_seq_steps += decoding;
  }
}

int DraftModeSelector::Incumbent(int decoding) const {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  return b < buckets_.size() ? buckets_[b].incumbent : -1;
}

double DraftModeSelector::Relative(int decoding, int mode) const {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  if (b >= buckets_.size() || mode < 0 || mode >= num_modes() || buckets_[b].incumbent < 0) {
    return 0.0;
  }
  if (mode == buckets_[b].incumbent) return 1.0;
  return buckets_[b].modes[mode].weight > 0.0 ? std::exp(Score(buckets_[b], mode)) : 0.0;
}

std::string DraftModeSelector::DebugString() const {
  std::string out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const BucketStats& bucket = buckets_[b];
    if (bucket.incumbent < 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", BucketName(static_cast<int>(b)),
                    Frozen(bucket) ? " (frozen)" : "", ":");
    for (int m = 0; m < num_modes(); ++m) {
      const int l = lengths_[m];
      absl::StrAppend(&out, " ", l == kPlan ? "plan" : (l == 0 ? "off" : absl::StrCat("k", l)),
                      " ");
      if (m == bucket.incumbent) {
        absl::StrAppend(&out, "100*");
      } else if (bucket.modes[m].weight > 0.0) {
        absl::StrAppend(&out, std::lround(100.0 * std::exp(Score(bucket, m))));
      } else {
        absl::StrAppend(&out, "-");
      }
    }
  }
  return out;
}

}  // namespace deepinfer::engine::speculative
