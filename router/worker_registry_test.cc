#include "router/worker_registry.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/fake_clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace deepinfer::router {
namespace {

using internal::v1::KvEvent;
using internal::v1::KvEventBatch;
using internal::v1::LoadReport;
using internal::v1::WorkerInfo;


struct RemovedEvent {
  std::string worker_id;
  uint64_t incarnation;
  absl::StatusCode code;
};

class WorkerRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = Make(/*seed=*/1); }

  std::unique_ptr<WorkerRegistry> Make(uint64_t seed, int64_t max_blocks = int64_t{1} << 22) {
    WorkerRegistry::Options options;
    options.heartbeat_interval = absl::Seconds(1);
    options.missed_heartbeats_allowed = 3;
    options.clock = clock_.AsFunction();
    options.rng_seed = seed;
    options.max_blocks_per_worker = max_blocks;
    options.on_removed = [this](const WorkerInfo& info, const absl::Status& reason) {
      absl::MutexLock lock(&removed_mu_);
      removed_.push_back({info.worker_id(), info.incarnation(), reason.code()});
    };
    absl::StatusOr<std::unique_ptr<WorkerRegistry>> r = WorkerRegistry::Create(options);
    EXPECT_TRUE(r.ok()) << r.status();
    return std::move(*r);
  }

  std::vector<RemovedEvent> Removed() {
    absl::MutexLock lock(&removed_mu_);
    return removed_;
  }

  FakeClock clock_;
  std::unique_ptr<WorkerRegistry> registry_;
  absl::Mutex removed_mu_;
  std::vector<RemovedEvent> removed_ ABSL_GUARDED_BY(removed_mu_);
};

WorkerInfo Worker(absl::string_view id, internal::v1::WorkerRole role, uint64_t incarnation = 100,
                  absl::string_view model = "m") {
  WorkerInfo w;
  w.set_worker_id(std::string(id));
  w.set_role(role);
  w.set_address("127.0.0.1:5000");
  w.set_model(std::string(model));
  w.set_incarnation(incarnation);
  w.set_block_size(16);
  w.set_kv_capacity_blocks(1000);
  w.set_max_context_tokens(4096);
  w.set_block_hash_seed(42);
  return w;
}

WorkerInfo Prefill(absl::string_view id, uint64_t incarnation = 100) {
  return Worker(id, internal::v1::WORKER_ROLE_PREFILL, incarnation);
}
WorkerInfo Decode(absl::string_view id, uint64_t incarnation = 100) {
  return Worker(id, internal::v1::WORKER_ROLE_DECODE, incarnation);
}

LoadReport Load(absl::string_view id, uint64_t incarnation, uint64_t sequence) {
  LoadReport r;
  r.set_worker_id(std::string(id));
  r.set_incarnation(incarnation);
  r.set_sequence(sequence);
  return r;
}

KvEventBatch Batch(absl::string_view id, uint64_t incarnation, uint64_t sequence) {
  KvEventBatch b;
  b.set_worker_id(std::string(id));
  b.set_incarnation(incarnation);
  b.set_sequence(sequence);
  return b;
}

void AddEvent(KvEventBatch* b, KvEvent::Kind kind, std::vector<uint64_t> hashes,
              uint32_t tier = 0) {
  KvEvent* e = b->add_events();
  e->set_kind(kind);
  for (uint64_t h : hashes) e->add_block_hashes(h);
  e->set_tier(tier);
}

TEST(WorkerRegistryCreateTest, RejectsBadOptions) {
  WorkerRegistry::Options o;
  o.heartbeat_interval = absl::ZeroDuration();
  EXPECT_EQ(WorkerRegistry::Create(o).status().message(),
            "heartbeat_interval: expected > 0; got 0");
  o = {};
  o.missed_heartbeats_allowed = 0;
  EXPECT_EQ(WorkerRegistry::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.max_blocks_per_worker = -1;
  EXPECT_EQ(WorkerRegistry::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.expected_block_ttl = absl::ZeroDuration();
  EXPECT_EQ(WorkerRegistry::Create(o).status().message(),
            "expected_block_ttl: expected > 0; got 0");
}

struct InfoCase {
  std::string name;
  std::function<void(WorkerInfo&)> mutate;
  std::string expected;  // message prefix; empty: valid
};

TEST_F(WorkerRegistryTest, RegisterValidatesEveryField) {
  const std::vector<InfoCase> cases = {
      {"valid", [](WorkerInfo&) {}, ""},
      {"empty_id", [](WorkerInfo& w) { w.clear_worker_id(); },
       "worker.worker_id: expected 1..128 bytes; got 0 bytes"},
      {"long_id", [](WorkerInfo& w) { w.set_worker_id(std::string(129, 'w')); },
       "worker.worker_id: expected 1..128 bytes; got 129 bytes"},
      {"id_128", [](WorkerInfo& w) { w.set_worker_id(std::string(128, 'w')); }, ""},
      {"no_role", [](WorkerInfo& w) { w.set_role(internal::v1::WORKER_ROLE_UNSPECIFIED); },
       "worker.role: expected PREFILL, DECODE or ENCODER; got 0"},
      {"unknown_role", [](WorkerInfo& w) { w.set_role(static_cast<internal::v1::WorkerRole>(9)); },
       "worker.role: expected PREFILL, DECODE or ENCODER; got 9"},
      {"no_port", [](WorkerInfo& w) { w.set_address("localhost"); },
       "worker.address: expected host:port, [ipv6]:port or :port; got \"localhost\""},
      {"port_zero", [](WorkerInfo& w) { w.set_address("localhost:0"); },
       "worker.address: expected a port in 1..65535"},
      {"empty_host", [](WorkerInfo& w) { w.set_address(":5000"); },
       "worker.address: expected a connectable host:port; got \":5000\""},
      {"any_host", [](WorkerInfo& w) { w.set_address("0.0.0.0:5000"); },
       "worker.address: expected a connectable host:port"},
      {"ipv6", [](WorkerInfo& w) { w.set_address("[::1]:5000"); }, ""},
      {"no_model", [](WorkerInfo& w) { w.clear_model(); },
       "worker.model: expected a model id; got \"\""},
      {"no_incarnation", [](WorkerInfo& w) { w.set_incarnation(0); },
       "worker.incarnation: expected non-zero; got 0"},
      {"no_block_size", [](WorkerInfo& w) { w.set_block_size(0); },
       "worker.block_size: expected > 0 for a prefill worker; got 0"},
      {"encoder_needs_no_block_size",
       [](WorkerInfo& w) {
         w.set_role(internal::v1::WORKER_ROLE_ENCODER);
         w.set_block_size(0);
       },
       ""},
      {"kv_agent_name",
       [](WorkerInfo& w) {
         w.mutable_kv_metadata()->set_agent_name("other");
         w.mutable_kv_metadata()->set_incarnation(w.incarnation());
       },
       "worker.kv_metadata.agent_name: expected the worker_id \"p0\"; got \"other\""},
      {"kv_incarnation",
       [](WorkerInfo& w) {
         w.mutable_kv_metadata()->set_agent_name(w.worker_id());
         w.mutable_kv_metadata()->set_incarnation(7);
       },
       "worker.kv_metadata.incarnation: expected the worker's incarnation 100; got 7"},
  };
  for (const InfoCase& c : cases) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<WorkerRegistry> registry = Make(1);
    WorkerInfo w = Prefill("p0");
    c.mutate(w);
    absl::StatusOr<internal::v1::RegisterResponse> r = registry->Register(w);
    if (c.expected.empty()) {
      EXPECT_TRUE(r.ok()) << r.status();
      continue;
    }
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StartsWith(r.status().message(), c.expected)) << r.status();
    EXPECT_TRUE(registry->List().empty());
  }
}

