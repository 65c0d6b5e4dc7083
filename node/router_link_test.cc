// RouterLink against an in-process WorkerRegistry fake served over real gRPC (port 0), with a
// fake clock deciding when a heartbeat or a Register retry is due: registration, load reports
// carrying the callback's figures, KV-event batches, re-registration after the router forgets the
// worker, backoff while the router refuses or is not there, deregistration on Stop.
#include "node/router_link.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fake_clock.h"
#include "common/grpc_server.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"

namespace deepinfer::node {
namespace {

using internal::v1::KvEvent;

// The router's side: records every call; Forget() drops the worker as a restarted router would
// (ReportLoad then says known=false, PublishKvEvents NOT_FOUND) until it registers again.
class FakeRegistry final : public internal::v1::WorkerRegistry::Service {
 public:
  grpc::Status Register(grpc::ServerContext* /*context*/,
                        const internal::v1::RegisterRequest* request,
                        internal::v1::RegisterResponse* response) override {
    absl::MutexLock lock(&mu_);
    registers_.push_back(request->worker());
    if (!refuse_.ok()) return refuse_;
    known_ = true;
    response->set_heartbeat_interval_ms(kHeartbeatMs);
    response->add_peers()->set_worker_id("peer");
    return grpc::Status::OK;
  }
  grpc::Status ReportLoad(grpc::ServerContext* /*context*/, const internal::v1::LoadReport* request,
                          internal::v1::LoadReportResponse* response) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(*request);
    response->set_known(known_);
    return grpc::Status::OK;
  }
  grpc::Status PublishKvEvents(grpc::ServerContext* /*context*/,
                               const internal::v1::KvEventBatch* request,
                               internal::v1::KvEventAck* /*response*/) override {
    absl::MutexLock lock(&mu_);
    if (!known_ || kv_not_found_) {
      kv_not_found_ = false;
      known_ = false;
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    }
    batches_.push_back(*request);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext* /*context*/,
                          const internal::v1::DeregisterRequest* request,
                          internal::v1::DeregisterResponse* /*response*/) override {
    absl::MutexLock lock(&mu_);
    deregisters_.push_back(*request);
    known_ = false;
    return grpc::Status::OK;
  }

