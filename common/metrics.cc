#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deepinfer {
namespace {

void AtomicAdd(std::atomic<double>& target, double delta) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed)) {
  }
}

absl::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// `{a="x",b="y"}` or "" for no labels; `extra_name`/`extra_value` (the histogram "le") last.
std::string LabelString(const std::vector<std::string>& names,
                        const std::vector<std::string>& values, absl::string_view extra_name = "",
                        absl::string_view extra_value = "") {
  if (names.empty() && extra_name.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra_name.empty()) {
    if (!names.empty()) out += ',';
    absl::StrAppend(&out, extra_name, "=\"", extra_value, "\"");
  }
  out += '}';
  return out;
}

void AppendHeader(const MetricFamilyBase& family, std::string& out) {
  absl::StrAppend(&out, "# HELP ", family.name(), " ", EscapeHelp(family.help()), "\n");
  absl::StrAppend(&out, "# TYPE ", family.name(), " ", TypeName(family.type()), "\n");
}

absl::Status ValidateBounds(const std::vector<double>& bounds) {
  if (bounds.empty()) {
    return absl::InvalidArgumentError("histogram bucket bounds: expected at least one, found none");
  }
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram bucket bounds: expected finite values (+Inf is implicit), found ",
                       FormatPrometheusValue(bounds[i]), " at index ", i));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram bucket bounds: expected strictly increasing values, found ",
                       FormatPrometheusValue(bounds[i - 1]), " then ",
                       FormatPrometheusValue(bounds[i]), " at index ", i));
    }
  }
  return absl::OkStatus();
}

template <typename M>
std::unique_ptr<M> MakeChild(const std::vector<double>& upper_bounds);
template <>
std::unique_ptr<Counter> MakeChild<Counter>(const std::vector<double>&) {
  return std::make_unique<Counter>();
}
template <>
std::unique_ptr<Gauge> MakeChild<Gauge>(const std::vector<double>&) {
  return std::make_unique<Gauge>();
}
template <>
std::unique_ptr<Histogram> MakeChild<Histogram>(const std::vector<double>& upper_bounds) {
  return std::make_unique<Histogram>(upper_bounds);
}

}  // namespace

// ---- Text format helpers ----

std::string FormatPrometheusValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Shortest representation that parses back to the same double; Go's ParseFloat (which
  // Prometheus uses) accepts every form to_chars produces, e.g. "0.001", "1e+21", "-0".
  std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, r.ptr);
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

bool IsValidMetricName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(absl::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c));
    if (!ok) return false;
  }
  return true;
}

// ---- Counter, Gauge, Histogram ----

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;  // Also rejects NaN.
  AtomicAdd(value_, delta);
}

void Gauge::Add(double delta) { AtomicAdd(value_, delta); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      buckets_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double value) {
  // First bound >= value; NaN compares false everywhere and lands in +Inf.
  size_t index =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  if (std::isnan(value)) index = upper_bounds_.size();
  buckets_[index].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot snap;
  snap.upper_bounds = upper_bounds_;
  snap.cumulative.resize(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    snap.cumulative[i] = running;
  }
  snap.count = running;
  snap.sum = sum_.load(std::memory_order_relaxed);
  return snap;
}

// ---- Families ----

template <typename M>
absl::StatusOr<M*> MetricFamily<M>::WithLabels(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name(), ": expected ", label_names().size(), " label values (",
                     absl::StrJoin(label_names(), ","), "), found ", label_values.size()));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<M>& child = children_[label_values];
  if (child == nullptr) child = MakeChild<M>(upper_bounds_);
  return child.get();
}

template <typename M>
MetricType MetricFamily<M>::type() const {
  if constexpr (std::is_same_v<M, Counter>) {
    return MetricType::kCounter;
  } else if constexpr (std::is_same_v<M, Gauge>) {
    return MetricType::kGauge;
  } else {
    static_assert(std::is_same_v<M, Histogram>);
    return MetricType::kHistogram;
  }
}

