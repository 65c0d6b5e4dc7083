#include "engine/speculative/budget.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer::engine::speculative {

// --- Estimators -----------------------------------------------------------------------------

RateEstimator::RateEstimator(double prior_mean, double prior_weight, double decay)
    : prior_mean_(prior_mean), prior_weight_(prior_weight), decay_(decay) {}

void RateEstimator::Observe(bool success) {
  successes_ = successes_ * decay_ + (success ? 1.0 : 0.0);
  total_ = total_ * decay_ + 1.0;
}

double RateEstimator::Mean() const {
  return (successes_ + prior_mean_ * prior_weight_) / (total_ + prior_weight_);
}

namespace {

// Cumulative products of conditional acceptances: non-increasing by construction.
void Cumulate(std::vector<double>* a) {
  double run = 1.0;
  for (double& c : *a) c = run *= std::clamp(c, 0.0, 1.0);
}

template <typename Fn>
void ForOutcomes(int verified, int accepted, Fn fn) {
  for (int j = 0; j < accepted; ++j) fn(j, true);
  if (accepted < verified) fn(accepted, false);
}

}  // namespace

NgramSurvivalStats::NgramSurvivalStats(int max_match_length, const SurvivalOptions& options)
    : max_match_length_(std::max(1, max_match_length)),
      options_(options),
      cells_(static_cast<size_t>(max_match_length_) * std::max(1, options.max_positions),
             RateEstimator(options.prior_mean, options.prior_weight, options.decay)) {
  options_.max_positions = std::max(1, options_.max_positions);
}

RateEstimator& NgramSurvivalStats::Cell(int match_length, int position) {
  const int m = std::clamp(match_length, 1, max_match_length_) - 1;
  const int p = std::clamp(position, 0, options_.max_positions - 1);
  return cells_[m * options_.max_positions + p];
}

const RateEstimator& NgramSurvivalStats::Cell(int match_length, int position) const {
  return const_cast<NgramSurvivalStats*>(this)->Cell(match_length, position);
}

void NgramSurvivalStats::Survival(int match_length, int k, std::vector<double>* a) const {
  a->resize(std::max(0, k));
  for (int j = 0; j < k; ++j) (*a)[j] = Cell(match_length, j).Mean();
  Cumulate(a);
}

void NgramSurvivalStats::Observe(int match_length, int verified, int accepted) {
  ForOutcomes(verified, accepted, [&](int j, bool ok) { Cell(match_length, j).Observe(ok); });
}

DraftCalibration::DraftCalibration(const CalibrationOptions& options)
    : options_(options),
      accepted_(std::max(1, options.bins), 0.0),
      seen_(std::max(1, options.bins), 0.0),
      positions_(std::max(1, options.positions.max_positions),
                 RateEstimator(options.positions.prior_mean, options.positions.prior_weight,
                               options.positions.decay)) {
  options_.bins = std::max(1, options_.bins);
  Refit();
}

void DraftCalibration::Refit() {
  // Pool-adjacent-violators over the bins, each bin shrunk towards its centre (the identity).
  const int n = options_.bins;
  struct Block {
    double sum, weight;
    int count;
  };
  std::vector<Block> blocks;
  for (int i = 0; i < n; ++i) {
    const double centre = (i + 0.5) / n;
    Block b{accepted_[i] + options_.prior_weight * centre, seen_[i] + options_.prior_weight, 1};
    while (!blocks.empty() && blocks.back().sum / blocks.back().weight >= b.sum / b.weight) {
      b.sum += blocks.back().sum;
      b.weight += blocks.back().weight;
      b.count += blocks.back().count;
      blocks.pop_back();
    }
    blocks.push_back(b);
  }
  fitted_.clear();
  for (const Block& b : blocks) fitted_.insert(fitted_.end(), b.count, b.sum / b.weight);
}

double DraftCalibration::Conditional(double confidence) const {
  const int bin = std::clamp(static_cast<int>(confidence * options_.bins), 0, options_.bins - 1);
  return std::clamp(fitted_[bin], 0.0, 1.0);
}

