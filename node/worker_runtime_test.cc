// WorkerRuntime on the llama fixture with the loopback KV backend, standalone: stats over a real
// gRPC channel, health, port file, drain. Linked to the router's registry:
// tests/worker_registration_test.cc.
#include "node/worker_runtime.h"
#include "node/testing/worker_test_util.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "common/metrics_test_util.h"
#include "common/process_lifecycle.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace deepinfer::node {
namespace {

using testing::CheckHealth;
using testing::SmallPrefillWorker;

using HealthStatus = grpc::health::v1::HealthCheckResponse;

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST(WorkerRuntimeTest, RejectsBadOptionsNamingTheFlag) {
  WorkerOptions o = SmallPrefillWorker("w");
  o.kv_blocks = 0;
  auto rt = WorkerRuntime::Create(o);
  ASSERT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.status().message(), "--kv_blocks: expected > 0, got 0");

  o = SmallPrefillWorker("w");
  o.listen_address = "nonsense";
  rt = WorkerRuntime::Create(o);
  ASSERT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.status().message().rfind("--listen:", 0), 0u) << rt.status();

  o = SmallPrefillWorker("w");
  o.speculative.enabled = true;
  o.speculative.num_speculative_tokens = 65;
  rt = WorkerRuntime::Create(o);
  ASSERT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.status().message(), "--num_speculative_tokens: expected [1, 64], got 65");

  o = SmallPrefillWorker("w");
  o.model_path = "engine/testdata/models/does_not_exist";
  EXPECT_FALSE(WorkerRuntime::Create(o).ok());
}

// --overlap: auto overlaps unless the process is pinned to one CPU (where the scheduler and the
// executor would only take turns); a bad value is refused naming the flag.
TEST(WorkerRuntimeTest, OverlapFollowsTheFlagAndTheAffinity) {
  EXPECT_TRUE(OverlapEnabled("on", 1));
  EXPECT_FALSE(OverlapEnabled("off", 16));
  EXPECT_FALSE(OverlapEnabled("auto", 1));
  EXPECT_TRUE(OverlapEnabled("auto", 2));
  EXPECT_TRUE(OverlapEnabled("auto", 0));  // affinity unknown
  WorkerOptions o = SmallPrefillWorker("w-overlap");
  o.overlap = "sometimes";
  auto rt = WorkerRuntime::Create(o);
  ASSERT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.status().message(), "--overlap: expected auto, on or off, got \"sometimes\"");
}

// --device: cuda runs on the GPU or refuses to start, naming why (no device here; or the test
// model's shapes, which the CUDA kernels do not cover); auto runs wherever cuda could.
TEST(WorkerRuntimeTest, DeviceCudaFailsNamingWhyAndAutoFallsBackToTheCpu) {
  WorkerOptions o = SmallPrefillWorker("w-dev");
  o.device = "tpu";
  auto rt = WorkerRuntime::Create(o);
  ASSERT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rt.status().message(), "--device: expected cpu, cuda or auto, got \"tpu\"");

  o.device = "cuda";
  auto cuda = WorkerRuntime::Create(o);
  if (!cuda.ok()) {
    EXPECT_TRUE(cuda.status().code() == absl::StatusCode::kUnavailable ||
                cuda.status().code() == absl::StatusCode::kUnimplemented)
        << cuda.status();
    EXPECT_EQ(cuda.status().message().rfind("--device=cuda: ", 0), 0u) << cuda.status();
  } else {
    EXPECT_EQ((*cuda)->device(), "cuda");
  }
  const bool gpu = cuda.ok();
  cuda = absl::UnknownError("released");  // one runtime at a time

  o.device = "auto";
  o.worker_id = "w-auto";
  auto any = WorkerRuntime::Create(o);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ((*any)->device(), gpu ? "cuda" : "cpu");
  o.device = "cpu";
  o.worker_id = "w-cpu";
  auto cpu = WorkerRuntime::Create(o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device(), "cpu");
}

