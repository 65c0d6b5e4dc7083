#include "common/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(MetricsTest, CounterGolden) {
  MetricsRegistry registry;
  Counter* c = registry.AddCounter("deepinfer_requests_total", "Requests seen.").value();
  c->Increment();
  c->Increment(2.5);
  c->Increment(-4);  // Ignored: counters never go down.
  c->Increment(std::nan(""));
  EXPECT_EQ(c->Value(), 3.5);
  EXPECT_EQ(registry.Serialize(),
            "# HELP deepinfer_requests_total Requests seen.\n"
            "# TYPE deepinfer_requests_total counter\n"
            "deepinfer_requests_total 3.5\n");
}

TEST(MetricsTest, GaugeGolden) {
  MetricsRegistry registry;
  Gauge* g = registry.AddGauge("deepinfer_queue_depth", "Queued requests.").value();
  g->Set(10);
  g->Add(-3);
  g->Add(0.25);
  EXPECT_EQ(registry.Serialize(),
            "# HELP deepinfer_queue_depth Queued requests.\n"
            "# TYPE deepinfer_queue_depth gauge\n"
            "deepinfer_queue_depth 7.25\n");
}

TEST(MetricsTest, HistogramGolden) {
  MetricsRegistry registry;
  Histogram* h = registry.AddHistogram("deepinfer_ttft_seconds", "TTFT.", {0.001, 0.1, 1}).value();
  h->Observe(0.001);  // Bucket le="0.001" includes its bound.
  h->Observe(0.05);
  h->Observe(0.5);
  h->Observe(7);
  EXPECT_EQ(registry.Serialize(),
            "# HELP deepinfer_ttft_seconds TTFT.\n"
            "# TYPE deepinfer_ttft_seconds histogram\n"
            "deepinfer_ttft_seconds_bucket{le=\"0.001\"} 1\n"
            "deepinfer_ttft_seconds_bucket{le=\"0.1\"} 2\n"
            "deepinfer_ttft_seconds_bucket{le=\"1\"} 3\n"
            "deepinfer_ttft_seconds_bucket{le=\"+Inf\"} 4\n"
            "deepinfer_ttft_seconds_sum 7.551\n"
            "deepinfer_ttft_seconds_count 4\n");
}

TEST(MetricsTest, LabelledFamiliesGoldenWithEscaping) {
  MetricsRegistry registry;
  CounterFamily* tokens =
      registry
          .AddCounterFamily("deepinfer_tokens_total", "Tokens by \"kind\".\nSecond line \\ end.",
                            {"pool", "kind"})
          .value();
  tokens->WithLabels({"decode", "out"}).value()->Increment(5);
  tokens->WithLabels({"a\"b\\c\nd", "in"}).value()->Increment(1);
  // The same label values give the same child.
  EXPECT_EQ(tokens->WithLabels({"decode", "out"}).value(),
            tokens->WithLabels({"decode", "out"}).value());

  HistogramFamily* itl =
      registry.AddHistogramFamily("deepinfer_itl_seconds", "ITL.", {0.5}, {"pool"}).value();
  itl->WithLabels({"p1"}).value()->Observe(0.25);

  // A family whose children were never created still announces itself.
  registry.AddGaugeFamily("deepinfer_kv_blocks_used", "KV blocks.", {"node"}).value();

  EXPECT_EQ(registry.Serialize(),
            "# HELP deepinfer_itl_seconds ITL.\n"
            "# TYPE deepinfer_itl_seconds histogram\n"
            "deepinfer_itl_seconds_bucket{pool=\"p1\",le=\"0.5\"} 1\n"
            "deepinfer_itl_seconds_bucket{pool=\"p1\",le=\"+Inf\"} 1\n"
            "deepinfer_itl_seconds_sum{pool=\"p1\"} 0.25\n"
            "deepinfer_itl_seconds_count{pool=\"p1\"} 1\n"
            "# HELP deepinfer_kv_blocks_used KV blocks.\n"
            "# TYPE deepinfer_kv_blocks_used gauge\n"
            "# HELP deepinfer_tokens_total Tokens by \"kind\".\\nSecond line \\\\ end.\n"
            "# TYPE deepinfer_tokens_total counter\n"
            "deepinfer_tokens_total{pool=\"a\\\"b\\\\c\\nd\",kind=\"in\"} 1\n"
            "deepinfer_tokens_total{pool=\"decode\",kind=\"out\"} 5\n");
}

