// A worker runtime (the llama fixture, loopback KV backend) linked to the router's real
// WorkerRegistry served in-process over gRPC: registration, heartbeats with load reports, KV
// events reaching the router's index, deregistration on drain, retries until the router appears.
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "node/testing/worker_test_util.h"
#include "node/worker_runtime.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "router/worker_registry.h"

namespace deepinfer::node {
namespace {

using testing::CheckHealth;
using testing::SmallPrefillWorker;

using HealthStatus = grpc::health::v1::HealthCheckResponse;

TEST(WorkerRegistrationTest, RegistersHeartbeatsPublishesKvEventsAndDeregistersOnDrain) {
  router::WorkerRegistry::Options ro;
  ro.heartbeat_interval = absl::Milliseconds(50);
  ro.missed_heartbeats_allowed = 100;
  auto registry = router::WorkerRegistry::Create(ro);
  ASSERT_TRUE(registry.ok()) << registry.status();
  router::WorkerRegistryService registry_service(registry->get());
  GrpcServerOptions so;
  so.services = {&registry_service};
  auto router_server = GrpcServer::Start(so);
  ASSERT_TRUE(router_server.ok()) << router_server.status();

  WorkerOptions o = SmallPrefillWorker("prefill-linked");
  o.router_address = (*router_server)->address();
  o.advertise_host = "10.1.2.3";
  o.hash_seed = 42;
  // Registered by every role, though a prefill engine never speculates.
  o.speculative.enabled = true;
  o.speculative.num_speculative_tokens = 3;
  auto created = WorkerRuntime::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);
  ASSERT_TRUE(rt->Start({}, {}).ok());

  // Registered, then heartbeats with load reports.
  std::optional<router::WorkerSnapshot> snap;
  for (int i = 0; i < 500; ++i) {
    snap = (*registry)->Get("prefill-linked");
    if (snap.has_value() && snap->has_load && snap->load.sequence() >= 2) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(snap.has_value());
  ASSERT_TRUE(snap->has_load);
  EXPECT_GE(snap->load.sequence(), 2u);
  EXPECT_EQ(snap->info.role(), internal::v1::WORKER_ROLE_PREFILL);
  EXPECT_EQ(snap->info.address(), absl::StrCat("10.1.2.3:", rt->port()));
  EXPECT_EQ(snap->info.model(), "llama");
  EXPECT_EQ(snap->info.speculative().method(), "ngram");
  EXPECT_EQ(snap->info.speculative().num_speculative_tokens(), 3u);
  EXPECT_EQ(snap->info.speculative().max_n(), 4u);
  EXPECT_EQ(snap->info.incarnation(), rt->incarnation());
  EXPECT_EQ(snap->info.block_size(), 4u);
  EXPECT_EQ(snap->info.kv_capacity_blocks(), 64u);
  EXPECT_EQ(snap->info.max_context_tokens(), 2048u);
  EXPECT_FALSE(snap->info.can_prefill());
  EXPECT_EQ(snap->info.block_hash_seed(), 42u);
  EXPECT_EQ(snap->info.kv_metadata().agent_name(), "prefill-linked");
  EXPECT_EQ(snap->load.total_kv_blocks(), 64u);
  EXPECT_EQ(snap->load.free_kv_blocks(), 64u);
  EXPECT_EQ(CheckHealth(rt->address(), ""), HealthStatus::SERVING);

  // A computed prompt's full blocks reach the router's index through KV events.
  std::promise<void> finished;
  engine::EngineRequest req;
  req.request_id = "kv-events";
  req.prompt = {760, 39, 68, 410, 78, 311, 268, 624, 5};  // two full blocks of 4
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 1;
  ASSERT_TRUE(rt->engine()
                  ->Submit(req,
                           [&](const engine::EngineOutput& out) {
                             if (out.finished) finished.set_value();
                           })
                  .ok());
  finished.get_future().wait();
  for (int i = 0; i < 500; ++i) {
    snap = (*registry)->Get("prefill-linked");
    if (snap.has_value() && snap->cached_blocks >= 2) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(snap.has_value());
  EXPECT_GE(snap->cached_blocks, 2);
  EXPECT_FALSE(snap->kv_resync_pending);

  rt->Drain(absl::Seconds(1));
  EXPECT_FALSE((*registry)->Get("prefill-linked").has_value());
  (*router_server)->Shutdown(absl::ZeroDuration());
}

TEST(WorkerRegistrationTest, RegistrationRetriesUntilTheRouterAppears) {
  router::WorkerRegistry::Options ro;
  ro.heartbeat_interval = absl::Milliseconds(50);
  auto registry = router::WorkerRegistry::Create(ro);
  ASSERT_TRUE(registry.ok());
  // Find a free port for the router by starting and stopping a server on it.
  std::string router_address;
  {
    router::WorkerRegistryService probe_service(registry->get());
    GrpcServerOptions po;
    po.services = {&probe_service};
    auto probe = GrpcServer::Start(po);
    ASSERT_TRUE(probe.ok());
    router_address = (*probe)->address();
    (*probe)->Shutdown(absl::ZeroDuration());
  }
  WorkerOptions o = SmallPrefillWorker("prefill-retry");
  o.router_address = router_address;
  auto created = WorkerRuntime::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<WorkerRuntime> rt = std::move(*created);
  ASSERT_TRUE(rt->Start({}, {}).ok());
  absl::SleepFor(absl::Milliseconds(300));
  // Not registered yet: not serving.
  EXPECT_EQ(CheckHealth(rt->address(), ""), HealthStatus::NOT_SERVING);

  router::WorkerRegistryService registry_service(registry->get());
  GrpcServerOptions so;
  so.listen_address = router_address;
  so.services = {&registry_service};
  auto router_server = GrpcServer::Start(so);
  ASSERT_TRUE(router_server.ok()) << router_server.status();
  bool serving = false;
  for (int i = 0; i < 500 && !serving; ++i) {
    serving = (*registry)->Get("prefill-retry").has_value() &&
              CheckHealth(rt->address(), "") == HealthStatus::SERVING;
    if (!serving) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(serving);
  rt->Drain(absl::Seconds(1));
  EXPECT_FALSE((*registry)->Get("prefill-retry").has_value());
  (*router_server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace deepinfer::node