template <typename M>
void MetricFamily<M>::AppendTo(std::string& out) const {
  AppendHeader(*this, out);
  absl::MutexLock lock(&mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<M, Histogram>) {
      Histogram::Snapshot snap = child->Snap();
      for (size_t i = 0; i <= snap.upper_bounds.size(); ++i) {
        std::string le = i < snap.upper_bounds.size() ? FormatPrometheusValue(snap.upper_bounds[i])
                                                      : std::string("+Inf");
        absl::StrAppend(&out, name(), "_bucket", LabelString(label_names(), values, "le", le), " ",
                        snap.cumulative[i], "\n");
      }
      std::string labels = LabelString(label_names(), values);
      absl::StrAppend(&out, name(), "_sum", labels, " ", FormatPrometheusValue(snap.sum), "\n");
      absl::StrAppend(&out, name(), "_count", labels, " ", snap.count, "\n");
    } else {
      absl::StrAppend(&out, name(), LabelString(label_names(), values), " ",
                      FormatPrometheusValue(child->Value()), "\n");
    }
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

// ---- Registry ----

template <typename M>
absl::StatusOr<MetricFamily<M>*> MetricsRegistry::Register(absl::string_view name,
                                                           absl::string_view help,
                                                           std::vector<std::string> label_names,
                                                           std::vector<double> upper_bounds) {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name: expected [a-zA-Z_:][a-zA-Z0-9_:]*, found \"", name, "\""));
  }
  constexpr bool kIsCounter = std::is_same_v<M, Counter>;
  constexpr bool kIsHistogram = std::is_same_v<M, Histogram>;
  if (kIsCounter && !absl::EndsWith(name, "_total")) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter ", name, ": expected a name ending in \"_total\""));
  }
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label) || absl::StartsWith(label, "__")) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name,
                       ": expected label names matching [a-zA-Z_][a-zA-Z0-9_]* and not starting "
                       "with \"__\", found \"",
                       label, "\""));
    }
    if (kIsHistogram && label == "le") {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, ": the label \"le\" is reserved for bucket bounds"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric ", name, ": expected distinct label names, found \"", label, "\" twice"));
    }
  }
  if (kIsHistogram) {
    absl::Status bounds_ok = ValidateBounds(upper_bounds);
    if (!bounds_ok.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("histogram ", name, ": ", bounds_ok.message()));
    }
  }
  std::string key(name);
  absl::MutexLock lock(&mu_);
  auto it = families_.find(key);
  if (it != families_.end()) {
    return absl::AlreadyExistsError(
        absl::StrCat("metric ", name, ": already registered as a ", TypeName(it->second->type())));
  }
  auto* family =
      new MetricFamily<M>(key, std::string(help), std::move(label_names), std::move(upper_bounds));
  families_.emplace(std::move(key), std::unique_ptr<MetricFamilyBase>(family));
  return family;
}

absl::StatusOr<CounterFamily*> MetricsRegistry::AddCounterFamily(
    absl::string_view name, absl::string_view help, std::vector<std::string> label_names) {
  return Register<Counter>(name, help, std::move(label_names), {});
}

absl::StatusOr<GaugeFamily*> MetricsRegistry::AddGaugeFamily(absl::string_view name,
                                                             absl::string_view help,
                                                             std::vector<std::string> label_names) {
  return Register<Gauge>(name, help, std::move(label_names), {});
}

absl::StatusOr<HistogramFamily*> MetricsRegistry::AddHistogramFamily(
    absl::string_view name, absl::string_view help, std::vector<double> upper_bounds,
    std::vector<std::string> label_names) {
  return Register<Histogram>(name, help, std::move(label_names), std::move(upper_bounds));
}

absl::StatusOr<Counter*> MetricsRegistry::AddCounter(absl::string_view name,
                                                     absl::string_view help) {
  absl::StatusOr<CounterFamily*> family = AddCounterFamily(name, help, {});
  if (!family.ok()) return family.status();
  return (*family)->WithLabels({});
}

absl::StatusOr<Gauge*> MetricsRegistry::AddGauge(absl::string_view name, absl::string_view help) {
  absl::StatusOr<GaugeFamily*> family = AddGaugeFamily(name, help, {});
  if (!family.ok()) return family.status();
  return (*family)->WithLabels({});
}

absl::StatusOr<Histogram*> MetricsRegistry::AddHistogram(absl::string_view name,
                                                         absl::string_view help,
                                                         std::vector<double> upper_bounds) {
  absl::StatusOr<HistogramFamily*> family =
      AddHistogramFamily(name, help, std::move(upper_bounds), {});
  if (!family.ok()) return family.status();
  return (*family)->WithLabels({});
}

std::string MetricsRegistry::Serialize() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) family->AppendTo(out);
  return out;
}

// ---- Buckets ----

absl::StatusOr<std::vector<double>> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1 || !std::isfinite(start * factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exponential buckets: expected start > 0, factor > 1, count >= 1, found "
        "start=",
        FormatPrometheusValue(start), " factor=", FormatPrometheusValue(factor), " count=", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

absl::StatusOr<std::vector<double>> LinearBuckets(double start, double width, int count) {
  if (!std::isfinite(start) || !(width > 0) || !std::isfinite(width) || count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "linear buckets: expected finite start, width > 0, count >= 1, found start=",
        FormatPrometheusValue(start), " width=", FormatPrometheusValue(width), " count=", count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  for (int i = 0; i < count; ++i) bounds.push_back(start + width * i);
  return bounds;
}

std::vector<double> LatencyBucketsSeconds() {
  std::vector<double> bounds = *ExponentialBuckets(0.001, 2, 16);  // 1 ms .. 32.768 s.
  bounds.push_back(60);
  return bounds;
}

}  // namespace deepinfer
