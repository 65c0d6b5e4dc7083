#include "engine/speculative/budget.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {
namespace {

CostTable Table(const std::vector<std::pair<int, double>>& points, int requests = 1) {
  std::vector<CostTable::Sample> samples;
  for (const auto& [tokens, seconds] : points) {
    for (int i = 0; i < 5; ++i) samples.push_back({tokens, requests, seconds});
  }
  auto t = CostTable::FromSamples(samples);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

VerifyCandidate Row(std::vector<double> a) { return VerifyCandidate{std::move(a), {}}; }

// The budget arithmetic, by hand.
//
// Survival rows (4 requests x 7 positions):
//   r0: 0.90 0.80 0.70 0.60 0.50 0.40 0.30
//   r1: 0.60 0.30 0.15 0.05 0.02 0.01 0.00
//   r2: 0.95 0.90 0.85 0.80 0.75 0.70 0.65
//   r3: 0.60 0.50 0.20 0.10 0.10 0.05 0.00
// Cost table (tokens -> ms): 0 -> 2.0, 8 -> 2.2, 16 -> 2.6, 32 -> 9.0, so
//   T(t) = 2.0 + 0.025 t (t <= 8), 2.2 + 0.05 (t - 8) (t <= 16), 2.6 + 0.4 (t - 16) (t <= 32).
// Four decoding requests: 4 sampling requests, 4 step tokens; verifying B more costs T(4 + B).
// Values in descending order, ties by (position, request):
//   0.95 (r2,0)  0.90 (r0,0)  0.90 (r2,1)  0.85 (r2,2)  0.80 (r0,1)  0.80 (r2,3)  0.75 (r2,4)
//   0.70 (r0,2)  0.70 (r2,5)  0.65 (r2,6)  0.60 (r1,0)  0.60 (r3,0)  0.60 (r0,3)  0.50 (r3,1) ...
// Prefix sums S(B) and ratio (4 + S(B)) / T(4 + B):
//   B = 0:  S = 0     T(4)  = 2.10  ratio 4/2.10     = 1.905
//   B = 8:  S = 6.65  T(12) = 2.40  ratio 10.65/2.40 = 4.4375
//   B = 10: S = 8.00  T(14) = 2.50  ratio 12.00/2.50 = 4.800
//   B = 11: S = 8.60  T(15) = 2.55  ratio 12.60/2.55 = 4.941
//   B = 12: S = 9.20  T(16) = 2.60  ratio 13.20/2.60 = 5.0769   <- best
//   B = 13: S = 9.80  T(17) = 3.00  ratio 13.80/3.00 = 4.600
//   B = 14: S = 10.30 T(18) = 3.40  ratio 14.30/3.40 = 4.206
//   B = 28: S = 12.48 T(32) = 9.00  ratio 16.48/9.00 = 1.831
// Below 16 tokens every added value (>= 0.6) gains more than the time it costs (the ratio rises
// by each step above: the numerator grows by >= 0.6 / 13.2 = 4.5% while T grows by <= 2%); past
// 16 tokens T grows by 0.4 ms per token (>= 13%) while a value adds <= 0.6 / 13.8 = 4.3%, so it
// falls. B = 12: the slots are the first 12 values above; of the three 0.60 ties (r1,0) and
// (r3,0) come before (r0,3) by position, so r0 verifies 3 tokens, r1 1, r2 7, r3 1.
TEST(BudgetTest, HandComputedAllocation) {
  const CostTable cost = Table({{0, 2.0e-3}, {8, 2.2e-3}, {16, 2.6e-3}, {32, 9.0e-3}});
  const std::vector<VerifyCandidate> rows = {
      Row({0.90, 0.80, 0.70, 0.60, 0.50, 0.40, 0.30}),
      Row({0.60, 0.30, 0.15, 0.05, 0.02, 0.01, 0.00}),
      Row({0.95, 0.90, 0.85, 0.80, 0.75, 0.70, 0.65}),
      Row({0.60, 0.50, 0.20, 0.10, 0.10, 0.05, 0.00}),
  };
  auto plan = PlanVerification({/*sampling_requests=*/4, /*step_tokens=*/4, /*step_requests=*/4},
                               rows, &cost);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->adaptive);
  EXPECT_EQ(plan->budget, 12);
  EXPECT_EQ(plan->verify_len, (std::vector<int>{3, 1, 7, 1}));
  EXPECT_NEAR(plan->expected_tokens, 13.2, 1e-9);
  EXPECT_NEAR(plan->step_seconds, 2.6e-3, 1e-12);
  EXPECT_NEAR(plan->tokens_per_second, 13.2 / 2.6e-3, 1e-6);  // 5076.9 tokens/s
  // The neighbours, from the table above.
  const std::vector<double> sums = LargestSums(rows, false);
  EXPECT_NEAR(sums[11], 8.6, 1e-9);
  EXPECT_NEAR(sums[13], 9.8, 1e-9);
  EXPECT_NEAR(cost.StepSeconds(15, 4), 2.55e-3, 1e-12);
  EXPECT_NEAR(cost.StepSeconds(17, 4), 3.0e-3, 1e-12);
  EXPECT_NEAR(cost.StepSeconds(32, 4), 9.0e-3, 1e-12);
}

TEST(BudgetTest, GlobalSearchLooksPastTheFirstDecrease) {
  // Steps/s 1.0, 0.5, 0.45 for 1, 2, 3 tokens; a = (0.8, 0.64):
  //   B=0: 1/1.0 = 1.0; B=1: 1.8/2.0 = 0.9 (a decrease); B=2: 2.44/2.222 = 1.098 (best).
  const CostTable cost = Table({{1, 1.0}, {2, 2.0}, {3, 1.0 / 0.45}});
  auto plan = PlanVerification({1, 1, 1}, {Row({0.8, 0.64})}, &cost);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->budget, 2);
  EXPECT_NEAR(plan->tokens_per_second, 2.44 * 0.45, 1e-9);
  auto low = PlanVerification({1, 1, 1}, {Row({0.8, 0.3})}, &cost);  // 2.1 * 0.45 = 0.945 < 1
  ASSERT_TRUE(low.ok());
  EXPECT_EQ(low->budget, 0);
  EXPECT_EQ(low->verify_len, (std::vector<int>{0}));
}