TEST_F(WorkerRegistryTest, RegisterReturnsHeartbeatSettingsAndPeers) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  ASSERT_TRUE(registry_->Register(Worker("e0", internal::v1::WORKER_ROLE_ENCODER)).ok());
  absl::StatusOr<internal::v1::RegisterResponse> r = registry_->Register(Decode("d0"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->heartbeat_interval_ms(), 1000u);
  EXPECT_EQ(r->missed_heartbeats_allowed(), 3u);
  // Prefill/decode peers only, never itself.
  ASSERT_EQ(r->peers_size(), 1);
  EXPECT_EQ(r->peers(0).worker_id(), "p0");
  r = registry_->Register(Prefill("p1"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->peers_size(), 2);
  EXPECT_EQ(r->peers(0).worker_id(), "d0");
  EXPECT_EQ(r->peers(1).worker_id(), "p0");
}

TEST_F(WorkerRegistryTest, SeedAndBlockSizeMustAgreeWithinAModel) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  WorkerInfo other_seed = Decode("d0");
  other_seed.set_block_hash_seed(43);
  absl::StatusOr<internal::v1::RegisterResponse> r = registry_->Register(other_seed);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "worker.block_hash_seed: expected 42 (as worker \"p0\" of model \"m\", so that block "
            "hashes compare); got 43");
  WorkerInfo other_block = Decode("d0");
  other_block.set_block_size(32);
  r = registry_->Register(other_block);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "worker.block_size: expected 16"))
      << r.status();
  EXPECT_FALSE(registry_->Get("d0").has_value());
  // Another model may use its own seed; encoders hold no KV.
  WorkerInfo other_model = Worker("d1", internal::v1::WORKER_ROLE_DECODE, 100, "m2");
  other_model.set_block_hash_seed(43);
  EXPECT_TRUE(registry_->Register(other_model).ok());
  WorkerInfo encoder = Worker("e0", internal::v1::WORKER_ROLE_ENCODER);
  encoder.set_block_hash_seed(99);
  EXPECT_TRUE(registry_->Register(encoder).ok());
  // A worker's own new incarnation does not compare with its old entry.
  WorkerInfo restarted = Prefill("p0", 101);
  restarted.set_block_hash_seed(7);
  EXPECT_TRUE(registry_->Register(restarted).ok());
}

internal::v1::SpeculativeConfig Ngram(uint32_t k) {
  internal::v1::SpeculativeConfig c;
  c.set_method("ngram");
  c.set_num_speculative_tokens(k);
  c.set_min_n(1);
  c.set_max_n(4);
  return c;
}