void DraftCalibration::Survival(absl::Span<const float> confidence, std::vector<double>* a) const {
  a->resize(confidence.size());
  for (size_t j = 0; j < confidence.size(); ++j) (*a)[j] = Conditional(confidence[j]);
  Cumulate(a);
}

void DraftCalibration::PositionPrior(int k, std::vector<double>* a) const {
  a->resize(std::max(0, k));
  const int last = static_cast<int>(positions_.size()) - 1;
  for (int j = 0; j < k; ++j) (*a)[j] = positions_[std::min(j, last)].Mean();
  Cumulate(a);
}

void DraftCalibration::Observe(absl::Span<const float> confidence, int verified, int accepted) {
  verified = std::min<int>(verified, confidence.size());
  accepted = std::min(accepted, verified);
  const int last = static_cast<int>(positions_.size()) - 1;
  ForOutcomes(verified, accepted, [&](int j, bool ok) {
    for (int i = 0; i < options_.bins; ++i) {
      accepted_[i] *= options_.decay;
      seen_[i] *= options_.decay;
    }
    const int bin =
        std::clamp(static_cast<int>(confidence[j] * options_.bins), 0, options_.bins - 1);
    accepted_[bin] += ok ? 1.0 : 0.0;
    seen_[bin] += 1.0;
    positions_[std::min(j, last)].Observe(ok);
  });
  Refit();
}

// --- Cost table -----------------------------------------------------------------------------

double CostTable::Row::Eval(double t) const {
  const size_t n = tokens.size();
  if (n == 1 || t <= tokens[0]) return seconds[0];
  const size_t hi = std::upper_bound(tokens.begin(), tokens.end(), t) - tokens.begin();
  if (hi < n) {
    const double slope = (seconds[hi] - seconds[hi - 1]) / (tokens[hi] - tokens[hi - 1]);
    return seconds[hi - 1] + slope * (t - tokens[hi - 1]);
  }
  // At or beyond the last point: the slope back to the last point at or below half its tokens.
  const size_t last = n - 1;
  size_t lo = 0;
  for (size_t i = 0; i < last; ++i) {
    if (2 * tokens[i] <= tokens[last]) lo = i;
  }
  const double slope = (seconds[last] - seconds[lo]) / (tokens[last] - tokens[lo]);
  return seconds[last] + slope * (t - tokens[last]);
}

absl::StatusOr<CostTable> CostTable::FromSamples(absl::Span<const Sample> samples, int min_runs) {
  if (min_runs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost table min_runs: expected >= 1, got ", min_runs));
  }
  if (samples.empty()) return absl::InvalidArgumentError("cost table: expected samples, got none");
  std::map<std::pair<int, int>, std::vector<double>> shapes;  // (requests, tokens) -> times
  for (const Sample& s : samples) {
    if (s.tokens < 0 || s.requests < 1 || !std::isfinite(s.seconds) || s.seconds <= 0.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cost table sample: expected tokens >= 0, requests >= 1, finite seconds > 0; got tokens ",
          s.tokens, ", requests ", s.requests, ", seconds ", s.seconds));
    }
    shapes[{s.requests, s.tokens}].push_back(s.seconds);
  }
  CostTable table;
  for (auto& [shape, times] : shapes) {
    if (static_cast<int>(times.size()) < min_runs) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost table shape (tokens ", shape.second, ", requests ", shape.first,
                       "): expected >= ", min_runs, " samples, got ", times.size()));
    }
    std::sort(times.begin(), times.end());
    const size_t m = times.size();
    const double median = m % 2 ? times[m / 2] : 0.5 * (times[m / 2 - 1] + times[m / 2]);
    if (table.rows_.empty() || table.rows_.back().requests != shape.first) {
      table.rows_.push_back(Row{shape.first, {}, {}});
    }
    table.rows_.back().tokens.push_back(shape.second);
    table.rows_.back().seconds.push_back(median);
  }
  // Monotone: each request count at least the one below where that one was measured (beyond its
  // last point, at least that point: never its extrapolation), then a running maximum along
  // tokens.
  for (size_t r = 0; r < table.rows_.size(); ++r) {
    Row& row = table.rows_[r];
    for (size_t i = 0; i < row.tokens.size(); ++i) {
      if (r > 0) {
        const Row& below = table.rows_[r - 1];
        const double bound =
            row.tokens[i] >= below.tokens.back() ? below.seconds.back() : below.Eval(row.tokens[i]);
        row.seconds[i] = std::max(row.seconds[i], bound);
      }
      if (i > 0) row.seconds[i] = std::max(row.seconds[i], row.seconds[i - 1]);
    }
  }
  return table;
}