TEST(MetricsTest, WithLabelsCountMismatch) {
  MetricsRegistry registry;
  GaugeFamily* g = registry.AddGaugeFamily("g", "h", {"a", "b"}).value();
  absl::StatusOr<Gauge*> r = g->WithLabels({"x"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("expected 2 label values"), absl::string_view::npos);
  EXPECT_EQ(g->WithLabels({"x", "y", "z"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(g->WithLabels({"x", "y"}).ok());
}

TEST(MetricsTest, NameValidation) {
  MetricsRegistry registry;
  auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_EQ(code(registry.AddGauge("", "h").status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddGauge("1abc", "h").status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddGauge("a-b", "h").status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddGauge("a b", "h").status()), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.AddGauge("ns:sub_system_0", "h").ok());
  EXPECT_TRUE(registry.AddGauge("_x", "h").ok());

  // Counters carry the conventional suffix.
  absl::Status s = registry.AddCounter("deepinfer_requests", "h").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("_total"), absl::string_view::npos);

  // Label names: no colons, no leading digit, no "__" prefix, no repeats, "le" only off
  // histograms.
  EXPECT_EQ(code(registry.AddGaugeFamily("g1", "h", {"a:b"}).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddGaugeFamily("g2", "h", {"0a"}).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddGaugeFamily("g3", "h", {"__name"}).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddGaugeFamily("g4", "h", {"a", "a"}).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(registry.AddHistogramFamily("h1", "h", {1}, {"le"}).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.AddGaugeFamily("g5", "h", {"le"}).ok());

  // Rejected registrations leave no trace: the name is still free.
  EXPECT_TRUE(registry.AddGaugeFamily("g1", "h", {"ok"}).ok());
}

TEST(MetricsTest, DuplicateNamesRefused) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.AddCounter("x_total", "h").ok());
  absl::Status again = registry.AddCounter("x_total", "h").status();
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.message().find("counter"), absl::string_view::npos);
  // Across types too.
  EXPECT_EQ(registry.AddGaugeFamily("x_total", "h", {"a"}).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.AddHistogram("x_total", "h", {1}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(MetricsTest, HistogramBoundsValidation) {
  MetricsRegistry registry;
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(registry.AddHistogram("h1", "h", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h2", "h", {1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h3", "h", {2, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h4", "h", {1, inf}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.AddHistogram("h5", "h", {std::nan("")}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.AddHistogram("h6", "h", {-1, 0, 1}).ok());
}

TEST(MetricsTest, FormatValue) {
  EXPECT_EQ(FormatPrometheusValue(0), "0");
  EXPECT_EQ(FormatPrometheusValue(42), "42");
  EXPECT_EQ(FormatPrometheusValue(-1.5), "-1.5");
  EXPECT_EQ(FormatPrometheusValue(0.1), "0.1");
  EXPECT_EQ(FormatPrometheusValue(1e21), "1e+21");
  EXPECT_EQ(FormatPrometheusValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatPrometheusValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatPrometheusValue(std::nan("")), "NaN");
  // Round-trips exactly.
  double third = 1.0 / 3.0;
  EXPECT_EQ(std::stod(FormatPrometheusValue(third)), third);
}

TEST(MetricsTest, HistogramNanAndInfLandInInfBucket) {
  MetricsRegistry registry;
  Histogram* h = registry.AddHistogram("h", "h", {1}).value();
  h->Observe(std::numeric_limits<double>::infinity());
  h->Observe(std::nan(""));
  h->Observe(-5);
  Histogram::Snapshot snap = h->Snap();
  EXPECT_EQ(snap.cumulative, (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(snap.count, 3u);
}

TEST(MetricsTest, BucketHelpers) {
  EXPECT_EQ(ExponentialBuckets(0.001, 2, 4).value(),
            (std::vector<double>{0.001, 0.002, 0.004, 0.008}));
  EXPECT_EQ(LinearBuckets(1, 2, 3).value(), (std::vector<double>{1, 3, 5}));
  EXPECT_FALSE(ExponentialBuckets(0, 2, 3).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 1, 3).ok());
  EXPECT_FALSE(ExponentialBuckets(1, 2, 0).ok());
  EXPECT_FALSE(LinearBuckets(0, 0, 3).ok());
  EXPECT_FALSE(LinearBuckets(0, 1, 0).ok());

  std::vector<double> latency = LatencyBucketsSeconds();
  ASSERT_EQ(latency.size(), 17u);
  EXPECT_EQ(latency.front(), 0.001);
  EXPECT_EQ(latency[15], 32.768);
  EXPECT_EQ(latency.back(), 60);
  MetricsRegistry registry;
  Histogram* h = registry.AddHistogram("lat_seconds", "h", latency).value();
  h->Observe(0.003);
  std::string text = registry.Serialize();
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.002\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"0.004\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"32.768\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("lat_seconds_bucket{le=\"60\"} 1\n"), std::string::npos) << text;
}

TEST(MetricsTest, ConcurrentUpdatesAreExact) {
  MetricsRegistry registry;
  Counter* c = registry.AddCounter("c_total", "h").value();
  Gauge* g = registry.AddGauge("g", "h").value();
  Histogram* h = registry.AddHistogram("h", "h", {10, 100}).value();
  CounterFamily* fam = registry.AddCounterFamily("f_total", "h", {"t"}).value();

  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Every thread resolves the same two children concurrently (creation races too).
      Counter* shared = fam->WithLabels({"shared"}).value();
      Counter* own = fam->WithLabels({std::to_string(t)}).value();
      for (int i = 0; i < kIters; ++i) {
        c->Increment();
        g->Add(1);
        g->Add(-0.5);
        h->Observe(i % 200);  // Integers: exact sums.
        shared->Increment();
        own->Increment(2);
        if (i % 1000 == 0) registry.Serialize();  // Readers concurrent with writers.
      }
    });
  }
  for (std::thread& th : threads) th.join();

  EXPECT_EQ(c->Value(), kThreads * kIters);
  EXPECT_EQ(g->Value(), kThreads * kIters * 0.5);
  Histogram::Snapshot snap = h->Snap();
  EXPECT_EQ(snap.count, static_cast<uint64_t>(kThreads * kIters));
  // Per 200 iterations: 0..10 -> 11 values, 0..100 -> 101 values.
  EXPECT_EQ(snap.cumulative[0], static_cast<uint64_t>(kThreads * (kIters / 200) * 11));
  EXPECT_EQ(snap.cumulative[1], static_cast<uint64_t>(kThreads * (kIters / 200) * 101));
  EXPECT_EQ(snap.sum, static_cast<double>(kThreads) * (kIters / 200) * (199 * 200 / 2));
  EXPECT_EQ(fam->WithLabels({"shared"}).value()->Value(), kThreads * kIters);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(fam->WithLabels({std::to_string(t)}).value()->Value(), 2.0 * kIters);
  }
}

TEST(MetricsTest, ConcurrentRegistrationOneWinner) {
  MetricsRegistry registry;
  std::atomic<int> ok{0}, exists{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      absl::Status s = registry.AddGauge("race", "h").status();
      if (s.ok()) ++ok;
      if (s.code() == absl::StatusCode::kAlreadyExists) ++exists;
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(exists.load(), 7);
}

}  // namespace
}  // namespace deepinfer