TEST(WorkerRuntimeTest, StandaloneServesStatsAndHealthThenDrains) {
  WorkerOptions o = SmallPrefillWorker("prefill-standalone");
  o.port_file = TmpPath("standalone.port");
  auto created = WorkerRuntime::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);

  // Pools and metadata are ready before Start.
  EXPECT_EQ(rt->pool_layout().num_layers(), 2u);
  EXPECT_EQ(rt->pool_layout().num_blocks(), 64u);
  EXPECT_GT(rt->pool_layout().block_bytes(), 0u);
  EXPECT_NE(rt->pool_layout().k_region(), rt->pool_layout().v_region());
  EXPECT_EQ(rt->kv_metadata().agent_name(), "prefill-standalone");
  EXPECT_EQ(rt->kv_metadata().incarnation(), rt->incarnation());
  EXPECT_NE(rt->incarnation(), 0u);
  EXPECT_EQ(rt->kv_metadata().backend(), "loopback");
  EXPECT_FALSE(rt->kv_metadata().blob().empty());

  ASSERT_TRUE(rt->Start({}, {}, [](internal::v1::WorkerStats* s) { s->set_requests_ok(7); }).ok());
  absl::StatusOr<int> port = ReadPortFile(o.port_file, absl::Seconds(5));
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_EQ(*port, rt->port());

  EXPECT_EQ(CheckHealth(rt->address(), ""), HealthStatus::SERVING);
  EXPECT_EQ(CheckHealth(rt->address(), internal::v1::WorkerAdmin::service_full_name()),
            HealthStatus::SERVING);

  auto admin = internal::v1::WorkerAdmin::NewStub(
      grpc::CreateChannel(rt->address(), grpc::InsecureChannelCredentials()));
  {
    WorkerRuntime::RequestScope scope(rt.get());
    ASSERT_TRUE(scope.ok());
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    internal::v1::WorkerStats stats;
    grpc::Status s = admin->GetStats(&context, internal::v1::WorkerStatsRequest(), &stats);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(stats.worker_id(), "prefill-standalone");
    EXPECT_EQ(stats.role(), internal::v1::WORKER_ROLE_PREFILL);
    EXPECT_EQ(stats.incarnation(), rt->incarnation());
    EXPECT_EQ(stats.total_kv_blocks(), 64u);
    EXPECT_EQ(stats.free_kv_blocks(), 64u);
    EXPECT_EQ(stats.used_kv_blocks(), 0u);
    EXPECT_EQ(stats.active_requests(), 1u);
    EXPECT_EQ(stats.requests_ok(), 7u);  // from the contributor
    EXPECT_FALSE(stats.draining());
  }
  EXPECT_EQ(rt->Stats().active_requests(), 0u);

  rt->Drain(absl::Seconds(1));
  EXPECT_TRUE(rt->draining());
  WorkerRuntime::RequestScope late(rt.get());
  EXPECT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(rt->Stats().draining());
  EXPECT_NE(CheckHealth(rt->address(), ""), HealthStatus::SERVING);
  rt->Drain(absl::Seconds(1));  // idempotent
}