  void Forget() {
    absl::MutexLock lock(&mu_);
    known_ = false;
  }
  // The next PublishKvEvents answers NOT_FOUND (the router dropped the worker between its
  // ReportLoad and its events).
  void ForgetBeforeNextKvEvents() {
    absl::MutexLock lock(&mu_);
    kv_not_found_ = true;
  }
  void Refuse(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    refuse_ = std::move(status);
  }
  std::vector<internal::v1::WorkerInfo> registers() const {
    absl::MutexLock lock(&mu_);
    return registers_;
  }
  std::vector<internal::v1::LoadReport> reports() const {
    absl::MutexLock lock(&mu_);
    return reports_;
  }
  std::vector<internal::v1::KvEventBatch> batches() const {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  std::vector<internal::v1::DeregisterRequest> deregisters() const {
    absl::MutexLock lock(&mu_);
    return deregisters_;
  }
  static constexpr uint32_t kHeartbeatMs = 500;

 private:
  mutable absl::Mutex mu_;
  grpc::Status refuse_ ABSL_GUARDED_BY(mu_);
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  bool kv_not_found_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<internal::v1::WorkerInfo> registers_ ABSL_GUARDED_BY(mu_);
  std::vector<internal::v1::LoadReport> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<internal::v1::KvEventBatch> batches_ ABSL_GUARDED_BY(mu_);
  std::vector<internal::v1::DeregisterRequest> deregisters_ ABSL_GUARDED_BY(mu_);
};

constexpr absl::Duration kHeartbeat = absl::Milliseconds(FakeRegistry::kHeartbeatMs);

// Polls `done` in real time for up to 10 s.
bool WaitFor(const std::function<bool()>& done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Long enough for the link thread to act on whatever is due (several ticks).
void LetTheLinkRun() { absl::SleepFor(RouterLink::kTick * 4); }

class RouterLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions so;
    so.services = {&registry_};
    auto server = GrpcServer::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  void TearDown() override { server_->Shutdown(absl::ZeroDuration()); }

  // Options for worker "w1" whose load callback reports `queue_depth_` and the interval it was
  // given, and which counts on_registered calls.
  RouterLink::Options LinkOptions(const std::string& router_address) {
    RouterLink::Options o;
    o.router_address = router_address;
    o.worker.set_worker_id("w1");
    o.worker.set_role(internal::v1::WORKER_ROLE_DECODE);
    o.worker.set_address("10.0.0.1:7000");
    o.worker.set_model("llama");
    o.worker.set_incarnation(77);
    o.worker.set_block_size(16);
    o.load = [this](absl::Duration since_last, internal::v1::LoadReport* report) {
      report->set_queue_depth(queue_depth_.load());
      report->set_decode_tokens_per_second(absl::ToDoubleMilliseconds(since_last));
    };
    o.on_registered = [this] { ++registered_calls_; };
    o.clock = clock_.AsFunction();
    return o;
  }

  FakeClock clock_;
  FakeRegistry registry_;
  std::unique_ptr<GrpcServer> server_;
  std::atomic<uint32_t> queue_depth_{0};
  std::atomic<int> registered_calls_{0};
};

TEST_F(RouterLinkTest, CreateNamesTheMissingOption) {
  RouterLink::Options o = LinkOptions("");
  EXPECT_EQ(RouterLink::Create(o).status().message(),
            "router_address: expected \"host:port\", got \"\"");
  o = LinkOptions(server_->address());
  o.worker.clear_worker_id();
  EXPECT_EQ(RouterLink::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = LinkOptions(server_->address());
  o.worker.set_incarnation(0);
  EXPECT_EQ(RouterLink::Create(o).status().message(),
            "worker.incarnation: expected non-zero, got 0");
  o = LinkOptions(server_->address());
  o.load = nullptr;
  EXPECT_EQ(RouterLink::Create(o).status().message(), "load: expected a function, got none");
}

TEST_F(RouterLinkTest, RegistersReportsTheCallbacksLoadAndDeregistersOnStop) {
  const RouterLink::Options options = LinkOptions(server_->address());
  auto link = RouterLink::Create(options);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Start().ok());
  EXPECT_EQ((*link)->Start().code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(WaitFor([&] { return registered_calls_.load() == 1; }));
  EXPECT_TRUE((*link)->registered());
  ASSERT_EQ(registry_.registers().size(), 1u);
  EXPECT_EQ(registry_.registers()[0].SerializeAsString(), options.worker.SerializeAsString());

  // The first heartbeat is due one interval (from the response) after Register.
  clock_.Advance(kHeartbeat - absl::Milliseconds(1));
  LetTheLinkRun();
  EXPECT_TRUE(registry_.reports().empty());
  queue_depth_ = 7;
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(WaitFor([&] { return registry_.reports().size() == 1; }));
  internal::v1::LoadReport r = registry_.reports()[0];
  EXPECT_EQ(r.worker_id(), "w1");
  EXPECT_EQ(r.incarnation(), 77u);
  EXPECT_EQ(r.sequence(), 1u);
  EXPECT_EQ(r.queue_depth(), 7u);
  // since_last: from Start to this report.
  EXPECT_EQ(r.decode_tokens_per_second(), absl::ToDoubleMilliseconds(kHeartbeat));

  queue_depth_ = 3;
  clock_.Advance(kHeartbeat + absl::Milliseconds(30));
  ASSERT_TRUE(WaitFor([&] { return registry_.reports().size() == 2; }));
  r = registry_.reports()[1];
  EXPECT_EQ(r.sequence(), 2u);
  EXPECT_EQ(r.queue_depth(), 3u);
  EXPECT_EQ(r.decode_tokens_per_second(), 530.0);
  // No KV-event callback: no batches.
  EXPECT_TRUE(registry_.batches().empty());

  (*link)->Stop();
  ASSERT_EQ(registry_.deregisters().size(), 1u);
  EXPECT_EQ(registry_.deregisters()[0].worker_id(), "w1");
  EXPECT_EQ(registry_.deregisters()[0].incarnation(), 77u);
  (*link)->Stop();  // idempotent
  clock_.Advance(kHeartbeat * 4);
  LetTheLinkRun();
  EXPECT_EQ(registry_.reports().size(), 2u);
  EXPECT_EQ(registry_.deregisters().size(), 1u);
  EXPECT_EQ(registry_.registers().size(), 1u);
  EXPECT_EQ((*link)->Start().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(RouterLinkTest, RegistersAgainWhenTheRouterForgetsTheWorker) {
  RouterLink::Options options = LinkOptions(server_->address());
  // Each call hands over one STORED event with the next hash.
  std::atomic<uint64_t> next_hash{1};
  options.kv_events = [&](google::protobuf::RepeatedPtrField<KvEvent>* events) {
    KvEvent* e = events->Add();
    e->set_kind(KvEvent::KIND_STORED);
    e->add_block_hashes(next_hash++);
    return false;
  };
  auto link = RouterLink::Create(options);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return registered_calls_.load() == 1; }));

  // A heartbeat: the load report, then the events as batch #1.
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registry_.batches().size() == 1; }));
  std::vector<internal::v1::KvEventBatch> b = registry_.batches();
  EXPECT_EQ(b[0].worker_id(), "w1");
  EXPECT_EQ(b[0].incarnation(), 77u);
  EXPECT_EQ(b[0].sequence(), 1u);
  ASSERT_EQ(b[0].events_size(), 1);
  EXPECT_EQ(b[0].events(0).kind(), KvEvent::KIND_STORED);
  EXPECT_EQ(b[0].events(0).block_hashes(0), 1u);

  // The router restarts: the next report hears known=false, the link registers at once (no
  // heartbeat due yet) and publishes no events for that heartbeat.
  registry_.Forget();
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registered_calls_.load() == 2; }));
  EXPECT_EQ(registry_.registers().size(), 2u);
  EXPECT_EQ(registry_.reports().size(), 2u);
  EXPECT_EQ(registry_.batches().size(), 1u);
  EXPECT_TRUE((*link)->registered());

  // The first batch after re-registering starts a snapshot for the router's empty entry.
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registry_.batches().size() == 2; }));
  b = registry_.batches();
  EXPECT_EQ(b[1].sequence(), 2u);
  ASSERT_EQ(b[1].events_size(), 2);
  EXPECT_EQ(b[1].events(0).kind(), KvEvent::KIND_ALL_CLEARED);
  EXPECT_EQ(b[1].events(1).block_hashes(0), 2u);
  EXPECT_EQ(registry_.reports().back().sequence(), 3u);

  // Dropped between its report and its events (NOT_FOUND): the link registers again and resends
  // the unacknowledged batch with its sequence number, then the snapshot.
  registry_.ForgetBeforeNextKvEvents();
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registered_calls_.load() == 3; }));
  EXPECT_EQ(registry_.batches().size(), 2u);
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registry_.batches().size() == 4; }));
  b = registry_.batches();
  EXPECT_EQ(b[2].sequence(), 3u);
  ASSERT_EQ(b[2].events_size(), 1);
  EXPECT_EQ(b[2].events(0).block_hashes(0), 3u);
  EXPECT_EQ(b[3].sequence(), 4u);
  ASSERT_EQ(b[3].events_size(), 2);
  EXPECT_EQ(b[3].events(0).kind(), KvEvent::KIND_ALL_CLEARED);
  EXPECT_EQ(b[3].events(1).block_hashes(0), 4u);

  (*link)->Stop();
  EXPECT_EQ(registry_.deregisters().size(), 1u);
}

