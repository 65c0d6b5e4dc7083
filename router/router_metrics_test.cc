#include "router/router_metrics.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "common/metrics_test_util.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"
#include "router/placement.h"
#include "router/worker_registry.h"

namespace deepinfer::router {
namespace {

using testutil::SampleValue;

internal::v1::WorkerInfo Worker(absl::string_view id, internal::v1::WorkerRole role,
                                absl::string_view model = "m") {
  internal::v1::WorkerInfo w;
  w.set_worker_id(std::string(id));
  w.set_role(role);
  w.set_address("127.0.0.1:5000");
  w.set_model(std::string(model));
  w.set_incarnation(1);
  w.set_block_size(16);
  w.set_kv_capacity_blocks(100);
  return w;
}

internal::v1::LoadReport Load(absl::string_view id, uint32_t queue, uint64_t queued_tokens,
                              uint32_t running, uint64_t free, uint64_t total) {
  internal::v1::LoadReport r;
  r.set_worker_id(std::string(id));
  r.set_incarnation(1);
  r.set_sequence(1);
  r.set_queue_depth(queue);
  r.set_queued_input_tokens(queued_tokens);
  r.set_running_sequences(running);
  r.set_free_kv_blocks(free);
  r.set_total_kv_blocks(total);
  return r;
}

TEST(RouterMetricsTest, RegistersOnceAndExposesTheRegistry) {
  MetricsRegistry registry;
  absl::StatusOr<std::unique_ptr<RouterMetrics>> m = RouterMetrics::Create(&registry);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->registry(), &registry);
  EXPECT_EQ(RouterMetrics::Create(&registry).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(RouterMetrics::Create(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  // Others (the autoscaler) add their gauges to the same registry.
  ASSERT_TRUE((*m)->registry()->AddGaugeFamily("deepinfer_desired_replicas", "x", {"pool"}).ok());
  const std::string text = registry.Serialize();
  for (const char* series :
       {"deepinfer_requests_total{outcome=\"ok\"}", "deepinfer_requests_total{outcome=\"invalid\"}",
        "deepinfer_placement_decisions_total{outcome=\"remote_prefill\"}",
        "deepinfer_placement_decisions_total{outcome=\"local_below_threshold\"}",
        "deepinfer_placement_decisions_total{outcome=\"local_no_prefill_worker\"}",
        "deepinfer_time_to_first_token_seconds_count",
        "deepinfer_inter_token_latency_seconds_count",
        "deepinfer_e2e_request_latency_seconds_count", "deepinfer_queue_time_seconds_count",
        "deepinfer_prompt_tokens_total", "deepinfer_generation_tokens_total",
        "deepinfer_cached_prompt_tokens_total", "deepinfer_prefix_cache_hit_ratio",
        "deepinfer_workers{pool=\"prefill\"}", "deepinfer_kv_cache_usage_ratio{pool=\"decode\"}"}) {
    EXPECT_EQ(SampleValue(text, series), 0.0) << series << "\n" << text;
  }
}

TEST(RouterMetricsTest, FinishedRequestsPlacementsAndTokens) {
  MetricsRegistry registry;
  std::unique_ptr<RouterMetrics> m = RouterMetrics::Create(&registry).value();
  m->RecordFinished({.outcome = RequestOutcome::kOk,
                     .prompt_tokens = 100,
                     .generation_tokens = 8,
                     .cached_prompt_tokens = 60,
                     .time_to_first_token_s = 0.05,
                     .e2e_s = 0.2,
                     .queue_time_s = 0.001});
  m->RecordFinished({.outcome = RequestOutcome::kOk,
                     .prompt_tokens = 100,
                     .generation_tokens = 2,
                     .cached_prompt_tokens = 20,
                     .e2e_s = 0.1});
  // A failure without usage counts its prompt but leaves the hit ratio alone.
  m->RecordFinished({.outcome = RequestOutcome::kError, .prompt_tokens = 50, .e2e_s = 0.01});
  m->RecordFinished({.outcome = RequestOutcome::kInvalid});
  m->RecordFinished({.outcome = RequestOutcome::kCancelled});
  m->RecordFinished({.outcome = RequestOutcome::kAborted});
  m->ObserveInterToken(0.004, 2);
  m->ObserveInterToken(0.001, 0);  // ignored
  m->RecordPlacement(PlacementOutcome::kRemotePrefill);
  m->RecordPlacement(PlacementOutcome::kRemotePrefill);
  m->RecordPlacement(PlacementOutcome::kLocalPrefillNoPrefillWorker);
  const std::string text = registry.Serialize();
  EXPECT_EQ(SampleValue(text, "deepinfer_requests_total{outcome=\"ok\"}"), 2);
  for (const char* o : {"error", "invalid", "cancelled", "aborted"}) {
    EXPECT_EQ(SampleValue(text, absl::StrCat("deepinfer_requests_total{outcome=\"", o, "\"}")), 1)
        << o;
  }
  EXPECT_EQ(SampleValue(text, "deepinfer_prompt_tokens_total"), 250);
  EXPECT_EQ(SampleValue(text, "deepinfer_generation_tokens_total"), 10);
  EXPECT_EQ(SampleValue(text, "deepinfer_cached_prompt_tokens_total"), 80);
  EXPECT_EQ(SampleValue(text, "deepinfer_prefix_cache_hit_ratio"), 0.4);
  EXPECT_EQ(SampleValue(text, "deepinfer_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(SampleValue(text, "deepinfer_e2e_request_latency_seconds_count"), 3);
  EXPECT_EQ(SampleValue(text, "deepinfer_queue_time_seconds_count"), 1);
  EXPECT_EQ(SampleValue(text, "deepinfer_inter_token_latency_seconds_count"), 2);
  EXPECT_EQ(SampleValue(text, "deepinfer_inter_token_latency_seconds_bucket{le=\"0.002\"}"), 2);
  EXPECT_EQ(SampleValue(text, "deepinfer_inter_token_latency_seconds_bucket{le=\"0.001\"}"), 0);
  EXPECT_EQ(SampleValue(text, "deepinfer_placement_decisions_total{outcome=\"remote_prefill\"}"),
            2);
  EXPECT_EQ(
      SampleValue(text, "deepinfer_placement_decisions_total{outcome=\"local_no_prefill_worker\"}"),
      1);
  EXPECT_EQ(
      SampleValue(text, "deepinfer_placement_decisions_total{outcome=\"local_below_threshold\"}"),
      0);
}

TEST(RouterMetricsTest, PoolGaugesFromTheRegistryOnScrape) {
  MetricsRegistry metrics_registry;
  std::unique_ptr<RouterMetrics> m = RouterMetrics::Create(&metrics_registry).value();
  WorkerRegistry::Options options;
  options.heartbeat_interval = absl::Seconds(60);
  std::unique_ptr<WorkerRegistry> registry = WorkerRegistry::Create(options).value();
  ASSERT_TRUE(registry->Register(Worker("p0", internal::v1::WORKER_ROLE_PREFILL)).ok());
  ASSERT_TRUE(registry->Register(Worker("p1", internal::v1::WORKER_ROLE_PREFILL)).ok());
  ASSERT_TRUE(registry->Register(Worker("d0", internal::v1::WORKER_ROLE_DECODE)).ok());
  ASSERT_TRUE(registry->Register(Worker("d1", internal::v1::WORKER_ROLE_DECODE)).ok());
  ASSERT_TRUE(registry->Register(Worker("x0", internal::v1::WORKER_ROLE_DECODE, "other")).ok());
  ASSERT_TRUE(registry->ReportLoad(Load("p0", 2, 300, 1, 90, 100)).known());
  ASSERT_TRUE(registry->ReportLoad(Load("p1", 1, 50, 0, 100, 100)).known());
  ASSERT_TRUE(registry->ReportLoad(Load("d0", 0, 0, 5, 25, 100)).known());
  ASSERT_TRUE(registry->ReportLoad(Load("d1", 3, 0, 7, 75, 100)).known());

  // Over HTTP, refreshed by the scrape itself.
  MetricsHttpServerOptions server_options;
  server_options.before_scrape = [&] { m->RefreshPools(*registry, "m"); };
  std::unique_ptr<MetricsHttpServer> server =
      MetricsHttpServer::Create(&metrics_registry, server_options).value();
  ASSERT_TRUE(server->Start().ok());
  absl::StatusOr<std::string> text = testutil::HttpGet(server->port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(SampleValue(*text, "deepinfer_workers{pool=\"prefill\"}"), 2);
  EXPECT_EQ(SampleValue(*text, "deepinfer_workers{pool=\"decode\"}"), 2);
  EXPECT_EQ(SampleValue(*text, "deepinfer_queue_depth{pool=\"prefill\"}"), 3);
  EXPECT_EQ(SampleValue(*text, "deepinfer_queue_depth{pool=\"decode\"}"), 3);
  EXPECT_EQ(SampleValue(*text, "deepinfer_queued_input_tokens{pool=\"prefill\"}"), 350);
  EXPECT_EQ(SampleValue(*text, "deepinfer_running_sequences{pool=\"decode\"}"), 12);
  EXPECT_EQ(SampleValue(*text, "deepinfer_kv_cache_usage_ratio{pool=\"decode\"}"), 0.5);
  EXPECT_NEAR(SampleValue(*text, "deepinfer_kv_cache_usage_ratio{pool=\"prefill\"}").value_or(-1),
              0.05, 1e-12);

  // A worker leaves: the next scrape sees it.
  ASSERT_TRUE(registry->Deregister("d1", 1).ok());
  text = testutil::HttpGet(server->port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(SampleValue(*text, "deepinfer_workers{pool=\"decode\"}"), 1);
  EXPECT_EQ(SampleValue(*text, "deepinfer_kv_cache_usage_ratio{pool=\"decode\"}"), 0.75);
  server->Stop();
}

}  // namespace
}  // namespace deepinfer::router
