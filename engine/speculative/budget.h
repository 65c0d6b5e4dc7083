// Adaptive verification: how many draft tokens to verify in a step, and whose.
//
// Each request with a draft has a survival row a_1 >= a_2 >= ... >= a_k: a_j estimates the
// probability that draft tokens 1..j are all accepted (a_j = prod_{i<=j} c_i, c_i the
// conditional acceptance of token i). A step that verifies B draft tokens in total, given to the
// B largest a (ties broken by (position, request), so every request verifies a prefix of its
// draft), is expected to emit (requests sampling + sum of those a) tokens and takes
// T(step tokens + B, step requests) from a cost table profiled on the backend. B maximises
//     (requests sampling + sum of the B largest a) / (s x T(step tokens + B) + E)
// over all B in [0, total drafted], searched globally (the ratio need not be unimodal). In service
// the step takes s x T + E: s (StepShape::cost_scale) is the measured / profiled forward time
// (the profile ran on a quiet machine with short contexts; contention and long contexts scale
// every forward pass alike), E (StepShape::extra_seconds) is the step's time outside the target's
// forward pass that does not depend on B: the engine's measured per-step overhead (scheduling,
// output; an average of the step period minus its forward pass and drafting) plus the time spent
// drafting. A large fixed cost per step makes verifying more drafts worth it, a large s less;
// s = 1, E = 0 is the pure table case. (Folding a slowdown into E instead of s would overstate
// the fixed cost and verify too much.)
//
// Draft length. A drafter that pays per drafted token (a draft model: L batched forward passes
// for L tokens) asks PlanDraftLength, before drafting, for the L in [0, k] that maximises the
// same ratio with E + L x T_draft(sequences) in the denominator, each L scored at its best B
// over the prior rows truncated to L. L = 0 means: do not draft (nor verify) this step.
//
// Losslessness. Rejection sampling (verifier.h) keeps the target distribution only if the
// decision to verify d_j does not depend on d_j. So:
// - B is computed from `prior` rows: estimates from earlier steps, independent of the current
//   draft (PositionPrior of the estimators below, or, for deterministic drafters such as n-gram
//   lookup, anything computed from the context).
// - The B slots are handed out by `current` rows, where a_j may use what was known before d_j
//   was chosen (the draft's distribution for position j, tokens d_1..d_{j-1}) but never d_j.
//   Because rows are non-increasing and ties go to the earlier position, whether d_j is verified
//   depends only on a_1..a_j of its own request and on other requests.
// With no cost table, or a flat one, every drafted token is verified and the plan says why.
//
// Estimators:
// - NgramSurvivalStats: conditional acceptance keyed by (match length, position), online.
// - DraftCalibration: maps a draft model's confidence for position j (e.g. the largest
//   probability of its distribution there, known before d_j is drawn) to a conditional acceptance
//   through an isotonic (non-decreasing) fit over bins, refitted online; plus per-position rates
//   for the prior row.
//
// Thread-safety: none of these classes is thread-safe; CostTable is immutable after creation and
// may be read from any thread.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_BUDGET_H_
#define DEEPINFER_ENGINE_SPECULATIVE_BUDGET_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace deepinfer::engine::speculative {

// --- Survival estimators --------------------------------------------------------------------

// Probability of a 0/1 outcome: a Beta prior (prior_mean, prior_weight pseudo-observations)
// plus observed counts, each multiplied by `decay` per new observation (window ~ 1/(1 - decay)).
class RateEstimator {
 public:
  RateEstimator(double prior_mean = 0.5, double prior_weight = 2.0, double decay = 0.999);
  void Observe(bool success);
  double Mean() const;
  double observations() const { return total_; }

 private:
  double prior_mean_, prior_weight_, decay_;
  double successes_ = 0.0, total_ = 0.0;
};

struct SurvivalOptions {
  int max_positions = 16;   // positions beyond share the last estimate
  double prior_mean = 0.5;  // conditional acceptance before any observation
  double prior_weight = 2.0;
  double decay = 0.999;
};