TEST(WorkerRuntimeTest, ServesPrometheusMetricsFromItsStats) {
  WorkerOptions o = SmallPrefillWorker("prefill-metrics");
  o.metrics_listen = "127.0.0.1:0";
  auto created = WorkerRuntime::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);
  EXPECT_EQ(rt->metrics_port(), 0);  // not started yet
  std::atomic<int> ok_requests{3};
  ASSERT_TRUE(rt->Start({}, {}, [&](internal::v1::WorkerStats* s) {
                  s->set_requests_ok(static_cast<uint64_t>(ok_requests.load()));
                  s->set_requests_failed(1);
                }).ok());
  ASSERT_GT(rt->metrics_port(), 0);

  // The same 12-token prompt twice: the second is served from the prefix cache (2 of 3 blocks).
  for (int turn = 0; turn < 2; ++turn) {
    engine::EngineRequest request;
    request.request_id = absl::StrCat("turn", turn);
    for (int i = 0; i < 12; ++i) request.prompt.push_back(i + 5);
    request.sampling.max_tokens = 2;
    std::promise<void> done;
    ASSERT_TRUE(rt->engine()
                    ->Submit(request,
                             [&](const engine::EngineOutput& out) {
                               if (out.finished) done.set_value();
                             })
                    .ok());
    ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  }
  // The final output goes out before the engine frees the request's blocks and publishes its
  // queue figures (at the end of that scheduler iteration): wait for them, or a scrape right away
  // can see the finished request still running and its blocks in use.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    const internal::v1::WorkerStats s = rt->Stats();
    if (s.running_sequences() == 0 && s.used_kv_blocks() == 0) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::StatusOr<std::string> text = testutil::HttpGet(rt->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  using testutil::SampleValue;
  EXPECT_EQ(SampleValue(*text, "deepinfer_requests_total{outcome=\"ok\"}"), 3) << *text;
  EXPECT_EQ(SampleValue(*text, "deepinfer_requests_total{outcome=\"error\"}"), 1);
  EXPECT_EQ(SampleValue(*text, "deepinfer_requests_total{outcome=\"cancelled\"}"), 0);
  EXPECT_EQ(SampleValue(*text, "deepinfer_prefix_cache_queries_total"), 24);
  EXPECT_EQ(SampleValue(*text, "deepinfer_prefix_cache_hits_total"), 8);
  EXPECT_NEAR(SampleValue(*text, "deepinfer_prefix_cache_hit_ratio").value_or(-1), 8.0 / 24, 1e-9);
  EXPECT_EQ(SampleValue(*text, "deepinfer_queue_depth"), 0);
  EXPECT_EQ(SampleValue(*text, "deepinfer_running_sequences"), 0);
  EXPECT_EQ(SampleValue(*text, "deepinfer_kv_cache_usage_ratio"), 0);
  EXPECT_EQ(SampleValue(*text, "deepinfer_kv_transfer_bytes_total"), 0);
  EXPECT_EQ(SampleValue(*text, "deepinfer_kv_transfer_failures_total"), 0);
  // Counters follow the stats at the next scrape.
  ok_requests = 5;
  text = testutil::HttpGet(rt->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(SampleValue(*text, "deepinfer_requests_total{outcome=\"ok\"}"), 5);
  EXPECT_EQ(testutil::HttpGet(rt->metrics_port(), "/healthz").value_or(""), "ok\n");

  const int port = rt->metrics_port();
  rt->Drain(absl::Seconds(1));
  EXPECT_EQ(testutil::HttpGet(port).status().code(), absl::StatusCode::kUnavailable);
}

// A decode node with speculation on: its engine drafts, and the spec counters reach /metrics.
TEST(WorkerRuntimeTest, SpeculativeDecodeNodeExportsSpecMetrics) {
  WorkerOptions o = SmallPrefillWorker("decode-spec-metrics");
  o.role = internal::v1::WORKER_ROLE_DECODE;
  o.metrics_listen = "127.0.0.1:0";
  o.speculative.enabled = true;
  o.speculative.num_speculative_tokens = 4;
  auto created = WorkerRuntime::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);
  ASSERT_TRUE(rt->Start({}, {}).ok());
  // A repeated motif: the n-gram drafter finds matches in the prompt and the output.
  engine::EngineRequest request;
  request.request_id = "spec";
  for (int r = 0; r < 4; ++r) request.prompt.insert(request.prompt.end(), {21, 22, 23});
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 24;
  request.sampling.ignore_eos = true;
  std::promise<engine::RequestUsage> done;
  ASSERT_TRUE(rt->engine()
                  ->Submit(request,
                           [&](const engine::EngineOutput& out) {
                             if (out.finished) done.set_value(out.usage);
                           })
                  .ok());
  std::future<engine::RequestUsage> usage = done.get_future();
  ASSERT_EQ(usage.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const engine::RequestUsage u = usage.get();
  EXPECT_GT(u.accepted_draft_tokens, 0);
  // The engine counts the last step's drafts just after that step's outputs went out.
  internal::v1::WorkerStats s = rt->Stats();
  for (int i = 0; i < 500 && s.spec_verified_tokens() < static_cast<uint64_t>(u.draft_tokens);
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    s = rt->Stats();
  }
  EXPECT_EQ(s.spec_verified_tokens(), static_cast<uint64_t>(u.draft_tokens));
  EXPECT_EQ(s.spec_accepted_tokens(), static_cast<uint64_t>(u.accepted_draft_tokens));
  EXPECT_GE(s.spec_draft_tokens(), s.spec_verified_tokens());
  EXPECT_GT(s.spec_steps(), 0u);
  absl::StatusOr<std::string> text = testutil::HttpGet(rt->metrics_port());
  ASSERT_TRUE(text.ok()) << text.status();
  using testutil::SampleValue;
  EXPECT_EQ(SampleValue(*text, "deepinfer_spec_draft_tokens_total"),
            static_cast<double>(s.spec_draft_tokens()))
      << *text;
  EXPECT_EQ(SampleValue(*text, "deepinfer_spec_verified_tokens_total"),
            static_cast<double>(s.spec_verified_tokens()));
  EXPECT_EQ(SampleValue(*text, "deepinfer_spec_accepted_tokens_total"),
            static_cast<double>(s.spec_accepted_tokens()));
  // n-gram drafts: no draft model to keep fed.
  EXPECT_EQ(s.spec_draft_upkeep_tokens(), 0u);
  EXPECT_EQ(SampleValue(*text, "deepinfer_spec_draft_upkeep_tokens_total"), 0.0) << *text;
  rt->Drain(absl::Seconds(1));
}

// --speculative=draft_model on a decode node: the engine loads the draft checkpoint (here the
// target's own weights, so every draft is accepted); a bad directory fails Create.
TEST(WorkerRuntimeTest, DraftModelDecodeNodeSpeculates) {
  WorkerOptions o = SmallPrefillWorker("decode-draft-model");
  o.role = internal::v1::WORKER_ROLE_DECODE;
  o.speculative.enabled = true;
  o.speculative.drafter = "draft_model";
  o.speculative.draft_model_path = "engine/testdata/models/does_not_exist";
  auto bad = WorkerRuntime::Create(o);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("speculative.draft_model_path"), std::string::npos)
      << bad.status();

  o.speculative.draft_model_path = "engine/testdata/models/llama";
  o.speculative.draft_threads = 1;
  auto created = WorkerRuntime::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);
  ASSERT_TRUE(rt->Start({}, {}).ok());
  engine::EngineRequest request;
  request.request_id = "draft";
  request.prompt = {5, 17, 300, 42, 9};
  request.sampling.temperature = 0;
  request.sampling.max_tokens = 16;
  request.sampling.ignore_eos = true;
  std::promise<engine::RequestUsage> done;
  ASSERT_TRUE(rt->engine()
                  ->Submit(request,
                           [&](const engine::EngineOutput& out) {
                             if (out.finished) done.set_value(out.usage);
                           })
                  .ok());
  std::future<engine::RequestUsage> usage = done.get_future();
  ASSERT_EQ(usage.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const engine::RequestUsage u = usage.get();
  EXPECT_GT(u.draft_tokens, 0);
  EXPECT_EQ(u.accepted_draft_tokens, u.draft_tokens);
  rt->Drain(absl::Seconds(1));
}

