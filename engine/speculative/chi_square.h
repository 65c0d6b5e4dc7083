// Pearson's chi-square goodness-of-fit test, for statistical tests of samplers (test-only).
#ifndef DEEPINFER_ENGINE_SPECULATIVE_CHI_SQUARE_H_
#define DEEPINFER_ENGINE_SPECULATIVE_CHI_SQUARE_H_

#include <cstdint>
#include <vector>

namespace deepinfer::engine::speculative {

struct ChiSquare {
  double statistic = 0.0;
  int dof = 0;
  double p_value = 1.0;
  // Counts that fell where the expected probability is 0 (any makes p_value 0).
  int64_t impossible = 0;
};

// Regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a), a > 0, x >= 0.
double UpperRegularizedGamma(double a, double x);

// Compares `counts` with `expected` probabilities (same length, summing to 1). Cells with
// expected probability 0 are left out of the statistic and counted in `impossible`.
ChiSquare ChiSquareTest(const std::vector<int64_t>& counts, const std::vector<double>& expected);

}  // namespace deepinfer::engine::speculative

#endif  // DEEPINFER_ENGINE_SPECULATIVE_CHI_SQUARE_H_
