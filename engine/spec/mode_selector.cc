#include "engine/spec/mode_selector.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::engine::spec {

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
  if (options.epoch_steps < 1 || !(options.epoch_seconds >= 0.0) || options.warmup_steps < 0 ||
      !(options.memory_seconds > 0.0) || !(options.explore_cost > 0.0) ||
      options.min_gap_epochs < 1 || options.max_gap_epochs < options.min_gap_epochs) {
    return absl::InvalidArgumentError(
        "mode selector: options: expected epoch_steps >= 1, epoch_seconds >= 0, warmup_steps >= "
        "0, memory_seconds > 0, explore_cost > 0, 1 <= min_gap_epochs <= max_gap_epochs");
  }
  return DraftModeSelector(std::move(modes), options);
}

DraftModeSelector::DraftModeSelector(std::vector<int> lengths, const Options& options)
    : lengths_(std::move(lengths)), options_(options) {}

int DraftModeSelector::Bucket(int decoding) {
  int b = 0;
  for (int cap = 1; cap < decoding && b < 30; cap *= 2) ++b;
  return b;
}

DraftModeSelector::BucketStats& DraftModeSelector::BucketOf(int decoding) {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  BucketStats& bucket = buckets_[b];
  if (bucket.modes.empty()) bucket.modes.resize(lengths_.size());
  return bucket;
}

int DraftModeSelector::Decide(BucketStats& bucket) {
  const int64_t epoch = bucket.epochs++;
  const int n = num_modes();
  for (int m = 0; m < n; ++m) {
    if (bucket.modes[m].seconds <= 0.0) return m;  // never measured here: run it first
  }
  int best = 0;
  double best_rate = -1.0;
  for (int m = 0; m < n; ++m) {
    const double rate = bucket.modes[m].tokens / bucket.modes[m].seconds;
    if (rate > best_rate) {
      best = m;
      best_rate = rate;
    }
  }
  int pick = best;
  double most_overdue = -1.0;
  for (int m = 0; m < n; ++m) {
    if (m == best) continue;
    const ModeStats& s = bucket.modes[m];
    const double rate = s.tokens / s.seconds;
    const double deficit = best_rate > 0.0 ? std::max(0.0, 1.0 - rate / best_rate) : 0.0;
    const double gap =
        std::clamp(deficit / options_.explore_cost, static_cast<double>(options_.min_gap_epochs),
                   static_cast<double>(options_.max_gap_epochs));
    const double overdue = static_cast<double>(epoch - s.last_epoch) - gap;
    if (overdue >= 0.0 && overdue > most_overdue) {
      pick = m;
      most_overdue = overdue;
    }
  }
  if (pick != best) ++explorations_;
  return pick;
}

DraftModeSelector::Choice DraftModeSelector::Choose(int decoding) {
  const bool epoch_over =
      epoch_steps_ >= options_.epoch_steps && epoch_seconds_ >= options_.epoch_seconds;
  if (!started_ || epoch_over) {
    BucketStats& bucket = BucketOf(decoding);
    const int64_t epoch = bucket.epochs;
    const int mode = Decide(bucket);
    bucket.modes[mode].last_epoch = epoch;
    if (!started_ || mode != current_) warmup_left_ = options_.warmup_steps;
    started_ = true;
    current_ = mode;
    epoch_steps_ = 0;
    epoch_seconds_ = 0.0;
    ++epochs_;
  }
  Choice choice;
  choice.mode = current_;
  choice.measured = warmup_left_ <= 0;
  if (warmup_left_ > 0) --warmup_left_;
  return choice;
}

void DraftModeSelector::Observe(int decoding, int mode, bool measured, double tokens,
                                double seconds) {
  if (decoding < 1 || mode < 0 || mode >= num_modes() || !(tokens >= 0.0) || !(seconds > 0.0) ||
      !std::isfinite(tokens) || !std::isfinite(seconds)) {
    return;
  }
  if (mode == current_) {
    ++epoch_steps_;
    epoch_seconds_ += seconds;
  }
  if (!measured) return;
  ModeStats& s = BucketOf(decoding).modes[mode];
  const double keep = std::exp(-seconds / options_.memory_seconds);
  s.tokens = s.tokens * keep + tokens;
  s.seconds = s.seconds * keep + seconds;
}

double DraftModeSelector::Rate(int decoding, int mode) const {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  if (b >= buckets_.size() || mode < 0 || mode >= num_modes() || buckets_[b].modes.empty() ||
      buckets_[b].modes[mode].seconds <= 0.0) {
    return 0.0;
  }
  return buckets_[b].modes[mode].tokens / buckets_[b].modes[mode].seconds;
}

}  // namespace deepinfer::engine::spec
