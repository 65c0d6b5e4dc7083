#include "engine/speculative/chi_square.h"

#include <cmath>

namespace deepinfer::engine::speculative {

double UpperRegularizedGamma(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    // Series for the lower function P(a, x).
    double term = 1.0 / a, sum = term;
    for (int n = 1; n < 10000; ++n) {
      term *= x / (a + n);
      sum += term;
      if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  // Continued fraction for Q(a, x) (modified Lentz).
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::fabs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

ChiSquare ChiSquareTest(const std::vector<int64_t>& counts, const std::vector<double>& expected) {
  ChiSquare r;
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  int cells = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] <= 0.0) {
      r.impossible += counts[i];
      continue;
    }
    const double e = expected[i] * n;
    r.statistic += (counts[i] - e) * (counts[i] - e) / e;
    ++cells;
  }
  r.dof = cells - 1;
  r.p_value = r.impossible > 0 ? 0.0
              : r.dof <= 0     ? 1.0
                               : UpperRegularizedGamma(r.dof / 2.0, r.statistic / 2.0);
  return r;
}

}  // namespace deepinfer::engine::speculative
