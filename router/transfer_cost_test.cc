#include "router/transfer_cost.h"

#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {

TEST(TransferCostModelTest, NothingBeforeMinSamplesThenTheFittedLines) {
  TransferCostModel model({.decay = 1.0, .min_samples = 3});
  model.Observe(100, 1000 + 10 * 100, 500);
  model.Observe(1000, 1000 + 10 * 1000, 520);
  EXPECT_FALSE(model.Predict(500).has_value());
  model.Observe(2000, 1000 + 10 * 2000, 540);
  std::optional<TransferCostEstimate> e = model.Predict(500);
  ASSERT_TRUE(e.has_value());
  // compute = 1000 + 10 t exactly; exposed = 500 + 0.02 t up to the fit of three points.
  EXPECT_NEAR(e->prefill_compute_us, 6000, 1e-6);
  EXPECT_NEAR(e->exposed_transfer_us, 508.6, 2);
  // Clamped at zero far below the data.
  TransferCostModel falling({.decay = 1.0, .min_samples = 2});
  falling.Observe(10, 100, 0);
  falling.Observe(20, 0, 0);
  EXPECT_EQ(falling.Predict(100)->prefill_compute_us, 0);
}

TEST(TransferCostModelTest, OneTokenCountGivesTheMeanAndDecayFollowsChange) {
  TransferCostModel model({.decay = 0.5, .min_samples = 1});
  model.Observe(64, 100, 10);
  EXPECT_DOUBLE_EQ(model.Predict(4096)->prefill_compute_us, 100);
  for (int i = 0; i < 20; ++i) model.Observe(64, 300, 30);
  EXPECT_NEAR(model.Predict(64)->prefill_compute_us, 300, 1e-3);
  EXPECT_NEAR(model.Predict(64)->exposed_transfer_us, 30, 1e-3);
  model.Observe(0, 1e9, 1e9);  // ignored
  EXPECT_NEAR(model.Predict(64)->prefill_compute_us, 300, 1e-3);
}

}  // namespace
}  // namespace deepinfer::router