TEST_F(WorkerRegistryTest, SpeculativeConfigMustAgreeWithinAModel) {
  WorkerInfo p0 = Prefill("p0");
  *p0.mutable_speculative() = Ngram(4);
  ASSERT_TRUE(registry_->Register(p0).ok());
  // Speculation off (unset, as from an older worker) against ngram: the method differs.
  absl::StatusOr<internal::v1::RegisterResponse> r = registry_->Register(Decode("d0"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "worker.speculative.method: expected ngram (as worker \"p0\" of model \"m\"; every "
            "worker of a model needs the same speculative flags); got off");
  struct Case {
    internal::v1::SpeculativeConfig config;
    const char* message_prefix;
    const char* message_suffix;
  };
  std::vector<Case> cases;
  cases.push_back({Ngram(8), "worker.speculative.num_speculative_tokens: expected 4 ", "; got 8"});
  cases.push_back({Ngram(4), "worker.speculative.min_n: expected 1 ", "; got 2"});
  cases.back().config.set_min_n(2);
  cases.push_back({Ngram(4), "worker.speculative.max_n: expected 4 ", "; got 3"});
  cases.back().config.set_max_n(3);
  cases.push_back({Ngram(4), "worker.speculative.adaptive: expected false ", "; got true"});
  cases.back().config.set_adaptive(true);
  cases.push_back({Ngram(4), "worker.speculative.draft_model_id: expected \"\" ",
                   "; got \"demo-draft\""});
  cases.back().config.set_draft_model_id("demo-draft");
  for (const Case& c : cases) {
    WorkerInfo d0 = Decode("d0");
    *d0.mutable_speculative() = c.config;
    r = registry_->Register(d0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << c.message_prefix;
    EXPECT_TRUE(absl::StartsWith(r.status().message(), c.message_prefix)) << r.status();
    EXPECT_TRUE(absl::EndsWith(r.status().message(), c.message_suffix)) << r.status();
  }
  EXPECT_FALSE(registry_->Get("d0").has_value());
  // The same config registers; another model may speculate differently (or not at all).
  WorkerInfo d0 = Decode("d0");
  *d0.mutable_speculative() = Ngram(4);
  EXPECT_TRUE(registry_->Register(d0).ok());
  EXPECT_TRUE(registry_->Register(Worker("d1", internal::v1::WORKER_ROLE_DECODE, 100, "m2")).ok());
  // "off" and unset are the same config; with the method off the other fields do not count.
  WorkerInfo d2 = Worker("d2", internal::v1::WORKER_ROLE_DECODE, 100, "m2");
  d2.mutable_speculative()->set_method("off");
  d2.mutable_speculative()->set_num_speculative_tokens(9);
  EXPECT_TRUE(registry_->Register(d2).ok());
}

TEST_F(WorkerRegistryTest, NewerIncarnationReplacesOlderIsRefusedSameRefreshes) {
  ASSERT_TRUE(registry_->Register(Prefill("p0", 100)).ok());
  KvEventBatch b = Batch("p0", 100, 1);
  AddEvent(&b, KvEvent::KIND_STORED, {1, 2});
  ASSERT_TRUE(registry_->PublishKvEvents(b).ok());
  ASSERT_TRUE(registry_->ReportLoad(Load("p0", 100, 5)).known());

  // Same incarnation (a retried Register): entry and its state stay.
  clock_.Advance(absl::Seconds(2));
  WorkerInfo retried = Prefill("p0", 100);
  retried.set_address("127.0.0.1:6000");
  ASSERT_TRUE(registry_->Register(retried).ok());
  std::optional<WorkerSnapshot> s = registry_->Get("p0");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->info.address(), "127.0.0.1:6000");
  EXPECT_EQ(s->cached_blocks, 2);
  EXPECT_EQ(s->last_heartbeat, clock_.Now());
  EXPECT_TRUE(Removed().empty());

  // Newer: replaces, fails the old one, state starts over.
  ASSERT_TRUE(registry_->Register(Prefill("p0", 200)).ok());
  s = registry_->Get("p0");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->info.incarnation(), 200u);
  EXPECT_EQ(s->cached_blocks, 0);
  EXPECT_FALSE(s->has_load);
  ASSERT_EQ(Removed().size(), 1u);
  EXPECT_EQ(Removed()[0].worker_id, "p0");
  EXPECT_EQ(Removed()[0].incarnation, 100u);
  EXPECT_EQ(Removed()[0].code, absl::StatusCode::kAborted);
  // The old incarnation is now unknown everywhere.
  EXPECT_FALSE(registry_->ReportLoad(Load("p0", 100, 6)).known());
  EXPECT_EQ(registry_->PublishKvEvents(Batch("p0", 100, 2)).status().code(),
            absl::StatusCode::kAborted);

  // Older: refused.
  absl::StatusOr<internal::v1::RegisterResponse> r = registry_->Register(Prefill("p0", 150));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(r.status().message(),
            "worker.incarnation: expected >= 200 (the registered incarnation of \"p0\"); got stale "
            "150");
}

TEST_F(WorkerRegistryTest, ReportLoadKnownAndStaleSequences) {
  EXPECT_FALSE(registry_->ReportLoad(Load("nobody", 1, 1)).known());
  ASSERT_TRUE(registry_->Register(Decode("d0")).ok());
  EXPECT_FALSE(registry_->ReportLoad(Load("d0", 99, 1)).known());

  LoadReport r = Load("d0", 100, 10);
  r.set_free_kv_blocks(500);
  r.set_running_sequences(3);
  EXPECT_TRUE(registry_->ReportLoad(r).known());
  LoadReport stale = Load("d0", 100, 9);
  stale.set_free_kv_blocks(1);
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_TRUE(registry_->ReportLoad(stale).known());  // known, but its data is ignored
  std::optional<WorkerSnapshot> s = registry_->Get("d0");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->load.free_kv_blocks(), 500u);
  EXPECT_EQ(s->load.sequence(), 10u);
  EXPECT_EQ(s->last_heartbeat, clock_.Now());  // still a sign of life
  LoadReport duplicate = Load("d0", 100, 10);
  duplicate.set_free_kv_blocks(2);
  registry_->ReportLoad(duplicate);
  EXPECT_EQ(registry_->Get("d0")->load.free_kv_blocks(), 500u);
  LoadReport newer = Load("d0", 100, 11);
  newer.set_free_kv_blocks(400);
  registry_->ReportLoad(newer);
  EXPECT_EQ(registry_->Get("d0")->load.free_kv_blocks(), 400u);
}

TEST_F(WorkerRegistryTest, Deregister) {
  EXPECT_TRUE(registry_->Deregister("nobody", 1).ok());
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  absl::Status s = registry_->Deregister("p0", 99);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(registry_->Get("p0").has_value());
  EXPECT_TRUE(registry_->Deregister("p0", 100).ok());
  EXPECT_FALSE(registry_->Get("p0").has_value());
  ASSERT_EQ(Removed().size(), 1u);
  EXPECT_EQ(Removed()[0].code, absl::StatusCode::kCancelled);
  EXPECT_FALSE(registry_->ReportLoad(Load("p0", 100, 1)).known());
}

TEST_F(WorkerRegistryTest, KvEventsMaintainTheBlockSet) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  KvEventBatch b1 = Batch("p0", 100, 1);
  AddEvent(&b1, KvEvent::KIND_STORED, {11, 12, 13, 14});
  absl::StatusOr<internal::v1::KvEventAck> ack = registry_->PublishKvEvents(b1);
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_FALSE(ack->resync());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{11, 12, 13, 14, 15}), 4);
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{11, 99, 13}), 1);
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{99, 11}), 0);
  EXPECT_EQ(registry_->PrefixOverlap("p0", {}), 0);
  EXPECT_EQ(registry_->PrefixOverlap("nobody", std::vector<uint64_t>{11}), 0);

  KvEventBatch b2 = Batch("p0", 100, 2);
  AddEvent(&b2, KvEvent::KIND_REMOVED, {13});
  AddEvent(&b2, KvEvent::KIND_STORED, {12}, /*tier=*/1);   // also in host memory
  AddEvent(&b2, KvEvent::KIND_REMOVED, {12}, /*tier=*/0);  // evicted from device only
  ASSERT_TRUE(registry_->PublishKvEvents(b2).ok());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{11, 12, 13, 14}), 2);
  EXPECT_EQ(registry_->Get("p0")->cached_blocks, 3);

  // A retried batch changes nothing.
  KvEventBatch again = Batch("p0", 100, 1);
  AddEvent(&again, KvEvent::KIND_STORED, {13});
  ack = registry_->PublishKvEvents(again);
  ASSERT_TRUE(ack.ok());
  EXPECT_FALSE(ack->resync());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{11, 12, 13}), 2);

  KvEventBatch b3 = Batch("p0", 100, 3);
  AddEvent(&b3, KvEvent::KIND_REMOVED, {12}, /*tier=*/1);
  AddEvent(&b3, KvEvent::KIND_REMOVED, {777});  // unknown: ignored
  ASSERT_TRUE(registry_->PublishKvEvents(b3).ok());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{11, 12}), 1);

  KvEventBatch b4 = Batch("p0", 100, 4);
  AddEvent(&b4, KvEvent::KIND_ALL_CLEARED, {});
  ASSERT_TRUE(registry_->PublishKvEvents(b4).ok());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{11}), 0);
  EXPECT_EQ(registry_->Get("p0")->cached_blocks, 0);
}