// --spec_adaptive: the decode engine profiles its cost table on the model inside Create (before
// any other thread runs the model) and drafts; a prefill node with the same flags never drafts.
TEST(WorkerRuntimeTest, AdaptiveSpeculationRunsOnDecodeNodesOnly) {
  WorkerOptions o = SmallPrefillWorker("decode-adaptive");
  o.speculative.enabled = true;
  o.speculative.adaptive = true;
  for (internal::v1::WorkerRole role :
       {internal::v1::WORKER_ROLE_DECODE, internal::v1::WORKER_ROLE_PREFILL}) {
    o.role = role;
    auto created = WorkerRuntime::Create(o);
    ASSERT_TRUE(created.ok()) << created.status();
    std::unique_ptr<WorkerRuntime> rt = std::move(*created);
    engine::EngineRequest request;
    request.request_id = "adaptive";
    for (int r = 0; r < 4; ++r) request.prompt.insert(request.prompt.end(), {31, 32, 33});
    request.sampling.temperature = 0;
    request.sampling.max_tokens = 16;
    request.sampling.ignore_eos = true;
    std::promise<void> done;
    ASSERT_TRUE(rt->engine()
                    ->Submit(request,
                             [&](const engine::EngineOutput& out) {
                               if (out.finished) done.set_value();
                             })
                    .ok());
    ASSERT_EQ(done.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
    const engine::EngineStats stats = rt->engine()->GetStats();
    if (role == internal::v1::WORKER_ROLE_DECODE) {
      EXPECT_GT(stats.spec_drafted_tokens, 0);
    } else {
      EXPECT_EQ(stats.spec_drafted_tokens, 0);
      EXPECT_FALSE(stats.spec_adaptive_active);
    }
  }
}

TEST(WorkerRuntimeTest, DrainWaitsForRequestsInFlight) {
  auto created = WorkerRuntime::Create(SmallPrefillWorker("prefill-drain"));
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);
  ASSERT_TRUE(rt->Start({}, {}).ok());
  auto scope = std::make_unique<WorkerRuntime::RequestScope>(rt.get());
  ASSERT_TRUE(scope->ok());
  auto drained = std::async(std::launch::async, [&] { rt->Drain(absl::Seconds(10)); });
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_TRUE(rt->draining());
  EXPECT_FALSE(WorkerRuntime::RequestScope(rt.get()).ok());
  scope.reset();
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

}  // namespace
}  // namespace deepinfer::node