double CostTable::StepSeconds(double tokens, int requests) const {
  if (requests <= rows_.front().requests) return rows_.front().Eval(tokens);
  if (requests >= rows_.back().requests) return rows_.back().Eval(tokens);
  size_t hi = 1;
  while (rows_[hi].requests < requests) ++hi;
  const Row& a = rows_[hi - 1];
  const Row& b = rows_[hi];
  const double w = static_cast<double>(requests - a.requests) / (b.requests - a.requests);
  return (1.0 - w) * a.Eval(tokens) + w * b.Eval(tokens);
}

bool CostTable::IsFlat(double tolerance) const {
  for (const Row& row : rows_) {
    if (row.tokens.size() >= 2 && row.seconds.back() > row.seconds.front() * (1.0 + tolerance)) {
      return false;
    }
  }
  return true;
}

std::string CostTable::DebugString() const {
  std::string out;
  for (const Row& row : rows_) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "requests ", row.requests, ":");
    for (size_t i = 0; i < row.tokens.size(); ++i) {
      absl::StrAppend(&out, " ", row.tokens[i], "->", absl::StrFormat("%.6g", row.seconds[i]));
    }
  }
  return out;
}

ForwardCostFit::ForwardCostFit(double decay, double min_scale, double max_scale)
    : decay_(decay), min_scale_(min_scale), max_scale_(max_scale) {}

void ForwardCostFit::Observe(double predicted_seconds, int requests, double measured_seconds) {
  if (!(std::isfinite(predicted_seconds) && predicted_seconds > 0.0 &&
        std::isfinite(measured_seconds) && measured_seconds > 0.0 && requests >= 1)) {
    return;
  }
  const double x[3] = {1.0, predicted_seconds * 1e3, static_cast<double>(requests)};
  const double y = measured_seconds * 1e3;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xx_[i][j] = decay_ * xx_[i][j] + x[i] * x[j];
    xy_[i] = decay_ * xy_[i] + x[i] * y;
  }
  ++observations_;
  Refit();
}

namespace {

// Solves the normal equations restricted to the regressors in `use` (indices into x = (1, T,
// n)) by Gaussian elimination with partial pivoting; false when they are ill-conditioned (the
// determinant, relative to the product of the diagonal, below 1e-4: the data do not separate
// them).
bool SolveSubset(const double xx[3][3], const double xy[3], const std::vector<int>& use,
                 double coef[3]) {
  const int m = static_cast<int>(use.size());
  double a[3][4];
  double diag = 1.0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) a[i][j] = xx[use[i]][use[j]];
    a[i][m] = xy[use[i]];
    diag *= a[i][i];
  }
  if (!(diag > 0.0)) return false;
  double det = 1.0;
  for (int c = 0; c < m; ++c) {
    int pivot = c;
    for (int r = c + 1; r < m; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (a[pivot][c] == 0.0) return false;
    if (pivot != c) {
      for (int k = 0; k <= m; ++k) std::swap(a[c][k], a[pivot][k]);
      det = -det;
    }
    det *= a[c][c];
    for (int r = c + 1; r < m; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k <= m; ++k) a[r][k] -= f * a[c][k];
    }
  }
  if (std::abs(det) / diag < 1e-4) return false;
  double sol[3] = {0.0, 0.0, 0.0};
  for (int r = m - 1; r >= 0; --r) {
    double v = a[r][m];
    for (int k = r + 1; k < m; ++k) v -= a[r][k] * sol[k];
    sol[r] = v / a[r][r];
  }
  coef[0] = coef[1] = coef[2] = 0.0;
  for (int i = 0; i < m; ++i) coef[use[i]] = sol[i];
  return true;
}

}  // namespace