TEST_F(WorkerRegistryTest, ExpectedBlocksCountUntilConfirmedDroppedOrExpired) {
  ASSERT_TRUE(registry_->Register(Decode("d0")).ok());
  // Before any STORED event the worker may have no prefix cache: nothing is expected.
  registry_->ExpectStored("d0", 100, std::vector<uint64_t>{1, 2});
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2}), 0);
  EXPECT_EQ(registry_->Get("d0")->expected_blocks, 0);

  KvEventBatch b1 = Batch("d0", 100, 1);
  AddEvent(&b1, KvEvent::KIND_STORED, {1, 2});  // a prompt's blocks
  ASSERT_TRUE(registry_->PublishKvEvents(b1).ok());
  // The request finished: prompt 1, 2 and its answer 3, 4, 5 (not yet in any event).
  registry_->ExpectStored("d0", 100, std::vector<uint64_t>{1, 2, 3, 4, 5});
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3, 4, 5, 6}), 5);
  EXPECT_EQ(registry_->Get("d0")->cached_blocks, 2);
  EXPECT_EQ(registry_->Get("d0")->expected_blocks, 3);
  // Unknown worker or another incarnation: ignored.
  registry_->ExpectStored("d0", 99, std::vector<uint64_t>{6});
  registry_->ExpectStored("nobody", 100, std::vector<uint64_t>{6});
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3, 4, 5, 6}), 5);
  EXPECT_EQ(registry_->PrefixOverlap("nobody", std::vector<uint64_t>{6}), 0);

  // The worker's next batch confirms 3, says 4 was evicted and never mentions 5.
  clock_.Advance(absl::Seconds(1));
  KvEventBatch b2 = Batch("d0", 100, 2);
  AddEvent(&b2, KvEvent::KIND_STORED, {3});
  AddEvent(&b2, KvEvent::KIND_REMOVED, {4});
  ASSERT_TRUE(registry_->PublishKvEvents(b2).ok());
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3, 4}), 3);
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{5}), 1);
  EXPECT_EQ(registry_->Get("d0")->cached_blocks, 3);
  EXPECT_EQ(registry_->Get("d0")->expected_blocks, 1);

  // 5 expires three seconds after it was expected; 3 (confirmed) stays.
  clock_.Advance(absl::Milliseconds(1999));
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{5}), 1);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{5}), 0);
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3}), 3);
  ASSERT_TRUE(registry_->ReportLoad(Load("d0", 100, 1)).known());  // keeps it alive
  EXPECT_EQ(registry_->Sweep(), 0);
  EXPECT_EQ(registry_->Get("d0")->expected_blocks, 0);  // forgotten

  // Expecting again renews; a snapshot (ALL_CLEARED) drops what is expected with the rest.
  registry_->ExpectStored("d0", 100, std::vector<uint64_t>{1, 2, 3, 7});
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3, 7}), 4);
  KvEventBatch b3 = Batch("d0", 100, 3);
  AddEvent(&b3, KvEvent::KIND_ALL_CLEARED, {});
  AddEvent(&b3, KvEvent::KIND_STORED, {1});
  ASSERT_TRUE(registry_->PublishKvEvents(b3).ok());
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3, 7}), 1);
  EXPECT_EQ(registry_->Get("d0")->expected_blocks, 0);

  // So does a gap in the batches.
  registry_->ExpectStored("d0", 100, std::vector<uint64_t>{1, 8});
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 8}), 2);
  KvEventBatch b5 = Batch("d0", 100, 5);
  ASSERT_TRUE(registry_->PublishKvEvents(b5).ok());
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 8}), 0);
}

TEST_F(WorkerRegistryTest, ExpectedBlocksStayWithinTheLimit) {
  registry_ = Make(/*seed=*/1, /*max_blocks=*/3);
  ASSERT_TRUE(registry_->Register(Decode("d0")).ok());
  KvEventBatch b1 = Batch("d0", 100, 1);
  AddEvent(&b1, KvEvent::KIND_STORED, {1});
  ASSERT_TRUE(registry_->PublishKvEvents(b1).ok());
  registry_->ExpectStored("d0", 100, std::vector<uint64_t>{1, 2, 3, 4, 5});
  EXPECT_EQ(registry_->Get("d0")->expected_blocks, 2);
  EXPECT_EQ(registry_->PrefixOverlap("d0", std::vector<uint64_t>{1, 2, 3, 4, 5}), 3);
}