TEST(BudgetTest, NoOrFlatCostTableVerifiesEverythingAndSaysWhy) {
  const std::vector<VerifyCandidate> rows = {Row({0.5, 0.1}), Row({0.01, 0.0, 0.0})};
  auto none = PlanVerification({2, 2, 2}, rows, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->adaptive);
  EXPECT_EQ(none->budget, 5);
  EXPECT_EQ(none->verify_len, (std::vector<int>{2, 3}));
  EXPECT_NE(none->reason.find("no cost table"), std::string::npos) << none->reason;
  const CostTable flat = Table({{1, 1e-3}, {64, 1.005e-3}});
  EXPECT_TRUE(flat.IsFlat());
  auto f = PlanVerification({2, 2, 2}, rows, &flat);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->adaptive);
  EXPECT_EQ(f->budget, 5);
  EXPECT_NE(f->reason.find("flat"), std::string::npos) << f->reason;
  EXPECT_NEAR(f->expected_tokens, 2.61, 1e-9);
  const CostTable single = Table({{8, 1e-3}});  // one token count: nothing to trade off
  EXPECT_TRUE(single.IsFlat());
}

// The measured per-step overhead E joins T in the denominator. One request, T(t) = t ms (t = 1
// step token + B), survival row (0.8, 0.6, 0.4, 0.2); ratio (1 + S(B)) / (1 + B + E):
//   E = 0: 1/1 = 1.0, 1.8/2 = 0.9, 2.4/3 = 0.8, ...                       -> B = 0
//   E = 1: 1/2 = 0.5, 1.8/3 = 0.6, 2.4/4 = 0.6 (tie: the smaller), 2.8/5   -> B = 1
//   E = 4: 1/5 = 0.2, 1.8/6 = 0.3, 2.4/7 = 0.343, 2.8/8 = 0.35, 3.0/9 = 0.333 -> B = 3
TEST(BudgetTest, PerStepOverheadRaisesTheBudget) {
  const CostTable cost = Table({{1, 1.0e-3}, {5, 5.0e-3}});
  const std::vector<VerifyCandidate> rows = {Row({0.8, 0.6, 0.4, 0.2})};
  const std::vector<std::pair<double, int>> cases = {{0.0, 0}, {1.0e-3, 1}, {4.0e-3, 3}};
  for (const auto& [extra, budget] : cases) {
    auto plan = PlanVerification({1, 1, 1, extra}, rows, &cost);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->budget, budget) << "E " << extra;
    EXPECT_EQ(plan->verify_len, (std::vector<int>{budget}));
  }
  auto plan = PlanVerification({1, 1, 1, 4.0e-3}, rows, &cost);
  EXPECT_NEAR(plan->step_seconds, 8.0e-3, 1e-12);  // T(4) + E
  EXPECT_NEAR(plan->tokens_per_second, 2.8 / 8.0e-3, 1e-6);
  EXPECT_EQ(PlanVerification({1, 1, 1, -1.0}, rows, &cost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanVerification({1, 1, 1, std::nan("")}, rows, &cost).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// In service the forward pass runs s times slower than the profile: the step takes
// s x T(1 + B) + E. Same row (0.8, 0.6, 0.4, 0.2), T(t) = t ms, E = 4 ms:
//   s = 2: 1/6 = 0.167, 1.8/8 = 0.225, 2.4/10 = 0.240, 2.8/12 = 0.233, 3.0/14 = 0.214 -> B = 2
//   s = 4: 1/8 = 0.125, 1.8/12 = 0.150, 2.4/16 = 0.150 (tie: the smaller), 2.8/20    -> B = 1
// Folding the same slowdown into E instead (s = 1, E = 5 ms: the measured period at B = 0 is
// 2 x 1 + 4 = 6 ms either way) would verify 3: 1/6, 1.8/7, 2.4/8 = 0.300, 2.8/9 = 0.311, 3/10.
TEST(BudgetTest, ForwardScaleLowersTheBudget) {
  const CostTable cost = Table({{1, 1.0e-3}, {5, 5.0e-3}});
  const std::vector<VerifyCandidate> rows = {Row({0.8, 0.6, 0.4, 0.2})};
  const std::vector<std::pair<double, int>> cases = {{1.0, 3}, {2.0, 2}, {4.0, 1}};
  for (const auto& [scale, budget] : cases) {
    StepShape shape{1, 1, 1, 4.0e-3};
    shape.cost_scale = scale;
    auto plan = PlanVerification(shape, rows, &cost);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->budget, budget) << "s " << scale;
  }
  StepShape two{1, 1, 1, 4.0e-3};
  two.cost_scale = 2.0;
  auto plan = PlanVerification(two, rows, &cost);
  EXPECT_NEAR(plan->step_seconds, 10.0e-3, 1e-12);  // 2 x T(3) + E
  EXPECT_NEAR(plan->tokens_per_second, 2.4 / 10.0e-3, 1e-6);
  auto folded = PlanVerification({1, 1, 1, 5.0e-3}, rows, &cost);
  EXPECT_EQ(folded->budget, 3);
  // The draft length sees the same scale: with s = 4 a free drafter drafts what B verifies.
  StepShape four{1, 1, 1, 4.0e-3};
  four.cost_scale = 4.0;
  auto length = PlanDraftLength(four, {{0.8, 0.6, 0.4, 0.2}}, &cost, nullptr);
  ASSERT_TRUE(length.ok()) << length.status();
  EXPECT_EQ(length->length, 1);
  EXPECT_NEAR(length->step_seconds, 4.0 * 2.0e-3 + 4.0e-3, 1e-12);
  for (double bad : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)}) {
    StepShape shape{1, 1, 1, 0.0};
    shape.cost_scale = bad;
    EXPECT_EQ(PlanVerification(shape, rows, &cost).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
    EXPECT_EQ(PlanDraftLength(shape, {{0.5}}, &cost, nullptr).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// Draft length by hand. One request, T(t) = 1.0 + 0.01 (t - 1) ms, prior row (0.8, 0.64, 0.512),
// one draft pass d ms. Each L is scored at its best B (here B = L):
//   d = 0.9:  L0 1/1.0 = 1.0; L1 1.8/1.91 = 0.942; L2 2.44/2.82 = 0.865; L3 2.952/3.73 = 0.79 -> 0
//   d = 0.4:  L1 1.8/1.41 = 1.277; L2 2.44/1.82 = 1.341; L3 2.952/2.23 = 1.324             -> 2
//   d = 0.05: L1 1.8/1.06 = 1.698; L2 2.44/1.12 = 2.179; L3 2.952/1.18 = 2.502             -> 3
// and with a 10 ms overhead even d = 0.9 pays: L0 1/11 = 0.091, L1 1.8/11.91 = 0.151, L2
// 2.44/12.82 = 0.190, L3 2.952/13.73 = 0.215 -> 3.
CostTable DraftTable(const std::vector<std::pair<int, double>>& points) {
  std::vector<CostTable::Sample> samples;
  for (const auto& [n, seconds] : points) {
    for (int i = 0; i < 5; ++i) samples.push_back({n, n, seconds});
  }
  return CostTable::FromSamples(samples).value();
}

TEST(BudgetTest, DraftLengthWeighsTheDraftCost) {
  const CostTable cost = Table({{1, 1.0e-3}, {9, 1.08e-3}});
  const std::vector<std::vector<double>> priors = {{0.8, 0.64, 0.512}};
  struct Case {
    double draft_ms, extra_ms;
    int length;
    double tokens_per_ms;
  };
  for (const Case& c : {Case{0.9, 0.0, 0, 1.0}, Case{0.4, 0.0, 2, 2.44 / 1.82},
                        Case{0.05, 0.0, 3, 2.952 / 1.18}, Case{0.9, 10.0, 3, 2.952 / 13.73}}) {
    const CostTable draft = DraftTable({{1, c.draft_ms * 1e-3}, {8, c.draft_ms * 2e-3}});
    auto plan = PlanDraftLength({1, 1, 1, c.extra_ms * 1e-3}, priors, &cost, &draft);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(plan->adaptive);
    EXPECT_EQ(plan->length, c.length) << "draft " << c.draft_ms << " ms, extra " << c.extra_ms;
    EXPECT_EQ(plan->budget, c.length);
    EXPECT_NEAR(plan->draft_seconds, c.length * c.draft_ms * 1e-3, 1e-12);
    EXPECT_NEAR(plan->tokens_per_second, c.tokens_per_ms * 1e3, 1e-6);
    ASSERT_EQ(plan->length_rates.size(), 4u);
    EXPECT_NEAR(plan->length_rates[c.length], plan->tokens_per_second, 1e-9);
  }
  {
    // Every length's own rate, chosen or not: d = 0.4 above.
    const CostTable draft = DraftTable({{1, 0.4e-3}, {8, 0.8e-3}});
    auto plan = PlanDraftLength({1, 1, 1}, priors, &cost, &draft);
    ASSERT_TRUE(plan.ok());
    const double want[] = {1.0, 1.8 / 1.41, 2.44 / 1.82, 2.952 / 2.23};
    ASSERT_EQ(plan->length_rates.size(), 4u);
    for (int l = 0; l < 4; ++l) EXPECT_NEAR(plan->length_rates[l], want[l] * 1e3, 1e-6) << l;
  }
  // A measured/predicted scale of 2.25 makes the 0.4 ms draft a 0.9 ms one: no draft.
  const CostTable d04 = DraftTable({{1, 0.4e-3}, {8, 0.8e-3}});
  auto scaled = PlanDraftLength({1, 1, 1}, priors, &cost, &d04, 2.25);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->length, 0);
  EXPECT_NEAR(scaled->tokens_per_second, 1.0e3, 1e-6);
  EXPECT_EQ(PlanDraftLength({1, 1, 1}, priors, &cost, &d04, -1.0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Free drafting: the longest row that pays; no table: every position, not adaptive.
  auto costless = PlanDraftLength({1, 1, 1}, priors, &cost, nullptr);
  ASSERT_TRUE(costless.ok());
  EXPECT_EQ(costless->length, 3);
  auto none = PlanDraftLength({1, 1, 1}, priors, nullptr, nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->adaptive);
  EXPECT_EQ(none->length, 3);
  EXPECT_NE(none->reason.find("no cost table"), std::string::npos);
  EXPECT_EQ(PlanDraftLength({1, 1, 1}, {{0.5, 0.7}}, &cost, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The margin: d = 0.4 ms above scores L1 1.277, L2 1.341 (+5.0% over L1), L3 1.324. A 3%
// margin keeps L = 2; a 6% margin stops at L = 1 (L1 beats L0's 1.0 by 28%); with 40% nothing
// beats L0 by enough (L2, the best, by 34%): no draft.
TEST(BudgetTest, DraftLengthMarginPrefersShorterDrafts) {
  const CostTable cost = Table({{1, 1.0e-3}, {9, 1.08e-3}});
  const CostTable draft = DraftTable({{1, 0.4e-3}, {2, 0.8e-3}});
  const std::vector<std::vector<double>> priors = {{0.8, 0.64, 0.512}};
  const std::vector<std::pair<double, int>> cases = {{0.0, 2}, {0.03, 2}, {0.06, 1}, {0.4, 0}};
  for (const auto& [gain, length] : cases) {
    auto plan = PlanDraftLength({1, 1, 1}, priors, &cost, &draft, 1.0, gain);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->length, length) << "min_gain " << gain;
  }
  EXPECT_EQ(PlanDraftLength({1, 1, 1}, priors, &cost, &draft, 1.0, -0.1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Extension for the confidence stop, on the d = 0.4 ms rates above (L0 1.0, L1 1.2766, L2
// 1.3407, L3 1.3238 per ms; the best is L2): with a 1% slack L3 falls short (0.99 x 1.3407 =
// 1.3273), with 2% it does not (1.3139). From a plan that chose L1 (min_gain 6%), L2 and L3 both
// beat L1's rate, so any slack reaches L3. No drafting stays no drafting.
TEST(BudgetTest, ExtendDraftLengthReachesTheLongestNearlyAsGoodLength) {
  const CostTable cost = Table({{1, 1.0e-3}, {9, 1.08e-3}});
  const CostTable draft = DraftTable({{1, 0.4e-3}, {2, 0.8e-3}});
  const std::vector<std::vector<double>> priors = {{0.8, 0.64, 0.512}};
  auto best = PlanDraftLength({1, 1, 1}, priors, &cost, &draft);
  ASSERT_TRUE(best.ok());
  ASSERT_EQ(best->length, 2);
  EXPECT_EQ(ExtendDraftLength(*best, 0.0), 2);
  EXPECT_EQ(ExtendDraftLength(*best, 0.01), 2);
  EXPECT_EQ(ExtendDraftLength(*best, 0.02), 3);
  auto one = PlanDraftLength({1, 1, 1}, priors, &cost, &draft, 1.0, 0.06);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->length, 1);
  EXPECT_EQ(ExtendDraftLength(*one, 0.0), 1);
  EXPECT_EQ(ExtendDraftLength(*one, 1e-9), 3);
  // No drafting (the 40% margin) and a plan without a table stay as they are.
  auto none = PlanDraftLength({1, 1, 1}, priors, &cost, &draft, 1.0, 0.4);
  ASSERT_TRUE(none.ok());
  ASSERT_EQ(none->length, 0);
  EXPECT_EQ(ExtendDraftLength(*none, 0.5), 0);
  auto untabled = PlanDraftLength({1, 1, 1}, {{0.8}}, nullptr, nullptr);
  ASSERT_TRUE(untabled.ok());
  EXPECT_EQ(ExtendDraftLength(*untabled, 0.5), 1);
}

TEST(BudgetTest, DraftSecondsCountsTheRequestsOfEachRound) {
  // Rounds of caps {3, 1, 0}: 2 requests, then 1, then 1.
  const CostTable draft = DraftTable({{1, 1.0}, {2, 1.5}, {4, 2.0}});
  const std::vector<int> caps = {3, 1, 0};
  EXPECT_DOUBLE_EQ(DraftSeconds(draft, caps, 0), 0.0);
  EXPECT_DOUBLE_EQ(DraftSeconds(draft, caps, 1), 1.5);
  EXPECT_DOUBLE_EQ(DraftSeconds(draft, caps, 3), 3.5);
  EXPECT_DOUBLE_EQ(DraftSeconds(draft, caps, 5), 3.5);        // no request drafts past its cap
  EXPECT_DOUBLE_EQ(DraftSeconds(draft, {3, 3, 3}, 1), 1.75);  // between 2 and 4 sequences
}

TEST(BudgetTest, PriorRowsSetTheBudgetCurrentRowsTheSlots) {
  const CostTable cost = Table({{2, 1.0}, {3, 1.1}, {4, 3.0}});
  // Prior rows value one slot (B = 1: 2.9 / 1.1 = 2.64 beats 2/1 and 3.4/3), the current rows
  // decide it goes to request 1.
  std::vector<VerifyCandidate> rows = {{{0.9}, {0.2}}, {{0.5}, {0.7}}};
  auto plan = PlanVerification({2, 2, 2}, rows, &cost);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->budget, 1);
  EXPECT_EQ(plan->verify_len, (std::vector<int>{0, 1}));
  EXPECT_NEAR(plan->expected_tokens, 2.7, 1e-9);
}

TEST(BudgetTest, AllocationIsAPrefixPerRequestWithPositionRequestTies) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<VerifyCandidate> rows(1 + rng() % 5);
    int total = 0;
    for (auto& c : rows) {
      double a = 1.0;
      for (int j = 0, k = rng() % 6; j < k; ++j) {
        a *= (rng() % 5) / 4.0;  // many ties, zeros included
        c.prior.push_back(a);
      }
      total += c.prior.size();
    }
    const int budget = rng() % (total + 1);
    const std::vector<int> len = AllocateSlots(rows, budget);
    int sum = 0;
    double min_in = 2.0, max_out = -1.0;
    for (size_t r = 0; r < rows.size(); ++r) {
      ASSERT_LE(len[r], static_cast<int>(rows[r].prior.size()));
      sum += len[r];
      if (len[r] > 0) min_in = std::min(min_in, rows[r].prior[len[r] - 1]);
      if (len[r] < static_cast<int>(rows[r].prior.size())) {
        max_out = std::max(max_out, rows[r].prior[len[r]]);
      }
    }
    EXPECT_EQ(sum, budget);
    EXPECT_GE(min_in, max_out);  // the B largest values
  }
  // Equal rows: the earlier position of any request before the later one of another.
  const std::vector<VerifyCandidate> same = {Row({0.5, 0.5}), Row({0.5, 0.5})};
  EXPECT_EQ(AllocateSlots(same, 1), (std::vector<int>{1, 0}));
  EXPECT_EQ(AllocateSlots(same, 2), (std::vector<int>{1, 1}));
  EXPECT_EQ(AllocateSlots(same, 3), (std::vector<int>{2, 1}));
}

TEST(BudgetTest, RejectsBadRows) {
  const CostTable cost = Table({{1, 1.0}, {2, 2.0}});
  EXPECT_EQ(PlanVerification({1, 1, 1}, {Row({0.5, 0.6})}, &cost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanVerification({1, 1, 1}, {Row({1.5})}, &cost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanVerification({1, 1, 1}, {{{0.5}, {0.5, 0.4}}}, &cost).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanVerification({-1, 1, 1}, {}, &cost).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto empty = PlanVerification({3, 3, 3}, {}, &cost);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->budget, 0);
}

TEST(ForwardCostFitTest, RecoversFactorOffsetAndPerRequestCost) {
  ForwardCostFit factor;
  EXPECT_TRUE(factor.empty());
  EXPECT_DOUBLE_EQ(factor.Scale(), 1.0);
  EXPECT_DOUBLE_EQ(factor.Offset(8), 0.0);
  for (int i = 0; i < 200; ++i) {
    const double predicted = 1e-3 * (1 + i % 9);
    factor.Observe(predicted, 1, 2.0 * predicted);
  }
  EXPECT_NEAR(factor.Scale(), 2.0, 1e-6);
  EXPECT_NEAR(factor.Offset(1), 0.0, 1e-9);

  // measured = 1.5 T + 1 ms + 0.5 ms x n, T and n varying independently, with noise.
  ForwardCostFit full;
  std::mt19937 rng(3);
  std::normal_distribution<double> noise(0.0, 5e-5);
  for (int i = 0; i < 3000; ++i) {
    const double predicted = 1e-3 * (1 + i % 9);
    const int requests = 1 + (i / 9) % 7;
    full.Observe(predicted, requests, 1.5 * predicted + 1e-3 + 0.5e-3 * requests + noise(rng));
  }
  EXPECT_NEAR(full.Scale(), 1.5, 0.05);
  EXPECT_NEAR(full.offset(), 1e-3, 1e-4);
  EXPECT_NEAR(full.per_request(), 0.5e-3, 5e-5);
  EXPECT_NEAR(full.Offset(4), 3e-3, 2e-4);

  // One request count: the per-request part cannot be told from the offset; offset + scale.
  ForwardCostFit affine;
  for (int i = 0; i < 500; ++i) {
    const double predicted = 1e-3 * (1 + i % 9);
    affine.Observe(predicted, 1, 1.5 * predicted + 1e-3 + noise(rng));
  }
  EXPECT_NEAR(affine.Scale(), 1.5, 0.05);
  EXPECT_NEAR(affine.Offset(1), 1e-3, 1e-4);

  // A fitted offset below zero: through the origin instead.
  ForwardCostFit steep;
  for (int i = 0; i < 200; ++i) {
    const double predicted = 1e-3 * (2 + i % 5);
    steep.Observe(predicted, 1, 3.0 * predicted - 1e-3);
  }
  EXPECT_NEAR(steep.Offset(1), 0.0, 1e-12);
  // sum(x y) / sum(x x) over x = 2..6 ms, y = 3x - 1 ms: (3 * 90 - 20) / 90 = 2.778.
  EXPECT_NEAR(steep.Scale(), 250.0 / 90.0, 0.01);

  // One shape only: the ratio, no offset.
  ForwardCostFit one;
  for (int i = 0; i < 50; ++i) one.Observe(2e-3, 4, 5e-3);
  EXPECT_NEAR(one.Scale(), 2.5, 1e-9);
  EXPECT_EQ(one.Offset(4), 0.0);
  // Bad values are ignored.
  one.Observe(0.0, 1, 1.0);
  one.Observe(1e-3, 1, std::nan(""));
  one.Observe(-1.0, 1, 1.0);
  one.Observe(1e-3, 0, 1.0);
  EXPECT_NEAR(one.Scale(), 2.5, 1e-9);
}

TEST(ForwardCostFitTest, ForgetsAnOldRegime) {
  ForwardCostFit fit(/*decay=*/0.95);
  for (int i = 0; i < 500; ++i) fit.Observe(1e-3 * (1 + i % 4), 1, 1e-3 * (1 + i % 4));
  EXPECT_NEAR(fit.Scale(), 1.0, 1e-6);
  for (int i = 0; i < 500; ++i) fit.Observe(1e-3 * (1 + i % 4), 1, 3e-3 * (1 + i % 4));
  EXPECT_NEAR(fit.Scale(), 3.0, 1e-4);
  EXPECT_NEAR(fit.Offset(1), 0.0, 1e-6);
}

TEST(CostTableTest, MedianMonotoneAndInterpolation) {
  std::vector<CostTable::Sample> s;
  for (double t : {5.0, 1.0, 1.1, 0.9, 50.0}) s.push_back({8, 1, t});   // median 1.1
  for (double t : {0.8, 0.7, 0.75, 0.9, 0.6}) s.push_back({16, 1, t});  // median 0.75 -> 1.1
  for (double t : {3.0, 3.0, 3.0, 3.0, 3.0}) s.push_back({32, 1, t});
  for (double t : {1.0, 1.0, 1.0, 1.0, 1.0}) s.push_back({8, 4, t});  // below requests 1 -> 1.1
  for (double t : {4.0, 4.0, 4.0, 4.0, 4.0}) s.push_back({32, 4, t});
  auto table = CostTable::FromSamples(s);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_DOUBLE_EQ(table->StepSeconds(8, 1), 1.1);
  EXPECT_DOUBLE_EQ(table->StepSeconds(16, 1), 1.1);  // made monotone
  EXPECT_DOUBLE_EQ(table->StepSeconds(24, 1), 2.05);
  EXPECT_DOUBLE_EQ(table->StepSeconds(0, 1), 1.1);   // clamped below
  EXPECT_DOUBLE_EQ(table->StepSeconds(48, 1), 4.9);  // last slope (1.9 / 16) beyond
  EXPECT_DOUBLE_EQ(table->StepSeconds(8, 4), 1.1);   // at least requests 1
  EXPECT_DOUBLE_EQ(table->StepSeconds(32, 2), 3.0 + (4.0 - 3.0) / 3.0);
  EXPECT_DOUBLE_EQ(table->StepSeconds(32, 9), 4.0);  // clamped above
  EXPECT_FALSE(table->IsFlat());
  for (int t = 0; t < 64; ++t) {
    EXPECT_LE(table->StepSeconds(t, 1), table->StepSeconds(t + 1, 1));
    EXPECT_LE(table->StepSeconds(t, 1), table->StepSeconds(t, 3));
  }
}

// Beyond a row's last point the table extends it with the slope back to the last point at or
// below half its tokens, not the last segment's; and a row of more requests is raised to the
// one below only where that one was measured. The shape of a measured k = 16 profile: the
// one-request row ends 16 -> 17 tokens with a noisy step (0.47 ms for one token), whose
// extrapolation had priced 32 tokens at 8 requests at 9.3 ms against the 3.4 measured.
TEST(CostTableTest, ANoisyLastSegmentIsNotExtrapolated) {
  std::vector<CostTable::Sample> s;
  auto add = [&](int tokens, int requests, double ms) {
    for (int run = 0; run < 5; ++run) s.push_back({tokens, requests, ms * 1e-3});
  };
  add(1, 1, 1.1);
  add(8, 1, 1.33);
  add(16, 1, 1.83);
  add(17, 1, 2.30);
  add(8, 8, 1.42);
  add(16, 8, 1.83);
  add(32, 8, 3.4);
  add(64, 8, 6.4);
  auto table = CostTable::FromSamples(s);
  ASSERT_TRUE(table.ok()) << table.status();
  // Requests 8 keep their own measurements above 17 tokens (at least 2.30 ms there).
  EXPECT_NEAR(table->StepSeconds(32, 8), 3.4e-3, 1e-12);
  EXPECT_NEAR(table->StepSeconds(64, 8), 6.4e-3, 1e-12);
  EXPECT_NEAR(table->StepSeconds(16, 8), 1.83e-3, 1e-12);
  // Requests 1 beyond 17 tokens: the slope from 8 tokens (1.33 ms) to 17 (2.30 ms).
  const double slope = (2.30 - 1.33) / 9.0 * 1e-3;
  EXPECT_NEAR(table->StepSeconds(17, 1), 2.30e-3, 1e-12);
  EXPECT_NEAR(table->StepSeconds(33, 1), 2.30e-3 + 16 * slope, 1e-12);
  // Requests 8 beyond 64 tokens: the slope from 32 to 64.
  EXPECT_NEAR(table->StepSeconds(96, 8), 6.4e-3 + 32 * (3.0e-3 / 32), 1e-12);
  // At the 8-request row's points where one request was measured, more requests never cost less.
  for (int t : {8, 16}) EXPECT_LE(table->StepSeconds(t, 1), table->StepSeconds(t, 8)) << t;
}

TEST(CostTableTest, RejectsTooFewRunsAndBadSamples) {
  std::vector<CostTable::Sample> s(4, {8, 1, 1.0});
  EXPECT_EQ(CostTable::FromSamples(s).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CostTable::FromSamples(s, 4).ok());
  EXPECT_EQ(CostTable::FromSamples({}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CostTable::Sample> bad = {{8, 0, 1.0}};
  EXPECT_EQ(CostTable::FromSamples(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<CostTable::Sample> nan = {{8, 1, std::nan("")}};
  EXPECT_EQ(CostTable::FromSamples(nan, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CostTableTest, ProfilesEachShapeAtLeastFiveTimes) {
  int calls = 0;
  auto run = [&](int tokens, int requests) -> absl::StatusOr<double> {
    ++calls;
    // Every fifth run is a 10x outlier; the median ignores it.
    return (calls % 5 == 0 ? 10.0 : 1.0) * (1e-3 + 1e-5 * tokens + 1e-4 * requests);
  };
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {64, 1}, {4, 4}, {64, 4}};
  auto table = ProfileCostTable(run, shapes, 5, 1);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(calls, 40);  // each measured run after one warm-up run
  EXPECT_NEAR(table->StepSeconds(64, 1), 1e-3 + 64e-5 + 1e-4, 1e-12);
  EXPECT_NEAR(table->StepSeconds(4, 4), 1e-3 + 4e-5 + 4e-4, 1e-12);
  EXPECT_EQ(ProfileCostTable(run, shapes, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProfileCostTable(run, shapes, 5, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  calls = 0;
  ASSERT_TRUE(ProfileCostTable(run, shapes, 5, 0).ok());
  EXPECT_EQ(calls, 20);
  auto failing = [](int, int) -> absl::StatusOr<double> {
    return absl::UnavailableError("backend gone");
  };
  EXPECT_EQ(ProfileCostTable(failing, shapes).status().code(), absl::StatusCode::kUnavailable);
}

// The first shape's runs all slow (a busy machine): made monotone, the first pass's table is flat,
// so the profile runs once more and keeps the second. A backend that is flat stays flat (after
// the second pass).
// The runs go round the shapes: a burst of slow runs shorter than half the profile reaches fewer
// than half of each shape's runs and leaves every median alone (run shape by shape, the same burst
// would have slowed all five runs of the first shape, and the running maximum would have carried
// that to the whole table); one longer than that flattens the table, which is then measured once
// more.
TEST(CostTableTest, ABurstOfSlowRunsLeavesTheMediansAlone) {
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {64, 1}, {4, 4}, {64, 4}};
  auto truth = [](int tokens, int requests) { return 1e-3 + 1e-5 * tokens + 1e-4 * requests; };
  int calls = 0;
  std::vector<std::pair<int, int>> order;
  auto burst = [&](int tokens, int requests) -> absl::StatusOr<double> {
    ++calls;
    order.push_back({tokens, requests});
    return calls > 4 && calls <= 20 ? 1.0 : truth(tokens, requests);
  };
  auto table = ProfileCostTable(burst, shapes, 5, 1);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(calls, 40);
  ASSERT_EQ(order.size(), 40u);
  // Each shape's warm-up run, then its measured run.
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i], shapes[(i / 2) % shapes.size()]) << i;
  }
  for (const auto& [tokens, requests] : shapes) {
    EXPECT_NEAR(table->StepSeconds(tokens, requests), truth(tokens, requests), 1e-12)
        << tokens << " x " << requests;
  }
}

// A step costs more right after a step of another shape (caches evicted), as the CPU backend's
// do: a run right after a larger shape's costs twice its steady cost. Each measured run follows a
// warm-up run of its own shape, so the table holds the steady costs; without warm-up runs the
// round (1 token after 64 tokens at 4 requests, ...) doubles most of them and flattens the table.
TEST(CostTableTest, WarmUpRunsMeasureTheSteadyCost) {
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {4, 1}, {16, 1}, {64, 4}};
  auto steady = [](int tokens, int requests) { return 1e-3 + 1e-4 * tokens + 1e-4 * requests; };
  for (int warm_runs : {1, 0}) {
    std::pair<int, int> previous = {0, 0};
    auto run = [&](int tokens, int requests) -> absl::StatusOr<double> {
      const bool after_larger = previous.first * previous.second > tokens * requests;
      previous = {tokens, requests};
      return (after_larger ? 2.0 : 1.0) * steady(tokens, requests);
    };
    auto table = ProfileCostTable(run, shapes, 5, warm_runs);
    ASSERT_TRUE(table.ok()) << table.status();
    if (warm_runs == 1) {
      for (const auto& [tokens, requests] : shapes) {
        EXPECT_NEAR(table->StepSeconds(tokens, requests), steady(tokens, requests), 1e-12)
            << tokens << " x " << requests;
      }
    } else {
      // 1 token always ran after the 64 x 4 shape: priced at twice its cost, above 4 tokens.
      EXPECT_NEAR(table->StepSeconds(1, 1), 2 * steady(1, 1), 1e-12);
      EXPECT_NEAR(table->StepSeconds(4, 1), 2 * steady(1, 1), 1e-12);  // made monotone
    }
  }
}

// By default each measured run follows four warm-up runs of its shape (a CPU recovers from a
// larger step over several), or one of a shape that takes warm_seconds (20 ms) or more.
TEST(CostTableTest, DefaultWarmUpIsFourRunsOrTwentyMilliseconds) {
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {64, 1}};
  std::vector<std::pair<int, int>> order;
  auto run = [&](int tokens, int requests) -> absl::StatusOr<double> {
    order.push_back({tokens, requests});
    return tokens == 1 ? 1e-3 : 0.05;
  };
  ASSERT_TRUE(ProfileCostTable(run, shapes).ok());
  ASSERT_EQ(order.size(), 5u * (5 + 2));
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i], shapes[i % 7 < 5 ? 0 : 1]) << i;
  }
  order.clear();
  // 8 ms runs: three make 24 ms, so the fourth is the measured one.
  auto slow = [&](int tokens, int requests) -> absl::StatusOr<double> {
    order.push_back({tokens, requests});
    return 8e-3;
  };
  // (Equal times make a flat table, profiled twice.)
  ASSERT_TRUE(ProfileCostTable(slow, {{1, 1}, {2, 1}}).ok());
  EXPECT_EQ(order.size(), 2u * 5 * 2 * 4);
}

TEST(CostTableTest, AFlatProfileIsMeasuredOnceMore) {
  const std::vector<std::pair<int, int>> shapes = {{1, 1}, {64, 1}, {4, 4}, {64, 4}};
  int calls = 0;
  // The first three rounds over the shapes run slow: every median is slow, the table flat.
  auto busy_start = [&](int tokens, int requests) -> absl::StatusOr<double> {
    ++calls;
    return calls <= 24 ? 1.0 : 1e-3 + 1e-5 * tokens + 1e-4 * requests;
  };
  auto table = ProfileCostTable(busy_start, shapes, 5, 1);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(calls, 80);
  EXPECT_FALSE(table->IsFlat());
  EXPECT_NEAR(table->StepSeconds(64, 1), 1e-3 + 64e-5 + 1e-4, 1e-12);

  calls = 0;
  auto flat = [&](int, int) -> absl::StatusOr<double> {
    ++calls;
    return 2e-3;
  };
  table = ProfileCostTable(flat, shapes, 5, 1);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(calls, 80);
  EXPECT_TRUE(table->IsFlat());
}

TEST(SurvivalTest, NgramStatsLearnPerMatchLengthAndPosition) {
  NgramSurvivalStats stats(
      4, {.max_positions = 4, .prior_mean = 0.5, .prior_weight = 2.0, .decay = 0.9999});
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  // Match length 3: c = (0.9, 0.5, 0.5, ...); tokens verified 4 at a time.
  for (int i = 0; i < 20000; ++i) {
    int accepted = 0;
    while (accepted < 4 && u(rng) < (accepted == 0 ? 0.9 : 0.5)) ++accepted;
    stats.Observe(3, 4, accepted);
  }
  std::vector<double> a;
  stats.Survival(3, 5, &a);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_NEAR(a[0], 0.9, 0.01);
  EXPECT_NEAR(a[1], 0.45, 0.015);
  EXPECT_NEAR(a[2], 0.225, 0.015);
  for (int j = 1; j < 5; ++j) EXPECT_LE(a[j], a[j - 1]);
  stats.Survival(1, 2, &a);  // untouched key: the prior
  EXPECT_DOUBLE_EQ(a[0], 0.5);
  EXPECT_DOUBLE_EQ(a[1], 0.25);
  stats.Survival(99, 1, &a);  // clamps to the longest key (4), also untouched
  EXPECT_DOUBLE_EQ(a[0], 0.5);
}

TEST(SurvivalTest, DraftCalibrationIsMonotoneAndTracksTheTruth) {
  DraftCalibration cal({.bins = 10, .prior_weight = 1.0, .decay = 1.0});
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<double> u(0, 1);
  // True acceptance = confidence^2.
  for (int i = 0; i < 40000; ++i) {
    const float conf = static_cast<float>(u(rng));
    cal.Observe(std::vector<float>{conf}, 1, u(rng) < conf * conf ? 1 : 0);
  }
  for (double c = 0.05; c < 1.0; c += 0.1) EXPECT_NEAR(cal.Conditional(c), c * c, 0.03) << c;
  for (double c = 0.0; c < 1.0; c += 0.01) EXPECT_LE(cal.Conditional(c), cal.Conditional(c + 0.01));
  std::vector<double> a;
  cal.Survival(std::vector<float>{0.95f, 0.55f}, &a);
  EXPECT_NEAR(a[1], 0.95 * 0.95 * 0.55 * 0.55, 0.03);
  cal.PositionPrior(2, &a);  // position 0 saw E[conf^2] = 1/3 acceptance
  EXPECT_NEAR(a[0], 1.0 / 3, 0.02);
  // A non-monotone truth is fitted monotone.
  DraftCalibration odd({.bins = 4, .prior_weight = 0.1, .decay = 1.0});
  for (int i = 0; i < 1000; ++i) {
    odd.Observe(std::vector<float>{0.1f}, 1, i % 10 < 8);  // 0.8 at low confidence
    odd.Observe(std::vector<float>{0.4f}, 1, i % 10 < 2);  // 0.2 above it
  }
  EXPECT_NEAR(odd.Conditional(0.1), 0.5, 0.01);
  EXPECT_NEAR(odd.Conditional(0.4), 0.5, 0.01);
}

}  // namespace
}  // namespace deepinfer::engine::speculative

namespace deepinfer::engine::speculative {
namespace {

TEST(DraftingRateCheckTest, BucketsArePowersOfTwo) {
  const std::vector<std::pair<int, int>> cases = {{1, 0}, {2, 1}, {3, 2},  {4, 2}, {5, 3},
                                                  {8, 3}, {9, 4}, {32, 5}, {33, 6}};
  for (const auto& [n, b] : cases) EXPECT_EQ(DraftingRateCheck::Bucket(n), b) << n;
}

// Drafting steps at 15 tokens / 40 ms (375 tokens/s) against plain ones at 10 / 20 ms (500):
// vetoed for that bucket only, until the drafting data decays below min_weight / 4; faster
// drafting is never vetoed; without data for both modes nothing is.
TEST(DraftingRateCheckTest, VetoesMeasuredSlowerDraftingUntilItFades) {
  DraftingRateCheck check;  // decay 0.99, min_weight 8
  EXPECT_TRUE(check.DraftingPays(8));
  for (int i = 0; i < 20; ++i) check.Observe(8, /*drafted=*/true, 15, 0.040);
  EXPECT_TRUE(check.DraftingPays(8));  // nothing to compare with yet
  for (int i = 0; i < 20; ++i) {
    check.Observe(8, false, 10, 0.020);
    check.Observe(6, true, 15, 0.040);  // same bucket (5-8)
  }
  EXPECT_NEAR(check.Rate(8, true), 375.0, 1e-9);
  EXPECT_NEAR(check.Rate(7, false), 500.0, 1e-9);
  EXPECT_FALSE(check.DraftingPays(8));
  EXPECT_FALSE(check.DraftingPays(5));
  EXPECT_TRUE(check.DraftingPays(4));   // another bucket
  EXPECT_TRUE(check.DraftingPays(16));  // another bucket
  // Only plain steps from here: the drafting weight w decays by 0.99 per step; the veto holds
  // while w >= 2 (min_weight / 4).
  const double w = check.Weight(8, true);
  ASSERT_GT(w, 8.0);
  const int fade = static_cast<int>(std::ceil(std::log(2.0 / w) / std::log(0.99)));
  for (int i = 1; i < fade; ++i) check.Observe(8, false, 10, 0.020);
  EXPECT_FALSE(check.DraftingPays(8)) << "w = " << check.Weight(8, true);
  check.Observe(8, false, 10, 0.020);
  EXPECT_TRUE(check.DraftingPays(8)) << "w = " << check.Weight(8, true);
  // Measured anew: drafting at 30 tokens / 40 ms (750 tokens/s) wins; never vetoed.
  DraftingRateCheck fast;
  for (int i = 0; i < 50; ++i) {
    fast.Observe(32, true, 30, 0.040);
    fast.Observe(32, false, 10, 0.020);
    EXPECT_TRUE(fast.DraftingPays(32));
  }
  // Bad observations change nothing.
  DraftingRateCheck bad;
  bad.Observe(0, true, 10, 0.01);
  bad.Observe(4, true, -1, 0.01);
  bad.Observe(4, true, 10, 0.0);
  bad.Observe(4, true, 10, std::nan(""));
  EXPECT_EQ(bad.Weight(4, true), 0.0);
  EXPECT_EQ(bad.Rate(4, true), 0.0);
}

}  // namespace
}  // namespace deepinfer::engine::speculative

namespace deepinfer::engine::speculative {
namespace {

// The confidence stop: position 0 always, then while the product of calibrated conditionals
// holds up; a probe's stop lets exactly `past` positions through after the first it declines,
// whatever their confidences, and none after them.
TEST(ConfidenceStopTest, StopsAtTheThresholdAndAProbeGoesOnePositionPast) {
  DraftCalibration calibration;  // no observations: Conditional(c) = c (the prior)
  ASSERT_NEAR(calibration.Conditional(0.5), 0.5, 0.05);
  const double c09 = calibration.Conditional(0.9);
  const double c05 = calibration.Conditional(0.5);
  // Threshold between a_1 = c(0.9) c(0.9) and a_2 = a_1 c(0.5).
  const double threshold = 0.5 * (c09 * c09 + c09 * c09 * c05);
  ConfidenceStop plain(&calibration, threshold);
  EXPECT_TRUE(plain(0, 0.01f));  // the first token is always drafted: a_0 ignored
  ConfidenceStop stop(&calibration, threshold);
  EXPECT_TRUE(stop(0, 0.9f));
  EXPECT_TRUE(stop(1, 0.9f));
  EXPECT_FALSE(stop(2, 0.5f));
  EXPECT_FALSE(stop(3, 1.0f));  // once declined, never again
  ConfidenceStop probe(&calibration, threshold, /*past=*/1);
  EXPECT_TRUE(probe(0, 0.9f));
  EXPECT_TRUE(probe(1, 0.9f));
  EXPECT_TRUE(probe(2, 0.5f));   // the declined position, let through
  EXPECT_FALSE(probe(3, 1.0f));  // and no further, however confident
  ConfidenceStop two(&calibration, threshold, /*past=*/2);
  EXPECT_TRUE(two(0, 0.9f));
  EXPECT_TRUE(two(1, 0.9f));
  EXPECT_TRUE(two(2, 0.5f));
  EXPECT_TRUE(two(3, 0.1f));
  EXPECT_FALSE(two(4, 1.0f));
  // A threshold of 0 never declines: past is never used.
  ConfidenceStop open(&calibration, 0.0, /*past=*/1);
  for (int j = 0; j < 8; ++j) EXPECT_TRUE(open(j, 0.2f)) << j;
}

// The profile's rows: powers of two per request up to k + 1 at 1, 8 and 32 requests, plus the
// edges of the backend's passes over the weights from each row's fewest tokens up.
TEST(CostProfileShapesTest, RowsHoldPowersOfTwoAndThePassEdges) {
  using Shapes = std::vector<std::pair<int, int>>;
  auto all = [](int, int) { return true; };
  // No passes to see (a GPU, or one row a pass): 1, 2, 4, 8 and 9 tokens per request.
  EXPECT_EQ(CostProfileShapes(8, 32, 1, 24, 32, all), (Shapes{{1, 1},
                                                              {2, 1},
                                                              {4, 1},
                                                              {8, 1},
                                                              {9, 1},
                                                              {8, 8},
                                                              {16, 8},
                                                              {32, 8},
                                                              {64, 8},
                                                              {72, 8},
                                                              {32, 32},
                                                              {64, 32},
                                                              {128, 32},
                                                              {256, 32},
                                                              {288, 32}}));
  // Passes of 4 rows, at most 6 edges a row: one request adds 5 tokens (4, 8 and 9 are powers of
  // two or k + 1 already); 8 requests add 9, 12, 13 and 17. At most 8 requests: no third row.
  EXPECT_EQ(CostProfileShapes(8, 8, 4, 6, 32, all), (Shapes{{1, 1},
                                                            {2, 1},
                                                            {4, 1},
                                                            {5, 1},
                                                            {8, 1},
                                                            {9, 1},
                                                            {8, 8},
                                                            {9, 8},
                                                            {12, 8},
                                                            {13, 8},
                                                            {16, 8},
                                                            {17, 8},
                                                            {32, 8},
                                                            {64, 8},
                                                            {72, 8}}));
  // Passes of 16 from 32 requests: the edges start at the row's fewest tokens (32), not at 16.
  const Shapes amx = CostProfileShapes(2, 32, 16, 4, 32, all);
  EXPECT_EQ(Shapes(amx.end() - 6, amx.end()),
            (Shapes{{32, 32}, {33, 32}, {48, 32}, {49, 32}, {64, 32}, {96, 32}}));
  // Edges only in the rows of at most edge_requests requests (here the one-request row's 5).
  EXPECT_EQ(CostProfileShapes(8, 8, 4, 24, 1, all), (Shapes{{1, 1},
                                                            {2, 1},
                                                            {4, 1},
                                                            {5, 1},
                                                            {8, 1},
                                                            {9, 1},
                                                            {8, 8},
                                                            {16, 8},
                                                            {32, 8},
                                                            {64, 8},
                                                            {72, 8}}));
  // A row ends at its first shape that does not fit.
  EXPECT_EQ(
      CostProfileShapes(8, 8, 4, 24, 32, [](int tokens, int) { return tokens <= 13; }),
      (Shapes{{1, 1}, {2, 1}, {4, 1}, {5, 1}, {8, 1}, {9, 1}, {8, 8}, {9, 8}, {12, 8}, {13, 8}}));
}

}  // namespace
}  // namespace deepinfer::engine::speculative