TEST_F(RouterLinkTest, LostEventsStartASnapshot) {
  RouterLink::Options options = LinkOptions(server_->address());
  std::atomic<bool> lost{false};
  options.kv_events = [&](google::protobuf::RepeatedPtrField<KvEvent>* /*events*/) {
    return lost.exchange(false);
  };
  auto link = RouterLink::Create(options);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return registered_calls_.load() == 1; }));
  // Nothing to publish: no batch.
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registry_.reports().size() == 1; }));
  LetTheLinkRun();
  EXPECT_TRUE(registry_.batches().empty());
  lost = true;
  clock_.Advance(kHeartbeat);
  ASSERT_TRUE(WaitFor([&] { return registry_.batches().size() == 1; }));
  const internal::v1::KvEventBatch b = registry_.batches()[0];
  EXPECT_EQ(b.sequence(), 1u);
  ASSERT_EQ(b.events_size(), 1);
  EXPECT_EQ(b.events(0).kind(), KvEvent::KIND_ALL_CLEARED);
}

// A refused Register (here FAILED_PRECONDITION, as for a config the model's other workers do not
// share) is retried after 100 ms, 200 ms, ... up to 2 s; a success resets the backoff.
TEST_F(RouterLinkTest, BacksOffWhileTheRouterRefusesRegistration) {
  registry_.Refuse(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "block_size differs"));
  auto link = RouterLink::Create(LinkOptions(server_->address()));
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return registry_.registers().size() == 1; }));
  size_t attempts = 1;
  for (absl::Duration backoff :
       {absl::Milliseconds(100), absl::Milliseconds(200), absl::Milliseconds(400),
        absl::Milliseconds(800), absl::Milliseconds(1600), absl::Seconds(2), absl::Seconds(2)}) {
    clock_.Advance(backoff - absl::Milliseconds(1));
    LetTheLinkRun();
    EXPECT_EQ(registry_.registers().size(), attempts) << "before " << backoff;
    clock_.Advance(absl::Milliseconds(1));
    ++attempts;
    ASSERT_TRUE(WaitFor([&] { return registry_.registers().size() == attempts; }))
        << "after " << backoff;
  }
  EXPECT_FALSE((*link)->registered());
  EXPECT_EQ(registered_calls_.load(), 0);

  registry_.Refuse(grpc::Status::OK);
  clock_.Advance(kRegisterBackoffMax);
  ++attempts;
  ASSERT_TRUE(WaitFor([&] { return registered_calls_.load() == 1; }));
  EXPECT_EQ(registry_.registers().size(), attempts);
  EXPECT_TRUE((*link)->registered());

  // Forgotten (known=false at the next heartbeat) and refused again: the retries start over at
  // 100 ms.
  registry_.Forget();
  registry_.Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting"));
  clock_.Advance(kHeartbeat);
  ++attempts;
  ASSERT_TRUE(WaitFor([&] { return registry_.registers().size() == attempts; }));
  EXPECT_FALSE((*link)->registered());
  clock_.Advance(absl::Milliseconds(99));
  LetTheLinkRun();
  EXPECT_EQ(registry_.registers().size(), attempts);
  clock_.Advance(absl::Milliseconds(1));
  ++attempts;
  ASSERT_TRUE(WaitFor([&] { return registry_.registers().size() == attempts; }));

  // Never registered since it was forgotten, but registered once: Stop deregisters.
  (*link)->Stop();
  EXPECT_EQ(registry_.deregisters().size(), 1u);
}

