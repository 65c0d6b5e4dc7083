#include "router/transfer_cost.h"

#include <algorithm>
#include <cmath>

namespace deepinfer::router {

void TransferCostModel::Fit::Add(double weight_decay, double xv, double yv) {
  w = w * weight_decay + 1;
  x = x * weight_decay + xv;
  xx = xx * weight_decay + xv * xv;
  y = y * weight_decay + yv;
  xy = xy * weight_decay + xv * yv;
}

double TransferCostModel::Fit::At(double xv) const {
  if (w <= 0) return 0;
  const double det = w * xx - x * x;
  // Every observation at (nearly) one token count: no slope to fit.
  if (det <= 1e-9 * std::max(1.0, w * xx)) return std::max(0.0, y / w);
  const double slope = (w * xy - x * y) / det;
  const double intercept = (y - slope * x) / w;
  return std::max(0.0, intercept + slope * xv);
}

void TransferCostModel::Observe(int64_t tokens, double compute_us, double exposed_us) {
  if (tokens < 1 || !std::isfinite(compute_us) || !std::isfinite(exposed_us)) return;
  absl::MutexLock lock(&mu_);
  ++samples_;
  compute_.Add(options_.decay, static_cast<double>(tokens), std::max(0.0, compute_us));
  exposed_.Add(options_.decay, static_cast<double>(tokens), std::max(0.0, exposed_us));
}

std::optional<TransferCostEstimate> TransferCostModel::Predict(int64_t tokens) const {
  absl::MutexLock lock(&mu_);
  if (samples_ < options_.min_samples) return std::nullopt;
  TransferCostEstimate e;
  e.prefill_compute_us = compute_.At(static_cast<double>(tokens));
  e.exposed_transfer_us = exposed_.At(static_cast<double>(tokens));
  return e;
}

}  // namespace deepinfer::router