// Survival rows for n-gram drafts keyed by the match length (clamped to [1, max_match_length]).
class NgramSurvivalStats {
 public:
  explicit NgramSurvivalStats(int max_match_length = 8, const SurvivalOptions& options = {});
  // Fills `a` with k survival values for a draft that matched `match_length` tokens.
  void Survival(int match_length, int k, std::vector<double>* a) const;
  // Records a verification: tokens 1..accepted were accepted; token accepted + 1 was rejected
  // when accepted < verified; later ones are unobserved.
  void Observe(int match_length, int verified, int accepted);

 private:
  RateEstimator& Cell(int match_length, int position);
  const RateEstimator& Cell(int match_length, int position) const;
  int max_match_length_;
  SurvivalOptions options_;
  std::vector<RateEstimator> cells_;  // [match_length - 1][position]
};

struct CalibrationOptions {
  int bins = 20;              // over confidence in [0, 1]
  double prior_weight = 2.0;  // pseudo-observations per bin at the identity (c = confidence)
  double decay = 0.9995;
  SurvivalOptions positions;  // for PositionPrior
};

class DraftCalibration {
 public:
  explicit DraftCalibration(const CalibrationOptions& options = {});
  // Calibrated conditional acceptance for a confidence in [0, 1] (clamped); non-decreasing.
  double Conditional(double confidence) const;
  // a_j = prod_{i<=j} Conditional(confidence[i]).
  void Survival(absl::Span<const float> confidence, std::vector<double>* a) const;
  // Ex-ante row from per-position acceptance rates, independent of any current draft.
  void PositionPrior(int k, std::vector<double>* a) const;
  // Records a verification of a draft whose confidences were `confidence` (as in
  // NgramSurvivalStats::Observe).
  void Observe(absl::Span<const float> confidence, int verified, int accepted);

 private:
  void Refit();
  CalibrationOptions options_;
  std::vector<double> accepted_, seen_;  // decayed counts per bin
  std::vector<double> fitted_;           // isotonic fit per bin
  std::vector<RateEstimator> positions_;
};

// --- Cost table -----------------------------------------------------------------------------

// Step time (seconds; any unit works as long as it is used consistently) against the tokens in
// the step and the number of requests in it. Piecewise linear in tokens through the measured
// points (constant below the first; above the last, extended with the slope from the last point
// back to the last one at or below half its tokens, or the first: a last segment one token long,
// 16 -> 17 tokens, measures noise, not a slope), linear between measured request counts (clamped
// outside). Non-decreasing in tokens and, at the measured points, in requests where the fewer
// requests' row was measured (at more tokens than a row measured, its last point is the bound).
class CostTable {
 public:
  struct Sample {
    int tokens = 0;
    int requests = 1;
    double seconds = 0.0;
  };

  // Takes the median of the samples of each (tokens, requests) shape, then makes the table
  // monotone (running maximum along tokens, and each request count at least the one below).
  // kInvalidArgument for no samples, a shape with fewer than `min_runs` (>= 1) samples,
  // tokens < 0, requests < 1 or a non-finite or negative time.
  static absl::StatusOr<CostTable> FromSamples(absl::Span<const Sample> samples, int min_runs = 5);

  double StepSeconds(double tokens, int requests) const;
  // True when no request count's time grows by more than `tolerance` (relative) from its fewest
  // to its most tokens, or when no request count was measured at two token counts.
  bool IsFlat(double tolerance = 0.01) const;
  std::string DebugString() const;

 private:
  struct Row {
    int requests = 1;
    std::vector<int> tokens;  // ascending
    std::vector<double> seconds;
    double Eval(double t) const;
  };
  std::vector<Row> rows_;  // ascending requests
};

// Profiles `run_step(tokens, requests)` (returns one step's wall time) `runs` (>= 5) times per
// shape and builds the table (the median per shape). Each measured run follows unmeasured runs of
// the same shape, `warm_runs` (>= 0) of them or fewer once they took `warm_seconds` (but at least
// one when warm_runs > 0): a step costs more right after steps of another shape (a larger one
// evicted the weights and the smaller one's buffers from the caches), and the plan must price
// steps as a node serving that shape step after step sees them. Shapes of 20 ms or more recover
// in one run. The runs go round the shapes (every
// shape once, then again, `runs` times), so each shape's runs spread over the whole profile and a
// burst of other work shorter than about half of it slows fewer than half of any shape's runs,
// which the median ignores; consecutive runs per shape put a burst into every run of the shapes it
// covered (a cluster's other processes starting on the same cores, say). A table that comes out
// flat (CostTable::IsFlat) is profiled once more and the second one kept: one slow first shape (a
// busy machine), made monotone, flattens the whole table, and a flat table turns adaptive
// verification off.
// Errors from run_step are returned as they are.
absl::StatusOr<CostTable> ProfileCostTable(
    const std::function<absl::StatusOr<double>(int tokens, int requests)>& run_step,
    absl::Span<const std::pair<int, int>> shapes, int runs = 5, int warm_runs = 4,
    double warm_seconds = 0.02);

