// Prometheus metrics: a registry of counters, gauges and histograms, optionally labelled, that
// serializes to the text exposition format 0.0.4 (what a Prometheus server scrapes from
// /metrics, see common/metrics_http_server.h).
//
//   MetricsRegistry registry;
//   Counter* requests = registry.AddCounter("deepinfer_requests_total", "Requests seen.").value();
//   auto* ttft = registry.AddHistogramFamily("deepinfer_ttft_seconds", "Time to first token.",
//                                            LatencyBucketsSeconds(), {"pool"}).value();
//   Histogram* prefill_ttft = ttft->WithLabels({"prefill"}).value();  // look up once, keep
//   requests->Increment();
//   prefill_ttft->Observe(0.042);
//   std::string text = registry.Serialize();
//
// Hot paths (STYLE.md 4): Increment/Set/Add/Observe are lock-free atomics and never allocate.
// WithLabels() takes a mutex and allocates on first use of a label set, so callers resolve
// children once (at startup or per connection) and keep the pointer.
//
// Lifetime: every Counter/Gauge/Histogram/family pointer handed out stays valid for the
// registry's lifetime; nothing is ever removed.
//
// Thread-safety: every method of every class here is thread-safe.
#ifndef DEEPINFER_COMMON_METRICS_H_
#define DEEPINFER_COMMON_METRICS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace deepinfer {

// A monotonically increasing value (requests, tokens, errors). Names end in "_total".
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `delta`, which must be >= 0; negative and NaN deltas are ignored (a counter never
  // goes down).
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue depth, KV blocks in use, replicas).
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);  // Negative to subtract.
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets (latencies, sizes). Bucket i counts observations
// v <= upper_bounds[i]; an implicit +Inf bucket takes the rest (and NaN).
class Histogram {
 public:
  // `upper_bounds` strictly increasing and finite (MetricsRegistry validates it).
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  void Observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;  // Without +Inf.
    std::vector<uint64_t> cumulative;  // One per bound plus the +Inf bucket (== count).
    double sum = 0;
    uint64_t count = 0;
  };
  // A copy of the current state. Concurrent Observe() calls may be partly reflected (sum vs
  // buckets), but buckets are always cumulative and the +Inf bucket always equals count.
  Snapshot Snap() const;

 private:
  const std::vector<double> upper_bounds_;
  // Non-cumulative counts, upper_bounds_.size() + 1 entries (the last is +Inf).
  const std::unique_ptr<std::atomic<uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// Common part of a family: name, help, label names, and its serialization.
class MetricFamilyBase {
 public:
  virtual ~MetricFamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  virtual MetricType type() const = 0;
  // Appends "# HELP", "# TYPE" and one sample line per child (per series for histograms).
  virtual void AppendTo(std::string& out) const = 0;

 protected:
  MetricFamilyBase(std::string name, std::string help, std::vector<std::string> label_names)
      : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}

 private:
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
};

// A metric with label names; each distinct tuple of label values is one child (series).
// A family with no label names has exactly one child, WithLabels({}).
template <typename M>
class MetricFamily final : public MetricFamilyBase {
 public:
  // The child for `label_values` (same count and order as label_names()), created on first
  // use. kInvalidArgument if the count differs. Takes a mutex: resolve once, keep the pointer.
  absl::StatusOr<M*> WithLabels(const std::vector<std::string>& label_values);

  MetricType type() const override;
  void AppendTo(std::string& out) const override;

 private:
  friend class MetricsRegistry;
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names,
               std::vector<double> upper_bounds)
      : MetricFamilyBase(std::move(name), std::move(help), std::move(label_names)),
        upper_bounds_(std::move(upper_bounds)) {}

  const std::vector<double> upper_bounds_;  // Histograms only.
  mutable absl::Mutex mu_;
  // Ordered so that serialization is deterministic.
  std::map<std::vector<std::string>, std::unique_ptr<M>> children_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

// Owns all metrics of a process (or of a test). Not copyable or movable.
//
// Registration errors: kInvalidArgument when a metric name does not match
// [a-zA-Z_:][a-zA-Z0-9_:]*, a counter name does not end in "_total", a label name does not match
// [a-zA-Z_][a-zA-Z0-9_]* or starts with "__" or repeats, a histogram uses the label "le", or
// histogram bounds are empty, unsorted, repeated or not finite; kAlreadyExists when the name is
// taken (by a metric of any type).
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Unlabelled metrics: the single child of a family without labels.
  absl::StatusOr<Counter*> AddCounter(absl::string_view name, absl::string_view help);
  absl::StatusOr<Gauge*> AddGauge(absl::string_view name, absl::string_view help);
  absl::StatusOr<Histogram*> AddHistogram(absl::string_view name, absl::string_view help,
                                          std::vector<double> upper_bounds);

  // Labelled families. Children appear in Serialize() once created with WithLabels().
  absl::StatusOr<CounterFamily*> AddCounterFamily(absl::string_view name, absl::string_view help,
                                                  std::vector<std::string> label_names);
  absl::StatusOr<GaugeFamily*> AddGaugeFamily(absl::string_view name, absl::string_view help,
                                              std::vector<std::string> label_names);
  absl::StatusOr<HistogramFamily*> AddHistogramFamily(absl::string_view name,
                                                      absl::string_view help,
                                                      std::vector<double> upper_bounds,
                                                      std::vector<std::string> label_names);

  // All metrics in the Prometheus text format 0.0.4, families sorted by name, children by label
  // values. Empty string when nothing is registered.
  std::string Serialize() const;

 private:
  template <typename M>
  absl::StatusOr<MetricFamily<M>*> Register(absl::string_view name, absl::string_view help,
                                            std::vector<std::string> label_names,
                                            std::vector<double> upper_bounds);

  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<MetricFamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// Bucket helpers. kInvalidArgument unless start > 0, factor > 1 (width > 0) and count >= 1.
// ExponentialBuckets(0.001, 2, 4) == {0.001, 0.002, 0.004, 0.008}.
absl::StatusOr<std::vector<double>> ExponentialBuckets(double start, double factor, int count);
// LinearBuckets(1, 2, 3) == {1, 3, 5}.
absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width, int count);

// Latency buckets in seconds for TTFT, ITL and end-to-end latency: 1 ms doubling to 32.768 s,
// then 60 s (17 bounds).
std::vector<double> LatencyBucketsSeconds();

// Text-format helpers, exposed for tests and for other exporters.
// A sample value as Prometheus parses it: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
std::string FormatPrometheusValue(double value);
// Label values: backslash, double quote and newline escaped.
std::string EscapeLabelValue(absl::string_view value);
// Help text: backslash and newline escaped.
std::string EscapeHelp(absl::string_view help);
// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*
bool IsValidLabelName(absl::string_view name);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_METRICS_H_