void ForwardCostFit::Refit() {
  const double ratio = xy_[0] / xx_[0][1];  // mean measured / mean T
  static const std::vector<std::vector<int>> kModels = {{0, 1, 2}, {0, 1}, {1, 2}, {1}};
  for (const std::vector<int>& use : kModels) {
    double coef[3];
    if (observations_ < static_cast<int>(use.size())) continue;
    if (!SolveSubset(xx_, xy_, use, coef)) continue;
    const bool last = use.size() == 1;
    if (!last && (coef[0] < 0.0 || coef[2] < 0.0 || coef[1] < 0.5 * ratio)) continue;
    if (!std::isfinite(coef[0] + coef[1] + coef[2])) continue;
    scale_ = std::clamp(coef[1], min_scale_, max_scale_);
    offset_ = coef[0] * 1e-3;
    per_request_ = coef[2] * 1e-3;
    return;
  }
}

std::vector<std::pair<int, int>> CostProfileShapes(int k, int max_requests, int rows_per_pass,
                                                   int max_edges, int edge_requests,
                                                   const std::function<bool(int, int)>& fits) {
  std::vector<std::pair<int, int>> shapes;
  for (int r : {1, std::min(8, max_requests), std::min(32, max_requests)}) {
    if (r < 1 || (!shapes.empty() && shapes.back().second == r)) break;
    std::vector<int> row;
    for (int m = 1;; m = std::min(2 * m, k + 1)) {
      row.push_back(r * m);
      if (m >= k + 1) break;
    }
    if (rows_per_pass > 1 && r <= edge_requests) {
      int edges = 0;
      for (int e = (r + rows_per_pass - 1) / rows_per_pass * rows_per_pass;
           e <= r * (k + 1) && edges < max_edges; e += rows_per_pass) {
        for (int t : {e, e + 1}) {
          if (t <= r * (k + 1) && edges < max_edges) {
            row.push_back(t);
            ++edges;
          }
        }
      }
    }
    std::sort(row.begin(), row.end());
    row.erase(std::unique(row.begin(), row.end()), row.end());
    for (int tokens : row) {
      if (!fits(tokens, r)) break;
      shapes.emplace_back(tokens, r);
    }
  }
  return shapes;
}

absl::StatusOr<CostTable> ProfileCostTable(
    const std::function<absl::StatusOr<double>(int tokens, int requests)>& run_step,
    absl::Span<const std::pair<int, int>> shapes, int runs, int warm_runs, double warm_seconds) {
  if (runs < 5) {
    return absl::InvalidArgumentError(absl::StrCat("cost profile runs: expected >= 5, got ", runs));
  }
  if (warm_runs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost profile warm-up runs: expected >= 0, got ", warm_runs));
  }
  auto profile = [&]() -> absl::StatusOr<CostTable> {
    std::vector<CostTable::Sample> samples;
    for (int i = 0; i < runs; ++i) {
      for (const auto& [tokens, requests] : shapes) {
        double warmed = 0.0;
        for (int w = 0; w < warm_runs && (w == 0 || warmed < warm_seconds); ++w) {
          absl::StatusOr<double> warm = run_step(tokens, requests);
          if (!warm.ok()) return warm.status();
          warmed += *warm;
        }
        absl::StatusOr<double> t = run_step(tokens, requests);
        if (!t.ok()) return t.status();
        samples.push_back({tokens, requests, *t});
      }
    }
    return CostTable::FromSamples(samples, runs);
  };
  absl::StatusOr<CostTable> table = profile();
  // A flat table from a backend that is not flat: the first shapes ran slow (a busy machine),
  // and the running maximum carried that to every larger one. Measure once more.
  if (table.ok() && table->IsFlat()) table = profile();
  return table;
}