// The (tokens, requests) shapes to profile for drafts of up to k tokens: for 1, 8 and 32 requests
// (each at most max_requests, stopping at the first repeat), tokens r x m for m = 1, 2, 4, ... up
// to k + 1, ascending. The backend's projections multiply `rows_per_pass` tokens per pass over
// the weights (kernels::LinearRowsPerPass; 0 or 1: no passes to see), so a step's time jumps
// where its tokens pass a multiple of it: one token past 4 cost about four tokens within a pass
// on AVX-512 BF16 (demo model). Between the powers of two the table would spread that jump
// evenly, and the plan would verify a token that starts a pass as if it cost a quarter of one. So
// each row of at most `edge_requests` requests also holds the edges (a multiple of rows_per_pass
// and one token more) from its fewest tokens up, at most `max_edges` of them. Not every row: each
// profiled point carries its own noise (+-10% between shapes), and the plan's global search finds
// every point that happens to be cheap. A row ends before its first shape that `fits` refuses
// (the engine's step and KV budgets).
std::vector<std::pair<int, int>> CostProfileShapes(int k, int max_requests, int rows_per_pass,
                                                   int max_edges, int edge_requests,
                                                   const std::function<bool(int, int)>& fits);

// Online fit of the target's measured forward time against the cost table's prediction T for
// the same step and its number of requests n:
//     measured ~= scale x T + offset + per_request x n,
// by least squares with exponential forgetting (each observation's weight decays by `decay` per
// new one). In service a forward pass is slower than the quiet start-up profile in three ways:
// contention slows everything (scale), contexts longer than the profile's make every sequence
// dearer whatever its token count (per_request: attention over its context, its logits), and
// some work is per step (offset). Folding all of it into a factor on T overstates what a draft
// token costs; folding it into a constant understates it. The planner takes
// StepShape::cost_scale = Scale() and adds Offset(n) = offset + per_request x n to extra_seconds
// (n does not change with B).
// The fit uses the first of the models {offset, scale, per_request}, {offset, scale},
// {scale, per_request}, {scale} whose regressors the data separate (well-conditioned moments)
// and whose coefficients are plausible: offset >= 0, per_request >= 0, scale >= r / 2 with r the
// ratio of the averages of measured and T (noise can tilt a slope arbitrarily). Before any
// observation: scale 1, no offset. The scale stays in [min_scale, max_scale].
class ForwardCostFit {
 public:
  explicit ForwardCostFit(double decay = 0.99, double min_scale = 0.1, double max_scale = 100.0);
  // Ignores non-finite or non-positive times and requests < 1.
  void Observe(double predicted_seconds, int requests, double measured_seconds);
  double Scale() const { return scale_; }
  double Offset(int requests) const { return offset_ + per_request_ * requests; }
  // The fitted forward time of a step the table puts at `table_seconds`.
  double Predict(double table_seconds, int requests) const {
    return scale_ * table_seconds + Offset(requests);
  }
  double offset() const { return offset_; }
  double per_request() const { return per_request_; }
  bool empty() const { return observations_ == 0; }

 private:
  void Refit();
  double decay_, min_scale_, max_scale_;
  // Decayed moments of x = (1, T, n) in milliseconds: xx_[i][j] = sum w x_i x_j, xy_[i] = sum w
  // x_i y.
  double xx_[3][3] = {};
  double xy_[3] = {};
  int observations_ = 0;
  double scale_ = 1.0, offset_ = 0.0, per_request_ = 0.0;
};

// --- Budget ---------------------------------------------------------------------------------