TEST_F(WorkerRegistryTest, KvEventGapAsksForSnapshotUntilItArrives) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  KvEventBatch b1 = Batch("p0", 100, 1);
  AddEvent(&b1, KvEvent::KIND_STORED, {1, 2, 3});
  ASSERT_TRUE(registry_->PublishKvEvents(b1).ok());

  // Batches 2 and 3 were lost (they might have removed 1..3).
  KvEventBatch b4 = Batch("p0", 100, 4);
  AddEvent(&b4, KvEvent::KIND_STORED, {50});
  absl::StatusOr<internal::v1::KvEventAck> ack = registry_->PublishKvEvents(b4);
  ASSERT_TRUE(ack.ok());
  EXPECT_TRUE(ack->resync());
  EXPECT_TRUE(registry_->Get("p0")->kv_resync_pending);
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{1}), 0);  // no stale claims
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{50}), 1);

  KvEventBatch b5 = Batch("p0", 100, 5);
  AddEvent(&b5, KvEvent::KIND_STORED, {51});
  ack = registry_->PublishKvEvents(b5);
  ASSERT_TRUE(ack.ok());
  EXPECT_TRUE(ack->resync());  // still waiting for the snapshot

  KvEventBatch snapshot = Batch("p0", 100, 6);
  AddEvent(&snapshot, KvEvent::KIND_ALL_CLEARED, {});
  AddEvent(&snapshot, KvEvent::KIND_STORED, {1, 50, 51});
  ack = registry_->PublishKvEvents(snapshot);
  ASSERT_TRUE(ack.ok());
  EXPECT_FALSE(ack->resync());
  EXPECT_FALSE(registry_->Get("p0")->kv_resync_pending);
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{1, 50, 51, 2}), 3);

  // A first batch that does not start at 1 (e.g. after a router restart) is a gap too.
  ASSERT_TRUE(registry_->Register(Prefill("p1")).ok());
  ack = registry_->PublishKvEvents(Batch("p1", 100, 57));
  ASSERT_TRUE(ack.ok());
  EXPECT_TRUE(ack->resync());
}

TEST_F(WorkerRegistryTest, MalformedKvBatchesAreRefusedAndNotApplied) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  EXPECT_EQ(registry_->PublishKvEvents(Batch("nobody", 100, 1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->PublishKvEvents(Batch("p0", 100, 0)).status().message(),
            "sequence: expected >= 1 (consecutive from 1); got 0");
  KvEventBatch b = Batch("p0", 100, 1);
  AddEvent(&b, KvEvent::KIND_STORED, {1});
  AddEvent(&b, KvEvent::KIND_UNSPECIFIED, {2});
  EXPECT_EQ(registry_->PublishKvEvents(b).status().message(),
            "events[1].kind: expected STORED, REMOVED or ALL_CLEARED; got 0");
  b = Batch("p0", 100, 1);
  AddEvent(&b, KvEvent::KIND_STORED, {1}, /*tier=*/3);
  EXPECT_EQ(registry_->PublishKvEvents(b).status().message(),
            "events[0].tier: expected 0..2; got 3");
  b = Batch("p0", 100, 1);
  AddEvent(&b, KvEvent::KIND_ALL_CLEARED, {1});
  EXPECT_EQ(registry_->PublishKvEvents(b).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{1}), 0);
  // Sequence 1 was never consumed: the next good batch 1 applies without a gap.
  b = Batch("p0", 100, 1);
  AddEvent(&b, KvEvent::KIND_STORED, {1});
  absl::StatusOr<internal::v1::KvEventAck> ack = registry_->PublishKvEvents(b);
  ASSERT_TRUE(ack.ok());
  EXPECT_FALSE(ack->resync());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{1}), 1);
}

TEST_F(WorkerRegistryTest, BlockSetIsCapped) {
  std::unique_ptr<WorkerRegistry> registry = Make(1, /*max_blocks=*/3);
  ASSERT_TRUE(registry->Register(Prefill("p0")).ok());
  KvEventBatch b = Batch("p0", 100, 1);
  AddEvent(&b, KvEvent::KIND_STORED, {1, 2, 3, 4, 5});
  ASSERT_TRUE(registry->PublishKvEvents(b).ok());
  EXPECT_EQ(registry->Get("p0")->cached_blocks, 3);
  EXPECT_EQ(registry->PrefixOverlap("p0", std::vector<uint64_t>{1, 2, 3, 4, 5}), 3);
}