// --- Budget ---------------------------------------------------------------------------------

namespace {

const std::vector<double>& Current(const VerifyCandidate& c) {
  return c.current.empty() ? c.prior : c.current;
}

absl::Status CheckRow(const std::vector<double>& row, size_t index, absl::string_view which) {
  for (size_t j = 0; j < row.size(); ++j) {
    if (!(row[j] >= 0.0 && row[j] <= 1.0)) {
      return absl::InvalidArgumentError(absl::StrCat("candidate ", index, " ", which, "[", j,
                                                     "]: expected in [0, 1], got ", row[j]));
    }
    if (j > 0 && row[j] > row[j - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("candidate ", index, " ", which,
                                                     ": expected non-increasing, got ", row[j - 1],
                                                     " then ", row[j], " at ", j));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckShape(const StepShape& shape) {
  if (shape.sampling_requests < 0 || shape.step_tokens < 0 || shape.step_requests < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step shape: expected counts >= 0, got sampling_requests ", shape.sampling_requests,
        ", step_tokens ", shape.step_tokens, ", step_requests ", shape.step_requests));
  }
  if (!(std::isfinite(shape.extra_seconds) && shape.extra_seconds >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step shape extra_seconds: expected finite and >= 0, got ", shape.extra_seconds));
  }
  if (!(std::isfinite(shape.cost_scale) && shape.cost_scale > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step shape cost_scale: expected finite and > 0, got ", shape.cost_scale));
  }
  return absl::OkStatus();
}

// The target's forward time for a step with B drafts verified: cost_scale x T(step_tokens + B).
double ForwardSeconds(const StepShape& shape, const CostTable& cost, int b) {
  return shape.cost_scale * cost.StepSeconds(shape.step_tokens + b, shape.step_requests);
}

// The B in [0, sums.size() - 1] maximising
// (sampling + sums[B]) / (cost_scale x T(step_tokens + B) + extra), searched globally (the ratio
// can dip and rise again); the first on ties.
std::pair<int, double> BestBudget(const StepShape& shape, const std::vector<double>& sums,
                                  const CostTable& cost, double extra) {
  int best_b = 0;
  double best = -1.0;
  for (int b = 0; b < static_cast<int>(sums.size()); ++b) {
    const double seconds = ForwardSeconds(shape, cost, b) + extra;
    const double ratio = (shape.sampling_requests + sums[b]) / seconds;
    if (ratio > best) {
      best = ratio;
      best_b = b;
    }
  }
  return {best_b, best};
}

}  // namespace

std::vector<double> LargestSums(absl::Span<const VerifyCandidate> rows, bool use_current) {
  std::vector<double> values;
  for (const VerifyCandidate& c : rows) {
    const std::vector<double>& row = use_current ? Current(c) : c.prior;
    values.insert(values.end(), row.begin(), row.end());
  }
  std::sort(values.begin(), values.end(), std::greater<double>());
  std::vector<double> sums(values.size() + 1, 0.0);
  for (size_t i = 0; i < values.size(); ++i) sums[i + 1] = sums[i] + values[i];
  return sums;
}

std::vector<int> AllocateSlots(absl::Span<const VerifyCandidate> candidates, int budget) {
  std::vector<std::tuple<double, int, int>> slots;  // (-a, position, request)
  for (size_t r = 0; r < candidates.size(); ++r) {
    const std::vector<double>& row = Current(candidates[r]);
    for (size_t j = 0; j < row.size(); ++j) {
      slots.emplace_back(-row[j], static_cast<int>(j), static_cast<int>(r));
    }
  }
  budget = std::clamp<int>(budget, 0, slots.size());
  std::partial_sort(slots.begin(), slots.begin() + budget, slots.end());
  std::vector<int> len(candidates.size(), 0);
  for (int i = 0; i < budget; ++i) ++len[std::get<2>(slots[i])];
  return len;
}

absl::StatusOr<VerifyPlan> PlanVerification(const StepShape& shape,
                                            absl::Span<const VerifyCandidate> candidates,
                                            const CostTable* cost) {
  if (absl::Status s = CheckShape(shape); !s.ok()) return s;
  int total = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const VerifyCandidate& c = candidates[i];
    if (!c.current.empty() && c.current.size() != c.prior.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("candidate ", i, ": expected current (", c.current.size(),
                       " values) as long as prior (", c.prior.size(), ")"));
    }
    if (absl::Status s = CheckRow(c.prior, i, "prior"); !s.ok()) return s;
    if (absl::Status s = CheckRow(c.current, i, "current"); !s.ok()) return s;
    total += static_cast<int>(c.prior.size());
  }
  VerifyPlan plan;
  auto t = [&](int b) {
    return cost == nullptr ? 0.0 : ForwardSeconds(shape, *cost, b) + shape.extra_seconds;
  };
  if (cost == nullptr) {
    plan.budget = total;
    plan.reason = absl::StrCat("no cost table: verifying all ", total, " drafted tokens");
  } else if (cost->IsFlat()) {
    plan.budget = total;
    plan.reason = absl::StrCat("cost table is flat (", cost->DebugString(), "): verifying all ",
                               total, " drafted tokens");
  } else {
    plan.adaptive = true;
    const std::vector<double> sums = LargestSums(candidates, /*use_current=*/false);
    plan.budget = BestBudget(shape, sums, *cost, shape.extra_seconds).first;
  }
  plan.verify_len = AllocateSlots(candidates, plan.budget);
  plan.expected_tokens = shape.sampling_requests;
  for (size_t r = 0; r < candidates.size(); ++r) {
    const std::vector<double>& row = Current(candidates[r]);
    for (int j = 0; j < plan.verify_len[r]; ++j) plan.expected_tokens += row[j];
  }
  plan.step_seconds = t(plan.budget);
  plan.tokens_per_second = plan.step_seconds > 0 ? plan.expected_tokens / plan.step_seconds : 0.0;
  return plan;
}

bool ConfidenceStop::operator()(int position, float confidence) {
  survival_ *= calibration_->Conditional(confidence);
  if (!declined_ && (position == 0 || survival_ >= threshold_)) return true;
  declined_ = true;
  if (past_ <= 0) return false;
  --past_;
  return true;
}

double DraftSeconds(const CostTable& draft_cost, absl::Span<const int> caps, int length) {
  double seconds = 0.0;
  for (int r = 0; r < length; ++r) {
    int n = 0;
    for (int cap : caps) n += cap > r ? 1 : 0;
    if (n == 0) break;
    seconds += draft_cost.StepSeconds(n, n);
  }
  return seconds;
}

absl::StatusOr<DraftLengthPlan> PlanDraftLength(const StepShape& shape,
                                                absl::Span<const std::vector<double>> priors,
                                                const CostTable* cost, const CostTable* draft_cost,
                                                double draft_cost_scale, double min_gain) {
  if (absl::Status s = CheckShape(shape); !s.ok()) return s;
  if (!(std::isfinite(min_gain) && min_gain >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_gain: expected finite and >= 0, got ", min_gain));
  }
  if (!(std::isfinite(draft_cost_scale) && draft_cost_scale >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft_cost_scale: expected finite and >= 0, got ", draft_cost_scale));
  }
  int longest = 0;
  std::vector<int> caps;
  caps.reserve(priors.size());
  for (size_t i = 0; i < priors.size(); ++i) {
    if (absl::Status s = CheckRow(priors[i], i, "prior"); !s.ok()) return s;
    caps.push_back(static_cast<int>(priors[i].size()));
    longest = std::max(longest, caps.back());
  }
  DraftLengthPlan plan;
  if (cost == nullptr) {
    plan.length = longest;
    plan.reason = absl::StrCat("no cost table: drafting ", longest, " tokens");
    return plan;
  }
  plan.adaptive = true;
  std::vector<VerifyCandidate> rows(priors.size());
  double best = -1.0;
  for (int length = 0; length <= longest; ++length) {
    for (size_t i = 0; i < priors.size(); ++i) {
      rows[i].prior.assign(priors[i].begin(),
                           priors[i].begin() + std::min<size_t>(length, priors[i].size()));
    }
    const double draft =
        draft_cost == nullptr ? 0.0 : draft_cost_scale * DraftSeconds(*draft_cost, caps, length);
    const std::vector<double> sums = LargestSums(rows, /*use_current=*/false);
    const auto [b, ratio] = BestBudget(shape, sums, *cost, shape.extra_seconds + draft);
    plan.length_rates.push_back(ratio);
    // A longer draft must beat the best shorter one by min_gain (relative): the estimates are
    // noisy and a longer draft is paid for whether its tokens are verified or not.
    if (best < 0.0 || ratio > best * (1.0 + min_gain)) {
      best = ratio;
      plan.length = length;
      plan.budget = b;
      plan.expected_tokens = shape.sampling_requests + sums[b];
      plan.draft_seconds = draft;
      plan.step_seconds = ForwardSeconds(shape, *cost, b) + shape.extra_seconds + draft;
      plan.tokens_per_second = ratio;
    }
  }
  return plan;
}

int ExtendDraftLength(const DraftLengthPlan& plan, double slack) {
  if (!(slack > 0.0) || plan.length == 0 || !plan.adaptive) return plan.length;
  const double floor = (1.0 - slack) * plan.tokens_per_second;
  for (int l = static_cast<int>(plan.length_rates.size()) - 1; l > plan.length; --l) {
    if (plan.length_rates[l] >= floor) return l;
  }
  return plan.length;
}

DraftingRateCheck::DraftingRateCheck(const Options& options) : options_(options) {}

int DraftingRateCheck::Bucket(int decoding) {
  int b = 0;
  for (int cap = 1; cap < decoding && b < 30; cap *= 2) ++b;
  return b;
}

void DraftingRateCheck::Observe(int decoding, bool drafted, double tokens, double seconds) {
  if (decoding < 1 || !(tokens >= 0.0) || !(seconds > 0.0) || !std::isfinite(tokens) ||
      !std::isfinite(seconds)) {
    return;
  }
  const size_t b = static_cast<size_t>(Bucket(decoding));
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  Bucket_& bucket = buckets_[b];
  for (Mode& m : bucket.modes) {
    m.tokens *= options_.decay;
    m.seconds *= options_.decay;
    m.weight *= options_.decay;
  }
  Mode& m = bucket.modes[drafted ? 1 : 0];
  m.tokens += tokens;
  m.seconds += seconds;
  m.weight += 1.0;
  const Mode& with = bucket.modes[1];
  const Mode& without = bucket.modes[0];
  if (with.weight >= options_.min_weight && without.weight >= options_.min_weight) {
    bucket.vetoing = with.tokens / with.seconds < without.tokens / without.seconds;
  } else if (with.weight < options_.min_weight / 4.0) {
    bucket.vetoing = false;
  }
}

double DraftingRateCheck::Rate(int decoding, bool drafted) const {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  if (b >= buckets_.size()) return 0.0;
  const Mode& m = buckets_[b].modes[drafted ? 1 : 0];
  return m.seconds > 0.0 ? m.tokens / m.seconds : 0.0;
}

double DraftingRateCheck::Weight(int decoding, bool drafted) const {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  return b < buckets_.size() ? buckets_[b].modes[drafted ? 1 : 0].weight : 0.0;
}

bool DraftingRateCheck::DraftingPays(int decoding) const {
  const size_t b = static_cast<size_t>(Bucket(std::max(decoding, 1)));
  return b >= buckets_.size() || !buckets_[b].vetoing;
}

}  // namespace deepinfer::engine::speculative