// No router at the address at first (connection refused): the link keeps trying, on the real
// clock, and registers within the backoff cap once the router listens there.
TEST_F(RouterLinkTest, RegistersOnceARouterAppears) {
  const std::string address = server_->address();
  server_->Shutdown(absl::ZeroDuration());
  RouterLink::Options options = LinkOptions(address);
  options.clock = nullptr;
  auto link = RouterLink::Create(options);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Start().ok());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE((*link)->registered());
  EXPECT_TRUE(registry_.registers().empty());

  GrpcServerOptions so;
  so.listen_address = address;
  so.services = {&registry_};
  auto server = GrpcServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  ASSERT_TRUE(WaitFor([&] { return (*link)->registered(); }));
  EXPECT_EQ(registered_calls_.load(), 1);
  (*link)->Stop();
  EXPECT_EQ(registry_.deregisters().size(), 1u);
}

// Stopped before it ever registered: nothing to deregister.
TEST_F(RouterLinkTest, StopWithoutRegisteringSendsNoDeregister) {
  registry_.Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "not yet"));
  auto link = RouterLink::Create(LinkOptions(server_->address()));
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->Start().ok());
  ASSERT_TRUE(WaitFor([&] { return registry_.registers().size() == 1; }));
  link->reset();  // the destructor stops
  EXPECT_TRUE(registry_.deregisters().empty());
}

}  // namespace
}  // namespace deepinfer::node