TEST_F(WorkerRegistryTest, MissedHeartbeatsDropTheWorker) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  ASSERT_TRUE(registry_->Register(Prefill("p1")).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(registry_->ReportLoad(Load("p1", 100, 1)).known());
  // p0: exactly 3 intervals of silence is still allowed.
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(registry_->Sweep(), 0);
  clock_.Advance(absl::Milliseconds(1));
  // Past the deadline: not selectable even before a sweep.
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<WorkerSnapshot> pick = registry_->PickPrefill("m", 10);
    ASSERT_TRUE(pick.ok());
    EXPECT_EQ(pick->info.worker_id(), "p1");
  }
  EXPECT_EQ(registry_->Sweep(), 1);
  EXPECT_FALSE(registry_->Get("p0").has_value());
  ASSERT_EQ(Removed().size(), 1u);
  EXPECT_EQ(Removed()[0].worker_id, "p0");
  EXPECT_EQ(Removed()[0].code, absl::StatusCode::kUnavailable);
  EXPECT_FALSE(registry_->ReportLoad(Load("p0", 100, 1)).known());  // must register again
  // Registering again brings it back with fresh state.
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  EXPECT_EQ(registry_->Get("p0")->last_heartbeat, clock_.Now());
  ASSERT_TRUE(registry_->Deregister("p0", 100).ok());
  // KV events count as heartbeats too.
  KvEventBatch b = Batch("p1", 100, 1);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(registry_->PublishKvEvents(b).ok());
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_->Sweep(), 0);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_->Sweep(), 1);
  EXPECT_EQ(registry_->PickPrefill("m", 1).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(WorkerRegistryTest, LateMessagesFromADroppedWorkerDoNotRevive) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  ASSERT_TRUE(registry_->Register(Prefill("p1")).ok());
  clock_.Advance(absl::Seconds(4));  // both silent too long; no sweep has run
  EXPECT_FALSE(registry_->ReportLoad(Load("p0", 100, 1)).known());
  EXPECT_EQ(registry_->PublishKvEvents(Batch("p1", 100, 1)).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_EQ(Removed().size(), 2u);
  EXPECT_EQ(Removed()[0].code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(Removed()[1].code, absl::StatusCode::kUnavailable);
  EXPECT_TRUE(registry_->List().empty());
  EXPECT_EQ(registry_->Sweep(), 0);
  // A dead worker with another seed does not block a new one, nor shows up as a peer.
  WorkerInfo p2 = Prefill("p2");
  ASSERT_TRUE(registry_->Register(p2).ok());
  clock_.Advance(absl::Seconds(4));
  p2.set_worker_id("p3");
  p2.set_block_hash_seed(5);
  absl::StatusOr<internal::v1::RegisterResponse> r = registry_->Register(p2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->peers_size(), 0);
}

TEST_F(WorkerRegistryTest, BackgroundSweeperExpiresWorkers) {
  WorkerRegistry::Options options;
  options.heartbeat_interval = absl::Milliseconds(5);
  options.missed_heartbeats_allowed = 2;
  options.clock = clock_.AsFunction();
  std::atomic<int> removed{0};
  options.on_removed = [&](const WorkerInfo&, const absl::Status&) { ++removed; };
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry = WorkerRegistry::Create(options);
  ASSERT_TRUE(registry.ok());
  ASSERT_TRUE((*registry)->Register(Decode("d0")).ok());
  (*registry)->Start();
  (*registry)->Start();  // idempotent
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(removed.load(), 0);  // the fake clock has not moved
  clock_.Advance(absl::Milliseconds(11));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (removed.load() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(removed.load(), 1);
  EXPECT_TRUE((*registry)->List().empty());
  (*registry)->Stop();
  (*registry)->Stop();
}

TEST_F(WorkerRegistryTest, PickPrefillLeastQueuedTokensThenQueueDepth) {
  for (const char* id : {"p0", "p1", "p2"}) ASSERT_TRUE(registry_->Register(Prefill(id)).ok());
  ASSERT_TRUE(registry_->Register(Worker("x0", internal::v1::WORKER_ROLE_PREFILL, 100, "m2")).ok());
  LoadReport r0 = Load("p0", 100, 1);
  r0.set_queued_input_tokens(1000);
  LoadReport r1 = Load("p1", 100, 1);
  r1.set_queued_input_tokens(200);
  r1.set_queue_depth(5);
  LoadReport r2 = Load("p2", 100, 1);
  r2.set_queued_input_tokens(200);
  r2.set_queue_depth(1);
  for (const LoadReport& r : {r0, r1, r2}) ASSERT_TRUE(registry_->ReportLoad(r).known());

  absl::StatusOr<WorkerSnapshot> pick = registry_->PickPrefill("m", 500);
  ASSERT_TRUE(pick.ok()) << pick.status();
  EXPECT_EQ(pick->info.worker_id(), "p2");  // tokens tie with p1, shorter queue
  EXPECT_EQ(pick->placed_tokens, 500);
  // p2 now counts 700 tokens: p1 is next, then back to p2/p1 as placements add up.
  EXPECT_EQ(registry_->PickPrefill("m", 500)->info.worker_id(), "p1");
  EXPECT_EQ(registry_->PickPrefill("m", 100)->info.worker_id(), "p2");  // 700 vs 700: depth 2<6
  // A load report resets what the router placed.
  LoadReport r1b = Load("p1", 100, 2);
  r1b.set_queued_input_tokens(0);
  ASSERT_TRUE(registry_->ReportLoad(r1b).known());
  EXPECT_EQ(registry_->Get("p1")->placed_tokens, 0);
  EXPECT_EQ(registry_->PickPrefill("m", 1)->info.worker_id(), "p1");
  // Other models' workers are never picked; an unknown model has none.
  EXPECT_EQ(registry_->PickPrefill("m2", 1)->info.worker_id(), "x0");
  absl::StatusOr<WorkerSnapshot> none = registry_->PickPrefill("nope", 1);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(none.status().message(), "no live prefill worker for model \"nope\"");
  EXPECT_EQ(registry_->PickPrefill("m", -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerRegistryTest, PickDecodeMostFreeBlocksThenFewestRunning) {
  for (const char* id : {"d0", "d1", "d2"}) ASSERT_TRUE(registry_->Register(Decode(id)).ok());
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  // Before any report: capacity from WorkerInfo (1000 each).
  LoadReport r0 = Load("d0", 100, 1);
  r0.set_free_kv_blocks(300);
  r0.set_running_sequences(1);
  LoadReport r1 = Load("d1", 100, 1);
  r1.set_free_kv_blocks(800);
  r1.set_running_sequences(9);
  LoadReport r2 = Load("d2", 100, 1);
  r2.set_free_kv_blocks(800);
  r2.set_running_sequences(4);
  for (const LoadReport& r : {r0, r1, r2}) ASSERT_TRUE(registry_->ReportLoad(r).known());

  absl::StatusOr<WorkerSnapshot> pick = registry_->PickDecode("m", 100);
  ASSERT_TRUE(pick.ok()) << pick.status();
  EXPECT_EQ(pick->info.worker_id(), "d2");  // ties d1 on room, fewer running
  EXPECT_EQ(pick->placed_blocks, 100);
  EXPECT_EQ(registry_->PickDecode("m", 100)->info.worker_id(), "d1");  // 800 free vs 700
  // Only d0..d2 with room: 700, 700, 300 free.
  absl::StatusOr<WorkerSnapshot> big = registry_->PickDecode("m", 701);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(big.status().message(),
            "no decode worker for model \"m\" has 701 free KV blocks (most free: 700)");
  EXPECT_EQ(registry_->PickDecode("other", 1).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(WorkerRegistryTest, PickSkipsExcludedWorkers) {
  for (const char* id : {"p0", "p1"}) ASSERT_TRUE(registry_->Register(Prefill(id)).ok());
  for (const char* id : {"d0", "d1"}) ASSERT_TRUE(registry_->Register(Decode(id)).ok());
  LoadReport p1 = Load("p1", 100, 1);
  p1.set_queued_input_tokens(5000);  // p0 would win on load
  ASSERT_TRUE(registry_->ReportLoad(p1).known());
  LoadReport d1 = Load("d1", 100, 1);
  d1.set_free_kv_blocks(10);  // d0 would win on room
  ASSERT_TRUE(registry_->ReportLoad(d1).known());

  const std::vector<std::string> not_p0 = {"p0"};
  absl::StatusOr<WorkerSnapshot> prefill = registry_->PickPrefill("m", 10, not_p0);
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  EXPECT_EQ(prefill->info.worker_id(), "p1");
  const std::vector<std::string> not_d0 = {"d0", "unknown"};
  absl::StatusOr<WorkerSnapshot> decode = registry_->PickDecode("m", 5, not_d0);
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->info.worker_id(), "d1");
  // Room is judged among the workers left: d1 has 5 free now.
  EXPECT_EQ(registry_->PickDecode("m", 6, not_d0).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Without the exclusion the best worker is back.
  EXPECT_EQ(registry_->PickDecode("m", 5)->info.worker_id(), "d0");

  const std::vector<std::string> all_prefill = {"p0", "p1"};
  absl::StatusOr<WorkerSnapshot> none = registry_->PickPrefill("m", 1, all_prefill);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(none.status().message(),
            "no live prefill worker for model \"m\" (excluding \"p0\", \"p1\")");
  const std::vector<std::string> all_decode = {"d1", "d0"};
  absl::StatusOr<WorkerSnapshot> no_decode = registry_->PickDecode("m", 1, all_decode);
  EXPECT_EQ(no_decode.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(no_decode.status().message(),
            "no live decode worker for model \"m\" (excluding \"d1\", \"d0\")");
}

TEST_F(WorkerRegistryTest, PickDecodeUsesCapacityBeforeTheFirstReport) {
  WorkerInfo small = Decode("d0");
  small.set_kv_capacity_blocks(50);
  ASSERT_TRUE(registry_->Register(small).ok());
  ASSERT_TRUE(registry_->Register(Decode("d1")).ok());  // 1000 blocks
  EXPECT_EQ(registry_->PickDecode("m", 10)->info.worker_id(), "d1");
  EXPECT_EQ(registry_->PickDecode("m", 990)->info.worker_id(), "d1");
  EXPECT_EQ(registry_->PickDecode("m", 10)->info.worker_id(), "d0");  // d1 has 0 left
}

TEST_F(WorkerRegistryTest, ReleasePlacementGivesBackOnlyWithinTheSameLoadEpoch) {
  ASSERT_TRUE(registry_->Register(Decode("d0")).ok());  // 1000 blocks
  absl::StatusOr<WorkerSnapshot> a = registry_->PickDecode("m", 600);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(registry_->PickDecode("m", 600).status().code(), absl::StatusCode::kResourceExhausted);
  // The first request finished before any load report: its blocks count as free again.
  registry_->ReleasePlacement("d0", a->info.incarnation(), a->load_epoch, 0, 600);
  absl::StatusOr<WorkerSnapshot> b = registry_->PickDecode("m", 600);
  ASSERT_TRUE(b.ok()) << b.status();
  // A load report arrives (it already counts b's blocks as used): releasing b now must not
  // subtract from placements made after the report.
  LoadReport r = Load("d0", 100, 1);
  r.set_free_kv_blocks(400);
  ASSERT_TRUE(registry_->ReportLoad(r).known());
  ASSERT_TRUE(registry_->PickDecode("m", 300).ok());
  registry_->ReleasePlacement("d0", b->info.incarnation(), b->load_epoch, 0, 600);
  EXPECT_EQ(registry_->Get("d0")->placed_blocks, 300);
  // Unknown workers and stale incarnations are ignored.
  registry_->ReleasePlacement("nobody", 1, 0, 0, 5);
  registry_->ReleasePlacement("d0", b->info.incarnation() + 1, registry_->Get("d0")->load_epoch, 0,
                              300);
  EXPECT_EQ(registry_->Get("d0")->placed_blocks, 300);
}

TEST_F(WorkerRegistryTest, RecordPlacementCountsUntilTheNextReportOrRelease) {
  ASSERT_TRUE(registry_->Register(Prefill("p0")).ok());
  ASSERT_TRUE(registry_->Register(Decode("d0")).ok());
  absl::StatusOr<WorkerSnapshot> p = registry_->RecordPlacement("p0", 100, 120, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->placed_requests, 1);
  EXPECT_EQ(p->placed_tokens, 120);
  absl::StatusOr<WorkerSnapshot> d = registry_->RecordPlacement("d0", 100, 7, 30);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->placed_blocks, 30);
  EXPECT_EQ(d->placed_tokens, 7);
  // PickPrefill sees what was recorded: p1 (nothing placed) wins over p0.
  ASSERT_TRUE(registry_->Register(Prefill("p1")).ok());
  EXPECT_EQ(registry_->PickPrefill("m", 1)->info.worker_id(), "p1");
  // Released within the same epoch: gone.
  registry_->ReleasePlacement("p0", 100, p->load_epoch, 120, 0);
  EXPECT_EQ(registry_->Get("p0")->placed_tokens, 0);
  EXPECT_EQ(registry_->Get("p0")->placed_requests, 0);
  // A load report resets the counts.
  ASSERT_TRUE(registry_->ReportLoad(Load("d0", 100, 1)).known());
  EXPECT_EQ(registry_->Get("d0")->placed_blocks, 0);
  // Wrong incarnation, unknown or dead workers, negative counts.
  EXPECT_EQ(registry_->RecordPlacement("d0", 101, 1, 1).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(registry_->RecordPlacement("nobody", 1, 1, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->RecordPlacement("d0", 100, -1, 0).status().message(),
            "input_tokens: expected >= 0; got -1");
  EXPECT_EQ(registry_->RecordPlacement("d0", 100, 0, -2).status().message(),
            "blocks: expected >= 0; got -2");
  // ListLive: the live workers of one model.
  ASSERT_TRUE(
      registry_->Register(Worker("x0", internal::v1::WORKER_ROLE_DECODE, 100, "other")).ok());
  std::vector<std::string> live;
  for (const WorkerSnapshot& w : registry_->ListLive("m")) live.push_back(w.info.worker_id());
  EXPECT_EQ(live, (std::vector<std::string>{"d0", "p0", "p1"}));
  clock_.Advance(absl::Seconds(10));
  EXPECT_TRUE(registry_->ListLive("m").empty());
  EXPECT_EQ(registry_->List().size(), 4u);  // not swept yet
  EXPECT_EQ(registry_->RecordPlacement("d0", 100, 1, 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, TiesAreBrokenByTheSeededRandomChoice) {
  auto picks = [&](uint64_t seed) {
    std::unique_ptr<WorkerRegistry> registry = Make(seed);
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(registry->Register(Prefill(absl::StrCat("p", i))).ok());
    }
    std::vector<std::string> out;
    for (int i = 0; i < 32; ++i) {
      // input_tokens 0 keeps every worker tied.
      out.push_back(registry->PickPrefill("m", 0)->info.worker_id());
    }
    return out;
  };
  const std::vector<std::string> a = picks(7);
  EXPECT_EQ(a, picks(7));  // reproducible
  EXPECT_NE(a, picks(8));  // and the seed matters
  const std::set<std::string> distinct(a.begin(), a.end());
  EXPECT_GE(distinct.size(), 6u) << "ties should spread over the tied workers";
}

TEST_F(WorkerRegistryTest, ConcurrentUseIsSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      const std::string id = absl::StrCat("d", t);
      ASSERT_TRUE(registry_->Register(Decode(id)).ok());
      for (uint64_t i = 1; i <= 200; ++i) {
        LoadReport r = Load(id, 100, i);
        r.set_free_kv_blocks(1000 - i);
        registry_->ReportLoad(r);
        KvEventBatch b = Batch(id, 100, i);
        AddEvent(&b, KvEvent::KIND_STORED, {i});
        EXPECT_TRUE(registry_->PublishKvEvents(b).ok());
        EXPECT_TRUE(registry_->PickDecode("m", 1).ok());
        registry_->PrefixOverlap(id, std::vector<uint64_t>{1, 2, 3});
        registry_->Sweep();
        registry_->List();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const WorkerSnapshot& s : registry_->List()) EXPECT_EQ(s.cached_blocks, 200);
}

// The whole service over a real gRPC channel with the generated stub.
TEST_F(WorkerRegistryTest, ServesTheGrpcService) {
  WorkerRegistryService service(registry_.get());
  GrpcServerOptions server_options;
  server_options.services = {&service};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = internal::v1::WorkerRegistry::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));
  auto context = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return c;
  };

  // Register two workers.
  internal::v1::RegisterRequest reg;
  *reg.mutable_worker() = Prefill("p0");
  internal::v1::RegisterResponse reg_response;
  ASSERT_TRUE(stub->Register(context().get(), reg, &reg_response).ok());
  *reg.mutable_worker() = Decode("d0");
  ASSERT_TRUE(stub->Register(context().get(), reg, &reg_response).ok());
  EXPECT_EQ(reg_response.heartbeat_interval_ms(), 1000u);
  EXPECT_EQ(reg_response.missed_heartbeats_allowed(), 3u);
  ASSERT_EQ(reg_response.peers_size(), 1);
  EXPECT_EQ(reg_response.peers(0).worker_id(), "p0");
  // Invalid arguments travel as INVALID_ARGUMENT with the field named.
  reg.mutable_worker()->set_role(internal::v1::WORKER_ROLE_UNSPECIFIED);
  grpc::Status bad = stub->Register(context().get(), reg, &reg_response);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(bad.error_message(), "worker.role: ")) << bad.error_message();
  // A different seed: FAILED_PRECONDITION.
  *reg.mutable_worker() = Decode("d1");
  reg.mutable_worker()->set_block_hash_seed(1);
  EXPECT_EQ(stub->Register(context().get(), reg, &reg_response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // Report load.
  LoadReport load = Load("d0", 100, 1);
  load.set_free_kv_blocks(640);
  internal::v1::LoadReportResponse load_response;
  ASSERT_TRUE(stub->ReportLoad(context().get(), load, &load_response).ok());
  EXPECT_TRUE(load_response.known());
  load = Load("p0", 100, 1);
  load.set_queued_input_tokens(10);
  ASSERT_TRUE(stub->ReportLoad(context().get(), load, &load_response).ok());
  EXPECT_TRUE(load_response.known());
  ASSERT_TRUE(stub->ReportLoad(context().get(), Load("ghost", 1, 1), &load_response).ok());
  EXPECT_FALSE(load_response.known());
  EXPECT_EQ(registry_->Get("d0")->load.free_kv_blocks(), 640u);

  // KV events with a gap.
  KvEventBatch batch = Batch("p0", 100, 1);
  AddEvent(&batch, KvEvent::KIND_STORED, {7, 8, 9});
  internal::v1::KvEventAck ack;
  ASSERT_TRUE(stub->PublishKvEvents(context().get(), batch, &ack).ok());
  EXPECT_FALSE(ack.resync());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{7, 8, 9}), 3);
  batch = Batch("p0", 100, 3);
  AddEvent(&batch, KvEvent::KIND_STORED, {10});
  ASSERT_TRUE(stub->PublishKvEvents(context().get(), batch, &ack).ok());
  EXPECT_TRUE(ack.resync());
  batch = Batch("p0", 100, 4);
  AddEvent(&batch, KvEvent::KIND_ALL_CLEARED, {});
  AddEvent(&batch, KvEvent::KIND_STORED, {7, 8});
  ASSERT_TRUE(stub->PublishKvEvents(context().get(), batch, &ack).ok());
  EXPECT_FALSE(ack.resync());
  EXPECT_EQ(registry_->PrefixOverlap("p0", std::vector<uint64_t>{7, 8, 9}), 2);
  EXPECT_EQ(stub->PublishKvEvents(context().get(), Batch("ghost", 1, 1), &ack).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // Selection, then expire the prefill worker by advancing the fake clock (d0 keeps reporting).
  EXPECT_EQ(registry_->PickPrefill("m", 100)->info.worker_id(), "p0");
  EXPECT_EQ(registry_->PickDecode("m", 40)->info.worker_id(), "d0");
  clock_.Advance(absl::Seconds(2));
  load = Load("d0", 100, 2);
  load.set_free_kv_blocks(600);
  ASSERT_TRUE(stub->ReportLoad(context().get(), load, &load_response).ok());
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_->Sweep(), 1);
  EXPECT_EQ(registry_->PickPrefill("m", 100).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry_->PickDecode("m", 40)->info.worker_id(), "d0");
  ASSERT_TRUE(stub->ReportLoad(context().get(), Load("p0", 100, 2), &load_response).ok());
  EXPECT_FALSE(load_response.known());  // told to register again

  // Deregister over the wire.
  internal::v1::DeregisterRequest dereg;
  dereg.set_worker_id("d0");
  dereg.set_incarnation(100);
  internal::v1::DeregisterResponse dereg_response;
  ASSERT_TRUE(stub->Deregister(context().get(), dereg, &dereg_response).ok());
  EXPECT_TRUE(registry_->List().empty());
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace deepinfer::router
