#include "engine/spec/mode_selector.h"

#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::engine::spec {
namespace {

using Options = DraftModeSelector::Options;

// Runs `steps` steps at `decoding` decoding sequences where mode m emits rate[m] tokens per
// second in steps of `step_seconds`; returns the steps each mode ran.
std::vector<int> RunSteps(DraftModeSelector& s, int decoding, const std::vector<double>& rate,
                          int steps, double step_seconds = 0.01) {
  std::vector<int> ran(rate.size(), 0);
  for (int i = 0; i < steps; ++i) {
    const DraftModeSelector::Choice c = s.Choose(decoding);
    ++ran[c.mode];
    s.Observe(decoding, c.mode, c.measured, rate[c.mode] * step_seconds, step_seconds);
  }
  return ran;
}

TEST(DraftModeSelectorTest, RefusesBadModesAndOptions) {
  EXPECT_FALSE(DraftModeSelector::Create({}, Options()).ok());
  EXPECT_FALSE(DraftModeSelector::Create({0, 1, 1}, Options()).ok());
  EXPECT_FALSE(DraftModeSelector::Create({0, -2}, Options()).ok());
  Options bad;
  bad.memory_seconds = 0.0;
  EXPECT_FALSE(DraftModeSelector::Create({0, 1}, bad).ok());
  bad = Options();
  bad.max_gap_epochs = 2;
  bad.min_gap_epochs = 3;
  EXPECT_FALSE(DraftModeSelector::Create({0, 1}, bad).ok());
  EXPECT_TRUE(DraftModeSelector::Create({DraftModeSelector::kPlan, 0, 1, 2}, Options()).ok());
}

TEST(DraftModeSelectorTest, TriesEveryModeOnceInOrderThenRunsTheBest) {
  Options o;
  o.epoch_steps = 10;
  o.epoch_seconds = 0.0;
  o.warmup_steps = 2;
  auto s = DraftModeSelector::Create({DraftModeSelector::kPlan, 0, 1, 2}, o);
  ASSERT_TRUE(s.ok());
  const std::vector<double> rate = {300.0, 250.0, 400.0, 350.0};
  for (int m = 0; m < 4; ++m) {
    for (int i = 0; i < 10; ++i) {
      const DraftModeSelector::Choice c = s->Choose(1);
      EXPECT_EQ(c.mode, m) << "epoch " << m << " step " << i;
      // Only the first two steps after a change are left out of the measurement.
      EXPECT_EQ(c.measured, i >= 2) << "epoch " << m << " step " << i;
      s->Observe(1, c.mode, c.measured, rate[c.mode] * 0.01, 0.01);
    }
    EXPECT_NEAR(s->Rate(1, m), rate[m], 1e-9);
  }
  // Best (mode 2, 400 tokens/s) from now on, until a loser is due: the closest (mode 3, deficit
  // 0.125 -> gap 25 epochs) first.
  const DraftModeSelector::Choice c = s->Choose(1);
  EXPECT_EQ(c.mode, 2);
  EXPECT_FALSE(c.measured);  // a change of mode
  s->Observe(1, c.mode, c.measured, 4.0, 0.01);
  const std::vector<int> ran = RunSteps(*s, 1, rate, 9 + 10 * 20);
  EXPECT_EQ(ran[2], 9 + 10 * 20);
  EXPECT_EQ(s->explorations(), 0);
}

TEST(DraftModeSelectorTest, LosersCostAboutExploreCostEach) {
  Options o;
  o.epoch_steps = 16;
  o.epoch_seconds = 0.0;
  o.explore_cost = 0.005;
  auto s = DraftModeSelector::Create({DraftModeSelector::kPlan, 0, 1, 2, 4, 8}, o);
  ASSERT_TRUE(s.ok());
  // Deficits 0.1, 0.3, 0.5, 0.2, 0.6 against mode 3 (500 tokens/s): gaps 20, 60, 100, 40, 120.
  const std::vector<double> rate = {450.0, 350.0, 250.0, 500.0, 400.0, 200.0};
  const int epochs = 6000;
  const std::vector<int> ran = RunSteps(*s, 8, rate, 16 * epochs);
  // Each loser runs about one epoch per gap (1/20, 1/60, 1/100, 1/40, 1/120 of the epochs);
  // weighted by its deficit, each costs about 0.005 of the best's rate.
  double tokens = 0.0;
  for (size_t m = 0; m < rate.size(); ++m) tokens += ran[m] * rate[m];
  const double best = 16.0 * epochs * rate[3];
  EXPECT_GT(tokens / best, 1.0 - 5 * 0.005 - 0.01);
  EXPECT_LT(tokens / best, 1.0 - 5 * 0.005 + 0.01);
  EXPECT_NEAR(ran[0] / 16.0, epochs / 20.0, epochs / 20.0 * 0.1);
  EXPECT_NEAR(ran[5] / 16.0, epochs / 120.0, epochs / 120.0 * 0.1 + 1);
  EXPECT_GT(ran[3], 16 * epochs * 0.85);
}

TEST(DraftModeSelectorTest, FollowsAChangeOfTheBestMode) {
  Options o;
  o.epoch_steps = 8;
  o.epoch_seconds = 0.0;
  o.memory_seconds = 0.5;
  auto s = DraftModeSelector::Create({0, 1, 2}, o);
  ASSERT_TRUE(s.ok());
  std::vector<int> ran = RunSteps(*s, 4, {300.0, 400.0, 380.0}, 8 * 200);
  EXPECT_GT(ran[1], ran[0] + ran[2]);
  // Mode 1 slows down (its revisits of the others show mode 2 ahead): the selector moves.
  ran = RunSteps(*s, 4, {300.0, 300.0, 380.0}, 8 * 400);
  EXPECT_GT(ran[2], 8 * 400 * 0.8);
  EXPECT_EQ(s->current(), 2);
}

TEST(DraftModeSelectorTest, BucketsOfDecodingCountsChooseApart) {
  Options o;
  o.epoch_steps = 4;
  o.epoch_seconds = 0.0;
  auto s = DraftModeSelector::Create({0, 1}, o);
  ASSERT_TRUE(s.ok());
  // One sequence: drafting pays; 32: it does not.
  RunSteps(*s, 1, {100.0, 200.0}, 400);
  RunSteps(*s, 32, {900.0, 600.0}, 400);
  EXPECT_GT(s->Rate(1, 1), s->Rate(1, 0));
  EXPECT_GT(s->Rate(32, 0), s->Rate(32, 1));
  std::vector<int> ran = RunSteps(*s, 1, {100.0, 200.0}, 400);
  EXPECT_GT(ran[1], 340);
  ran = RunSteps(*s, 32, {900.0, 600.0}, 400);
  EXPECT_GT(ran[0], 340);
  EXPECT_EQ(DraftModeSelector::Bucket(1), 0);
  EXPECT_EQ(DraftModeSelector::Bucket(2), 1);
  EXPECT_EQ(DraftModeSelector::Bucket(4), 2);
  EXPECT_EQ(DraftModeSelector::Bucket(5), 3);
  EXPECT_EQ(DraftModeSelector::Bucket(32), 5);
}

TEST(DraftModeSelectorTest, EpochsLastTheirSecondsAndIgnoreBadObservations) {
  Options o;
  o.epoch_steps = 2;
  o.epoch_seconds = 0.095;
  o.warmup_steps = 0;
  auto s = DraftModeSelector::Create({0, 1}, o);
  ASSERT_TRUE(s.ok());
  // 0.01 s steps: an epoch needs 10 of them, not 2.
  for (int i = 0; i < 10; ++i) {
    const DraftModeSelector::Choice c = s->Choose(2);
    EXPECT_EQ(c.mode, 0);
    s->Observe(2, c.mode, c.measured, 1.0, 0.01);
  }
  // Bad observations neither count nor measure.
  s->Observe(2, 0, true, -1.0, 0.01);
  s->Observe(2, 0, true, 1.0, 0.0);
  s->Observe(2, 7, true, 1.0, 0.01);
  s->Observe(0, 0, true, 1.0, 0.01);
  EXPECT_NEAR(s->Rate(2, 0), 100.0, 1e-9);
  EXPECT_EQ(s->Choose(2).mode, 1);
  EXPECT_EQ(s->epochs(), 2);
}

}  // namespace
}  // namespace deepinfer::engine::spec