struct VerifyCandidate {
  std::vector<double> prior;    // decides B; see the top of this file
  std::vector<double> current;  // decides the slots; empty = use prior; else prior's length
};

struct StepShape {
  int sampling_requests = 0;  // requests that emit a token this step (decode + finished prefill)
  int step_tokens = 0;        // tokens in the step before any draft (decode + prefill chunks)
  int step_requests = 0;      // requests in the step, for the cost table
  // E: seconds the step spends outside the target's forward pass regardless of B (measured
  // overhead, drafting already done), in the cost table's unit; >= 0. 0: the pure table.
  double extra_seconds = 0.0;
  // s: how much slower (> 1) or faster the target's forward passes run in service than the
  // profile says (measured / predicted forward time: other processes on the machine, longer
  // contexts than the profile's); > 0. The step takes s x T(tokens + B) + E. 1: the pure table.
  double cost_scale = 1.0;
};

struct VerifyPlan {
  int budget = 0;                // B: draft tokens verified in total
  std::vector<int> verify_len;   // per candidate, a prefix of its draft
  double expected_tokens = 0.0;  // sampling_requests + sum of the chosen current a
  double step_seconds = 0.0;     // s x T(step_tokens + B, step_requests) + E; 0 without a table
  double tokens_per_second = 0.0;
  bool adaptive = false;  // false: every drafted token is verified
  std::string reason;     // why every token is verified, when it is
};

// Sum of the B largest values over all rows, B = 0..total: prefix[B].
std::vector<double> LargestSums(absl::Span<const VerifyCandidate> rows, bool use_current);

// Gives `budget` slots to the largest values (ties by (position, request)); per candidate the
// number of slots, always a prefix. Uses current rows (prior where current is empty).
std::vector<int> AllocateSlots(absl::Span<const VerifyCandidate> candidates, int budget);

// The plan for one step. kInvalidArgument for a row with values outside [0, 1], an increasing
// row, or current and prior rows of different lengths; negative counts or a negative or
// non-finite extra_seconds in `shape`.
absl::StatusOr<VerifyPlan> PlanVerification(const StepShape& shape,
                                            absl::Span<const VerifyCandidate> candidates,
                                            const CostTable* cost);

struct DraftLengthPlan {
  int length = 0;                // L: tokens to draft per request (each capped by its prior row)
  int budget = 0;                // the B that scored L (the plan after drafting recomputes it)
  double expected_tokens = 0.0;  // sampling_requests + sum of the B largest prior a
  double draft_seconds = 0.0;    // predicted drafting time for L
  double step_seconds = 0.0;     // s x T(step_tokens + B) + E + draft_seconds
  double tokens_per_second = 0.0;
  bool adaptive = false;  // false: no cost table, draft the longest row
  std::string reason;     // why, when not adaptive
  // Adaptive: the tokens per second of every L = 0..longest, each drafting L whatever the
  // drafts' confidences (length_rates[length] == tokens_per_second).
  std::vector<double> length_rates;
};

