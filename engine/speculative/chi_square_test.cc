#include "engine/speculative/chi_square.h"

#include <cmath>

#include "gtest/gtest.h"

namespace deepinfer::engine::speculative {
namespace {

TEST(ChiSquareTest, UpperGammaMatchesTables) {
  // Critical values of the chi-square distribution: P(X > x) for dof k is Q(k/2, x/2).
  EXPECT_NEAR(UpperRegularizedGamma(0.5, 3.841459 / 2), 0.05, 1e-6);
  EXPECT_NEAR(UpperRegularizedGamma(2.0, 13.276704 / 2), 0.01, 1e-6);
  EXPECT_NEAR(UpperRegularizedGamma(5.0, 18.307038 / 2), 0.05, 1e-6);
  EXPECT_NEAR(UpperRegularizedGamma(12.0, 36.415029 / 2), 0.05, 1e-6);  // dof 24
  EXPECT_NEAR(UpperRegularizedGamma(1.0, 2.0), std::exp(-2.0), 1e-12);
  EXPECT_EQ(UpperRegularizedGamma(3.0, 0.0), 1.0);
}

TEST(ChiSquareTest, Statistic) {
  const ChiSquare r = ChiSquareTest({30, 70, 0}, {0.5, 0.5, 0.0});
  EXPECT_DOUBLE_EQ(r.statistic, 16.0);  // (30-50)^2/50 + (70-50)^2/50
  EXPECT_EQ(r.dof, 1);
  EXPECT_EQ(r.impossible, 0);
  EXPECT_LT(r.p_value, 1e-4);
  EXPECT_EQ(ChiSquareTest({1, 1}, {1.0, 0.0}).impossible, 1);
  EXPECT_EQ(ChiSquareTest({1, 1}, {1.0, 0.0}).p_value, 0.0);
  EXPECT_GT(ChiSquareTest({50, 50}, {0.5, 0.5}).p_value, 0.99);
}

}  // namespace
}  // namespace deepinfer::engine::speculative
