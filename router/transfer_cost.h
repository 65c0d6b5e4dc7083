// The measured cost of disaggregating a prefill, for the placement's transfer-cost rule
// (PlacementOptions::max_exposed_transfer_fraction): from finished disaggregated requests
// (Timing.prefill_compute_us and kv_transfer_exposed_us against the tokens the prefill node
// computed), two lines, compute_us ~ a + b * tokens and exposed_us ~ c + d * tokens, fitted by
// least squares with exponentially decaying weights (each observation multiplies the weight of
// the earlier ones by `decay`), so the model follows the cluster's load. With the KV streamed
// layer by layer, exposed transfer is nearly constant while compute grows with the prompt:
// below the crossover the transfer costs a large share of the TTFT and a decode worker that can
// prefill should do it itself.
//
// Predict gives nothing until `min_samples` observations arrived; with every observation at one
// token count, the lines are flat (the weighted means). Predictions are clamped at >= 0.
//
// Thread-safety: thread-safe.
#ifndef DEEPINFER_ROUTER_TRANSFER_COST_H_
#define DEEPINFER_ROUTER_TRANSFER_COST_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace deepinfer::router {

struct TransferCostEstimate {
  double prefill_compute_us = 0;
  double exposed_transfer_us = 0;
};

class TransferCostModel {
 public:
  struct Options {
    double decay = 0.98;  // in (0, 1]
    int min_samples = 8;  // >= 1
  };
  TransferCostModel() : TransferCostModel(Options()) {}
  explicit TransferCostModel(Options options) : options_(options) {}

  // One finished disaggregated request: the prefill node computed `tokens` (>= 1; others are
  // ignored) in `compute_us` and the transfer left `exposed_us` after it.
  void Observe(int64_t tokens, double compute_us, double exposed_us);
  // The estimate for a prefill of `tokens`, or nullopt before min_samples observations.
  std::optional<TransferCostEstimate> Predict(int64_t tokens) const;

 private:
  struct Fit {
    double w = 0, x = 0, xx = 0, y = 0, xy = 0;  // weighted sums
    void Add(double weight_decay, double xv, double yv);
    double At(double xv) const;
  };

  const Options options_;
  mutable absl::Mutex mu_;
  int64_t samples_ ABSL_GUARDED_BY(mu_) = 0;
  Fit compute_ ABSL_GUARDED_BY(mu_);
  Fit exposed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_TRANSFER_COST_H_