// Chooses the draft length before drafting. `priors[i]` is request i's prior survival row (as
// VerifyCandidate::prior) over the positions it may draft (its length is request i's cap, at
// most k). `draft_cost` gives one batched draft forward pass of n sequences x 1 token as
// StepSeconds(n, n); a round r < L runs only the requests whose cap exceeds r (DraftSeconds).
// Null `draft_cost`: drafting is free. `draft_cost_scale` multiplies its predictions (the
// caller's measured / predicted drafting time: work a profile of forward passes misses, such as
// choosing the draft tokens or longer contexts). A longer L is chosen only when its ratio beats
// the best shorter L's by more than `min_gain` (relative, >= 0; 0: ties go to the shorter L):
// the engine asks for a margin because its estimates are noisy and drafting is paid for whether
// the drafts are verified or not. Null `cost`: not
// adaptive, L = the longest row. Errors as PlanVerification, and kInvalidArgument for a negative
// or non-finite scale or min_gain.
// A measured check on the planner's decision to draft. The plans above predict a step's time
// from models (the cost table, its in-service fit, a draft model's round cost); what they leave
// out (a draft model catching up on the tokens of steps it did not draft, contexts longer than
// the profiles', the lost overlap of a synchronous step) can make drafting lose where the plan
// says it wins. This keeps, per bucket of decoding-sequence count (1, 2, 3-4, 5-8, ..., powers
// of two), the realised tokens per second of steps that drafted (the plan's choice, probes left
// out) and of steps that did not: tokens emitted over measured periods, each sum decayed by
// `decay` at every step of the bucket, so a mode not chosen for a while fades. Once both modes
// have weight >= min_weight in a bucket and drafting's rate is below not drafting's, DraftingPays
// says no and the engine does not draft (probes excepted) until the drafting data has faded
// below min_weight / 4 (hysteresis: at 0.99, about 140 steps of the bucket), when the plan
// decides again and its drafting steps are measured anew. Only measured earlier steps decide:
// lossless. The engine uses a second instance the same way for a draft model's length: steps
// that drafted 2 or more tokens per sequence ("drafted") against steps that drafted 1.
class DraftingRateCheck {
 public:
  struct Options {
    double decay = 0.99;      // in (0, 1]
    double min_weight = 8.0;  // > 0: steps (decayed) per mode before the check speaks
  };
  DraftingRateCheck() : DraftingRateCheck(Options()) {}
  explicit DraftingRateCheck(const Options& options);

  // One step with `decoding` (>= 1) decoding sequences: whether it drafted, the tokens it
  // emitted (> = 0) and its measured period in seconds (> 0). Other values are ignored.
  void Observe(int decoding, bool drafted, double tokens, double seconds);
  // False while the bucket of `decoding` vetoes drafting (above).
  bool DraftingPays(int decoding) const;
  // Realised tokens per second (0 without data) and decayed weight of a mode.
  double Rate(int decoding, bool drafted) const;
  double Weight(int decoding, bool drafted) const;
  // Bucket of a decoding-sequence count: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ...
  static int Bucket(int decoding);

 private:
  struct Mode {
    double tokens = 0.0;
    double seconds = 0.0;
    double weight = 0.0;
  };
  struct Bucket_ {
    std::array<Mode, 2> modes;  // [drafted]
    bool vetoing = false;
  };
  Options options_;
  std::vector<Bucket_> buckets_;
};

absl::StatusOr<DraftLengthPlan> PlanDraftLength(const StepShape& shape,
                                                absl::Span<const std::vector<double>> priors,
                                                const CostTable* cost, const CostTable* draft_cost,
                                                double draft_cost_scale = 1.0,
                                                double min_gain = 0.0);

// The longest L whose rate (plan.length_rates) is at least (1 - slack) x the chosen L's, for a
// confidence stop to cut (SpecOptions::draft_stop_extend); plan.length
// when none is, when slack <= 0, when plan.length is 0 (no drafting stays no drafting) or when
// the plan is not adaptive.
int ExtendDraftLength(const DraftLengthPlan& plan, double slack);

// A draft model's confidence stop for one sequence (DraftRequest::keep_drafting's predicate):
// position 0 is always drafted, position j >= 1 while its survival a_j = prod_{i<=j}
// calibration.Conditional(confidence_i) is at least `threshold`. With `past` > 0 the stop lets
// that many positions more through after the first one it declines, then none: a probe's
// sequence, which verifies one draft more than the stop would (the positions just past the stop
// are the ones whose calibration decides it). Lossless: each answer precedes its token's draw.
// `calibration` must outlive the stop.
class ConfidenceStop {
 public:
  ConfidenceStop(const DraftCalibration* calibration, double threshold, int past = 0)
      : calibration_(calibration), threshold_(threshold), past_(past) {}
  bool operator()(int position, float confidence);

 private:
  const DraftCalibration* calibration_;
  double threshold_;
  int past_;               // positions still allowed past the stop
  double survival_ = 1.0;  // a_j so far
  bool declined_ = false;  // the stop declined a position already
};

// Predicted seconds to draft `length` tokens for requests whose caps are `caps`: the sum over
// rounds r < length of draft_cost.StepSeconds(n_r, n_r), n_r = requests with cap > r (rounds
// with none cost nothing).
double DraftSeconds(const CostTable& draft_cost, absl::Span<const int> caps, int length);

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_BUDGET_H_
