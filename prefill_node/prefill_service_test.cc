// PrefillService over a real gRPC channel, in one process: a prefill WorkerRuntime (loopback KV
// backend, standalone) serves it; a decode-side LlmEngine whose pools come from a second
// loopback agent reserves the destination blocks, receives the layer-wise writes and their
// notifications, and continues the generation. Greedy outputs must equal the single-engine
// reference; invalid fields, cancellation and deadlines must leave no block in use.
#include "prefill_node/prefill_service.h"

#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fake_clock.h"
#include "engine/generate.h"
#include "engine/llm_engine.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kv_transfer/agent_factory.h"
#include "kv_transfer/notification_tracker.h"
#include "kv_transfer/transfer_agent.h"
#include "node/worker_runtime.h"
#include "proto/deepinfer/internal/v1/prefill.grpc.pb.h"

namespace deepinfer::prefill_node {
namespace {

using internal::v1::PrefillRequest;
using internal::v1::PrefillResponse;

constexpr int kBlockSize = 4;
constexpr int kPrefillBlocks = 64;
constexpr int kDecodeBlocks = 48;
constexpr char kModel[] = "engine/testdata/models/llama";

class PrefillServiceTest : public ::testing::Test {
 protected:
  virtual PrefillServiceOptions ServiceOptions() { return {}; }
  virtual void AdjustWorker(node::WorkerOptions* /*options*/) {}

  void SetUp() override {
    node::WorkerOptions o;
    o.role = internal::v1::WORKER_ROLE_PREFILL;
    o.worker_id = "prefill-0";
    o.model_path = kModel;
    o.kv_blocks = kPrefillBlocks;
    o.block_size = kBlockSize;
    o.threads = 2;
    o.kv_backend = kv_transfer::Backend::kLoopback;
    AdjustWorker(&o);
    auto rt = node::WorkerRuntime::Create(o);
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(*rt);
    service_ = std::make_unique<PrefillService>(runtime_.get(), ServiceOptions());
    ASSERT_TRUE(runtime_
                    ->Start({service_.get()}, {PrefillService::ServiceName()},
                            service_->stats_contributor())
                    .ok());
    stub_ = internal::v1::Prefill::NewStub(
        grpc::CreateChannel(runtime_->address(), grpc::InsecureChannelCredentials()));

    // The decode side: its own model, agent and engine.
    auto model = engine::Model::Load(kModel, engine::ModelOptions{2});
    ASSERT_TRUE(model.ok()) << model.status();
    decode_model_ = std::move(*model);
    kv_transfer::AgentConfig config;
    config.name = "decode-0";
    config.incarnation = 7;
    config.backend = kv_transfer::Backend::kLoopback;
    auto agent = kv_transfer::CreateTransferAgent(config);
    ASSERT_TRUE(agent.ok()) << agent.status();
    decode_agent_ = std::move(*agent);
    ASSERT_TRUE(decode_agent_->Start().ok());
    engine::EngineOptions eo;
    eo.num_blocks = kDecodeBlocks;
    eo.block_size = kBlockSize;
    eo.kv_memory = [this](size_t bytes) -> absl::StatusOr<std::pair<void*, void*>> {
      auto k = decode_agent_->AllocateMemory(bytes, kv_transfer::MemoryKind::kHost);
      if (!k.ok()) return k.status();
      auto v = decode_agent_->AllocateMemory(bytes, kv_transfer::MemoryKind::kHost);
      if (!v.ok()) return v.status();
      decode_pool_.set_k_region(k->region);
      decode_pool_.set_v_region(v->region);
      return std::make_pair(k->base, v->base);
    };
    auto e = engine::LlmEngine::Create(decode_model_.get(), eo);
    ASSERT_TRUE(e.ok()) << e.status();
    decode_ = std::move(*e);
    ASSERT_TRUE(decode_->Start().ok());
    decode_pool_.set_num_layers(decode_model_->config().num_layers);
    decode_pool_.set_num_blocks(kDecodeBlocks);
    decode_pool_.set_block_bytes(decode_->kv_cache()->block_bytes());
    auto blob = decode_agent_->ExportMetadata();
    ASSERT_TRUE(blob.ok());
    decode_metadata_.set_version(1);
    decode_metadata_.set_agent_name("decode-0");
    decode_metadata_.set_incarnation(7);
    decode_metadata_.set_backend("loopback");
    decode_metadata_.set_blob(*blob);
  }

  void TearDown() override {
    if (runtime_ != nullptr) runtime_->Drain(absl::Seconds(1));
    service_.reset();
    if (decode_ != nullptr) decode_->Stop();
  }

  // A request whose destination is `block_ids` on the decode node.
  PrefillRequest MakeRequest(const std::string& id, const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& block_ids, int skip_blocks,
                             uint64_t tag) const {
    PrefillRequest r;
    r.set_request_id(id);
    for (int32_t t : prompt) r.add_prompt_token_ids(static_cast<uint32_t>(t));
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_tokens(10);
    r.mutable_sampling()->set_ignore_eos(true);
    internal::v1::KvDestination* d = r.mutable_destination();
    d->set_agent_name("decode-0");
    d->set_incarnation(7);
    for (int32_t b : block_ids) d->add_block_ids(static_cast<uint32_t>(b));
    d->set_block_size(kBlockSize);
    d->set_skip_blocks(static_cast<uint32_t>(skip_blocks));
    d->set_notification_tag(tag);
    *d->mutable_metadata() = decode_metadata_;
    *d->mutable_pool() = decode_pool_;
    return r;
  }

  grpc::Status CallPrefill(const PrefillRequest& request, PrefillResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->Prefill(&context, request, response);
  }

  grpc::Status CallCancel(const std::string& id, bool* quiesced) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    internal::v1::CancelPrefillRequest request;
    request.set_request_id(id);
    internal::v1::CancelPrefillResponse response;
    grpc::Status s = stub_->Cancel(&context, request, &response);
    *quiesced = response.quiesced();
    return s;
  }

  // Waits until every block the engine referenced is released.
  static int64_t UsedBlocksAfterSettling(engine::LlmEngine* engine) {
    engine::EngineStats s;
    for (int i = 0; i < 400; ++i) {
      s = engine->GetStats();
      if (s.blocks.used_blocks == 0) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return s.blocks.used_blocks;
  }

  std::unique_ptr<node::WorkerRuntime> runtime_;
  std::unique_ptr<PrefillService> service_;
  std::unique_ptr<internal::v1::Prefill::Stub> stub_;
  std::unique_ptr<engine::Model> decode_model_;
  std::unique_ptr<kv_transfer::TransferAgent> decode_agent_;
  std::unique_ptr<engine::LlmEngine> decode_;
  internal::v1::KvPoolLayout decode_pool_;
  internal::v1::KvPeerMetadata decode_metadata_;
};

TEST_F(PrefillServiceTest, PrefillIntoDecodeReservationGivesReferenceOutputs) {
  const std::vector<std::vector<int32_t>> prompts = {
      {760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44}, {760, 39, 68, 410, 78, 311, 268, 624, 7}};
  int64_t decode_cached = 0;
  int64_t prefill_cached = 0;
  uint64_t tag = 100;
  kv_transfer::NotificationTracker tracker;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = 10;
      sp.ignore_eos = true;
      auto ref = engine::GenerateOne(*decode_model_, prompts[i], sp, engine::GenerateOptions());
      ASSERT_TRUE(ref.ok()) << ref.status();
      std::vector<int32_t> want;
      for (const auto& s : ref->steps) want.push_back(s.token);

      const std::string id = absl::StrCat("r", round, "-", i);
      engine::EngineRequest req;
      req.request_id = id;
      req.prompt = prompts[i];
      req.sampling = sp;
      std::promise<void> finished;
      std::vector<int32_t> got;
      auto reservation =
          decode_->ReserveForRemotePrefill(req, [&](const engine::EngineOutput& o) {
            for (const auto& s : o.new_tokens) got.push_back(s.token);
            if (o.finished) finished.set_value();
          });
      ASSERT_TRUE(reservation.ok()) << reservation.status();
      decode_cached += reservation->cached_tokens;
      const int skip = static_cast<int>(reservation->cached_tokens / kBlockSize);

      ++tag;
      PrefillResponse response;
      grpc::Status s =
          CallPrefill(MakeRequest(id, prompts[i], reservation->block_ids, skip, tag), &response);
      ASSERT_TRUE(s.ok()) << s.error_message();
      prefill_cached += response.cached_prompt_tokens();
      const uint64_t written = reservation->block_ids.size() - skip;
      EXPECT_EQ(response.transferred_bytes(),
                2 * written * decode_pool_.num_layers() * decode_pool_.block_bytes());
      EXPECT_EQ(response.first_token_logprob().token_id(), response.first_token_id());

      // Every layer's notification has landed (they are sent only after the data).
      bool complete = false;
      while (!complete) {
        ASSERT_TRUE(decode_agent_->WaitForNotifications(absl::Now() + absl::Seconds(10)));
        for (auto& note : decode_agent_->DrainNotifications()) {
          EXPECT_EQ(note.sender, "prefill-0");
          kv_transfer::NotificationTracker::Completed c;
          absl::StatusOr<bool> all = tracker.Add(std::move(note), &c);
          ASSERT_TRUE(all.ok()) << all.status();
          if (*all) {
            EXPECT_EQ(c.request_id, tag);
            complete = true;
          }
        }
      }
      ASSERT_TRUE(decode_
                      ->CompleteRemotePrefill(id, {static_cast<int32_t>(response.first_token_id()),
                                                   response.first_token_logprob().logprob(),
                                                   {}})
                      .ok());
      finished.get_future().wait();
      EXPECT_EQ(got, want) << id;
    }
  }
  EXPECT_GT(decode_cached, 0);   // round 2: the decode node's own cache, blocks skipped
  EXPECT_GT(prefill_cached, 0);  // round 2: the prefill node's prefix cache
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(UsedBlocksAfterSettling(decode_.get()), 0);
  const internal::v1::WorkerStats stats = runtime_->Stats();
  EXPECT_EQ(stats.requests_ok(), 4u);
  EXPECT_EQ(stats.requests_failed(), 0u);
  EXPECT_EQ(stats.in_flight_transfers(), 0u);
  EXPECT_GT(stats.transfer_bytes_written(), 0u);
  EXPECT_EQ(runtime_->agent()->counters().handles, 0);
}

TEST_F(PrefillServiceTest, StaleDestinationIncarnationIsAborted) {
  const std::vector<int32_t> prompt = {760, 39, 68, 410, 78, 311, 268, 624, 5};
  PrefillResponse response;
  // Meets decode-0 at incarnation 7 (blocks 0..2 are not in use on the decode engine here).
  grpc::Status s = CallPrefill(MakeRequest("fresh", prompt, {0, 1, 2}, 0, 1), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  PrefillRequest stale = MakeRequest("stale", prompt, {0, 1, 2}, 0, 2);
  stale.mutable_destination()->set_incarnation(6);
  stale.mutable_destination()->mutable_metadata()->set_incarnation(6);
  s = CallPrefill(stale, &response);
  EXPECT_EQ(s.error_code(), grpc::ABORTED) << s.error_message();
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "destination.incarnation:")) << s.error_message();
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(runtime_->agent()->counters().handles, 0);
}

TEST_F(PrefillServiceTest, PrefillWithoutDestinationOnlyComputes) {
  PrefillRequest r = MakeRequest("measure", {760, 39, 68, 410, 78}, {}, 0, 1);
  r.clear_destination();
  PrefillResponse response;
  grpc::Status s = CallPrefill(r, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.transferred_bytes(), 0u);
  EXPECT_LT(response.first_token_id(), 768u);
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
}

TEST_F(PrefillServiceTest, InvalidFieldsAreNamed) {
  const std::vector<int32_t> prompt = {760, 39, 68, 410, 78, 311, 268, 624, 5};  // 3 blocks
  const PrefillRequest base = MakeRequest("bad", prompt, {0, 1, 2}, 0, 1);
  struct Case {
    const char* field;
    grpc::StatusCode code;
    std::function<void(PrefillRequest*)> mutate;
  };
  const std::vector<Case> cases = {
      {"request_id:", grpc::INVALID_ARGUMENT, [](PrefillRequest* r) { r->clear_request_id(); }},
      {"prompt_token_ids:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->clear_prompt_token_ids(); }},
      {"prompt_token_ids[2]:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->set_prompt_token_ids(2, 900); }},
      {"images:", grpc::INVALID_ARGUMENT, [](PrefillRequest* r) { r->add_images(); }},
      {"sampling.temperature", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->mutable_sampling()->set_temperature(-1); }},
      {"destination.block_size:", grpc::FAILED_PRECONDITION,
       [](PrefillRequest* r) { r->mutable_destination()->set_block_size(8); }},
      {"destination.block_ids:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->mutable_destination()->add_block_ids(3); }},
      {"destination.skip_blocks:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->mutable_destination()->set_skip_blocks(4); }},
      {"destination.block_ids[1]:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->mutable_destination()->set_block_ids(1, kDecodeBlocks); }},
      {"destination.metadata.agent_name:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) {
         r->mutable_destination()->mutable_metadata()->set_agent_name("decode-9");
       }},
      {"destination.metadata.incarnation:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->mutable_destination()->mutable_metadata()->set_incarnation(8); }},
      {"destination.pool.num_layers:", grpc::INVALID_ARGUMENT,
       [](PrefillRequest* r) { r->mutable_destination()->mutable_pool()->set_num_layers(0); }},
      {"destination.pool.block_bytes:", grpc::FAILED_PRECONDITION,
       [](PrefillRequest* r) {
         r->mutable_destination()->mutable_pool()->set_block_bytes(
             r->destination().pool().block_bytes() * 2);
       }},
      {"deadline_unix_us:", grpc::DEADLINE_EXCEEDED,
       [](PrefillRequest* r) { r->set_deadline_unix_us(absl::ToUnixMicros(absl::Now()) - 1); }},
  };
  for (const Case& c : cases) {
    PrefillRequest r = base;
    c.mutate(&r);
    PrefillResponse response;
    grpc::Status s = CallPrefill(r, &response);
    EXPECT_EQ(s.error_code(), c.code) << c.field << ": " << s.error_message();
    EXPECT_TRUE(absl::StartsWith(s.error_message(), c.field))
        << "want prefix " << c.field << ", got " << s.error_message();
  }
  EXPECT_EQ(runtime_->Stats().requests_failed(), cases.size());
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(decode_agent_->counters().notifications_received, 0u);
}

TEST_F(PrefillServiceTest, CancelBeforeArrivalRefusesTheLatePrefill) {
  bool quiesced = false;
  grpc::Status s = CallCancel("late", &quiesced);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(quiesced);
  PrefillResponse response;
  s = CallPrefill(MakeRequest("late", {760, 39, 68}, {0}, 0, 1), &response);
  EXPECT_EQ(s.error_code(), grpc::CANCELLED) << s.error_message();
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(decode_agent_->counters().notifications_received, 0u);
  EXPECT_EQ(runtime_->Stats().requests_cancelled(), 1u);
}

// The prefill engine's KV is taken by a reservation that never completes, so a Prefill waits in
// the engine's queue; Cancel and deadlines must end it there.
TEST_F(PrefillServiceTest, CancelAndDeadlineWhilePrefillingLeaveNoBlockInUse) {
  engine::EngineRequest hog;
  hog.request_id = "hog";
  hog.prompt.assign((kPrefillBlocks - 1) * kBlockSize, 5);
  hog.sampling.max_tokens = 1;
  auto held = runtime_->engine()->ReserveForRemotePrefill(hog, [](const engine::EngineOutput&) {});
  ASSERT_TRUE(held.ok()) << held.status();

  const std::vector<int32_t> prompt = {760, 39, 68, 410, 78, 311, 268, 624, 5};
  auto pending = std::async(std::launch::async, [&] {
    PrefillResponse response;
    return CallPrefill(MakeRequest("c1", prompt, {0, 1, 2}, 0, 1), &response);
  });
  // Queued in the engine.
  for (int i = 0; i < 400 && runtime_->engine()->GetStats().waiting == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(runtime_->engine()->GetStats().waiting, 1);
  {
    PrefillResponse response;
    grpc::Status dup = CallPrefill(MakeRequest("c1", prompt, {0, 1, 2}, 0, 1), &response);
    EXPECT_EQ(dup.error_code(), grpc::ALREADY_EXISTS) << dup.error_message();
  }
  bool quiesced = false;
  grpc::Status s = CallCancel("c1", &quiesced);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(quiesced);
  grpc::Status outcome = pending.get();
  EXPECT_EQ(outcome.error_code(), grpc::CANCELLED) << outcome.error_message();

  // A deadline while queued.
  PrefillRequest timed = MakeRequest("d1", prompt, {0, 1, 2}, 0, 2);
  timed.set_deadline_unix_us(absl::ToUnixMicros(absl::Now() + absl::Milliseconds(200)));
  PrefillResponse response;
  s = CallPrefill(timed, &response);
  EXPECT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED) << s.error_message();

  ASSERT_TRUE(runtime_->engine()->FailRemotePrefill("hog", absl::CancelledError("test")).ok());
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(runtime_->engine()->GetStats().waiting, 0);
  EXPECT_EQ(decode_agent_->counters().notifications_received, 0u);
  const internal::v1::WorkerStats stats = runtime_->Stats();
  EXPECT_EQ(stats.requests_cancelled(), 1u);
  EXPECT_EQ(stats.requests_failed(), 2u);  // the duplicate and the deadline
}

TEST_F(PrefillServiceTest, DrainingRefusesNewPrefills) {
  runtime_->Drain(absl::Seconds(1));
  // The server is gone after the drain; the refusal is the runtime's RequestScope.
  node::WorkerRuntime::RequestScope scope(runtime_.get());
  EXPECT_EQ(scope.status().code(), absl::StatusCode::kUnavailable);
  PrefillResponse response;
  grpc::ServerContext* no_context = nullptr;
  PrefillRequest r = MakeRequest("after-drain", {760, 39, 68}, {0}, 0, 1);
  grpc::Status s = service_->Prefill(no_context, &r, &response);
  EXPECT_EQ(s.error_code(), grpc::UNAVAILABLE) << s.error_message();
}

// The service judges deadlines and measures durations by its injected clock.
class PrefillServiceClockTest : public PrefillServiceTest {
 protected:
  PrefillServiceOptions ServiceOptions() override {
    PrefillServiceOptions o;
    o.clock = clock_.AsFunction();
    o.cancel_memory = absl::Seconds(60);
    return o;
  }

  // Prefills `id` without a destination (no transfer: the transfer agent keeps the real clock).
  grpc::Status Measure(const std::string& id, absl::Time deadline, PrefillResponse* response) {
    PrefillRequest r = MakeRequest(id, {760, 39, 68, 410, 78}, {}, 0, 1);
    r.clear_destination();
    r.set_deadline_unix_us(absl::ToUnixMicros(deadline));
    return CallPrefill(r, response);
  }

  FakeClock clock_;
};

TEST_F(PrefillServiceClockTest, DeadlineAndComputeTimeComeFromTheClock) {
  // The fake clock is years behind the wall clock: this deadline is long past in real time, but
  // a second ahead by the service's clock.
  PrefillResponse response;
  grpc::Status s = Measure("on-time", clock_.Now() + absl::Seconds(1), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_LT(response.first_token_id(), 768u);
  // The clock did not move while the engine computed.
  EXPECT_EQ(response.compute_us(), 0u);
  EXPECT_EQ(response.transfer_us(), 0u);

  clock_.Advance(absl::Seconds(1));
  s = Measure("late", clock_.Now(), &response);
  EXPECT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "deadline_unix_us: already passed on arrival"))
      << s.error_message();
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
}

TEST_F(PrefillServiceClockTest, EarlyCancelIsForgottenAfterCancelMemoryByTheClock) {
  bool quiesced = false;
  ASSERT_TRUE(CallCancel("early", &quiesced).ok());
  const absl::Time deadline = clock_.Now() + absl::Hours(1);
  PrefillResponse response;
  clock_.Advance(absl::Seconds(59));
  grpc::Status s = Measure("early", deadline, &response);
  EXPECT_EQ(s.error_code(), grpc::CANCELLED) << s.error_message();
  clock_.Advance(absl::Seconds(1));  // exactly cancel_memory after the Cancel
  s = Measure("early", deadline, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(runtime_->Stats().requests_cancelled(), 1u);
  EXPECT_EQ(runtime_->Stats().requests_ok(), 1u);
}

// Wraps the prefill runtime's agent: records every write post (its layer, whether it carries a
// notification, and whether the prefill engine's last layer had been written yet) and delays
// completions: a post is reported in progress for its first `kHeldPolls` Poll/Wait answers after
// the inner agent finished it, so later chunks are posted while earlier ones of the same layer
// are still "in flight". Checks that a notification is only posted once every earlier post of its
// layer was reported done.
class RecordingAgent final : public kv_transfer::TransferAgent {
 public:
  static constexpr int kHeldPolls = 3;
  struct PostEvent {
    int layer = -1;
    size_t blocks = 0;  // K and V blocks written (0: a notification alone)
    bool notification = false;
    bool last_layer_written = false;  // the engine's last layer differed from before the request
  };

  RecordingAgent(kv_transfer::TransferAgent* inner, const engine::KvCache* cache,
                 const internal::v1::KvPoolLayout& layout)
      : inner_(inner), cache_(cache), layout_(layout) {}

  // Remembers the prefill engine's last layer (K) as it is now.
  void SnapshotLastLayer() {
    absl::MutexLock lock(&mu_);
    snapshot_ = LastLayer();
  }
  std::vector<PostEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  // The `n`th post from now on (1-based) is refused with kUnavailable (peer gone); 0: none.
  void RefusePost(int n) {
    absl::MutexLock lock(&mu_);
    refuse_in_ = n;
  }
  // From now on posts stay in progress (to Poll and Wait) until cancelled: a transfer that
  // never completes on its own.
  void HoldUntilCancelled() {
    absl::MutexLock lock(&mu_);
    hold_ = true;
  }
  // Runs `fn` (which must not block) at the `n`th post from now on (1-based).
  void AtPost(int n, std::function<void()> fn) {
    absl::MutexLock lock(&mu_);
    at_post_in_ = n;
    at_post_ = std::move(fn);
  }
  std::vector<std::string> violations() {
    absl::MutexLock lock(&mu_);
    return violations_;
  }

  absl::string_view name() const override { return inner_->name(); }
  uint64_t incarnation() const override { return inner_->incarnation(); }
  kv_transfer::Backend backend() const override { return inner_->backend(); }
  absl::Status SupportsMemoryKind(kv_transfer::MemoryKind kind) const override {
    return inner_->SupportsMemoryKind(kind);
  }
  absl::Status Start() override { return inner_->Start(); }
  void Stop() override { inner_->Stop(); }
  absl::StatusOr<kv_transfer::RegionId> RegisterMemory(void* base, size_t length,
                                                       kv_transfer::MemoryKind kind) override {
    return inner_->RegisterMemory(base, length, kind);
  }
  absl::StatusOr<kv_transfer::AllocatedRegion> AllocateMemory(
      size_t length, kv_transfer::MemoryKind kind) override {
    return inner_->AllocateMemory(length, kind);
  }
  absl::Status DeregisterMemory(kv_transfer::RegionId region) override {
    return inner_->DeregisterMemory(region);
  }
  absl::StatusOr<std::string> ExportMetadata() const override { return inner_->ExportMetadata(); }
  absl::StatusOr<std::string> ImportPeer(absl::string_view metadata) override {
    return inner_->ImportPeer(metadata);
  }
  absl::Status ForgetPeer(absl::string_view peer) override { return inner_->ForgetPeer(peer); }
  absl::StatusOr<kv_transfer::DescListId> PrepareLocalDescriptors(
      absl::Span<const kv_transfer::BlockDesc> blocks) override {
    return inner_->PrepareLocalDescriptors(blocks);
  }
  absl::StatusOr<kv_transfer::DescListId> PrepareRemoteDescriptors(
      absl::string_view peer, absl::Span<const kv_transfer::BlockDesc> blocks) override {
    return inner_->PrepareRemoteDescriptors(peer, blocks);
  }
  absl::Status ReleaseDescriptors(kv_transfer::DescListId list) override {
    return inner_->ReleaseDescriptors(list);
  }
  absl::StatusOr<kv_transfer::HandleId> CreateHandle(kv_transfer::DescListId local,
                                                     kv_transfer::DescListId remote) override {
    return inner_->CreateHandle(local, remote);
  }
  absl::Status ReleaseHandle(kv_transfer::HandleId handle) override {
    return inner_->ReleaseHandle(handle);
  }
  absl::Status Post(kv_transfer::HandleId handle, kv_transfer::TransferOp op,
                    absl::Span<const uint32_t> local_indices,
                    absl::Span<const uint32_t> remote_indices,
                    const kv_transfer::Notification* notification, absl::Time deadline) override {
    {
      absl::MutexLock lock(&mu_);
      if (refuse_in_ > 0 && --refuse_in_ == 0) {
        return absl::UnavailableError("recording agent: peer refused (test)");
      }
      if (at_post_in_ > 0 && --at_post_in_ == 0) at_post_();
      PostEvent e;
      e.blocks = local_indices.size();
      e.notification = notification != nullptr;
      if (!local_indices.empty()) {
        e.layer = static_cast<int>((local_indices[0] / layout_.num_blocks()) %
                                   layout_.num_layers());
      } else if (notification != nullptr) {
        e.layer = static_cast<int>(notification->seq);
      }
      e.last_layer_written = LastLayer() != snapshot_;
      if (e.notification) {
        for (kv_transfer::HandleId h : data_[e.layer]) {
          if (polls_[h] <= kHeldPolls) {
            violations_.push_back(absl::StrCat("layer ", e.layer, "'s notification posted before "
                                               "its earlier post ", h, " was reported done"));
          }
        }
      }
      if (!local_indices.empty()) data_[e.layer].push_back(handle);
      polls_[handle] = 0;
      events_.push_back(e);
    }
    return inner_->Post(handle, op, local_indices, remote_indices, notification, deadline);
  }
  absl::StatusOr<kv_transfer::TransferStatus> Poll(kv_transfer::HandleId handle) override {
    return Hold(handle, inner_->Poll(handle));
  }
  absl::StatusOr<kv_transfer::TransferStatus> Wait(kv_transfer::HandleId handle,
                                                   absl::Time wait_deadline) override {
    absl::StatusOr<kv_transfer::TransferStatus> st = Hold(handle, inner_->Wait(handle,
                                                                               wait_deadline));
    if (st.ok() && !st->terminal()) absl::SleepFor(wait_deadline - absl::Now());
    return st;
  }
  absl::Status Cancel(kv_transfer::HandleId handle) override {
    {
      absl::MutexLock lock(&mu_);
      cancelled_.insert(handle);
    }
    return inner_->Cancel(handle);
  }
  std::vector<kv_transfer::Notification> DrainNotifications(size_t max) override {
    return inner_->DrainNotifications(max);
  }
  bool WaitForNotifications(absl::Time deadline) override {
    return inner_->WaitForNotifications(deadline);
  }
  kv_transfer::AgentCounters counters() const override { return inner_->counters(); }

 private:
  std::string LastLayer() const {
    const size_t bytes = cache_->block_bytes() * cache_->config().num_blocks;
    const char* base = static_cast<const char*>(cache_->k_layer(cache_->config().num_layers - 1));
    return std::string(base, bytes);
  }
  absl::StatusOr<kv_transfer::TransferStatus> Hold(
      kv_transfer::HandleId handle, absl::StatusOr<kv_transfer::TransferStatus> st) {
    if (!st.ok() || !st->terminal() || st->state != kv_transfer::TransferState::kDone) return st;
    absl::MutexLock lock(&mu_);
    if (hold_) {
      if (!cancelled_.contains(handle)) {
        return kv_transfer::TransferStatus{kv_transfer::TransferState::kInProgress,
                                           absl::OkStatus()};
      }
      return kv_transfer::TransferStatus{kv_transfer::TransferState::kFailed,
                                         absl::CancelledError("cancelled (test)")};
    }
    int& polls = polls_[handle];
    if (++polls <= kHeldPolls) return kv_transfer::TransferStatus{
        kv_transfer::TransferState::kInProgress, absl::OkStatus()};
    return st;
  }

  kv_transfer::TransferAgent* const inner_;
  const engine::KvCache* const cache_;
  const internal::v1::KvPoolLayout layout_;
  absl::Mutex mu_;
  std::string snapshot_ ABSL_GUARDED_BY(mu_);
  std::vector<PostEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::vector<kv_transfer::HandleId>> data_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<kv_transfer::HandleId, int> polls_ ABSL_GUARDED_BY(mu_);
  int refuse_in_ ABSL_GUARDED_BY(mu_) = 0;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<kv_transfer::HandleId> cancelled_ ABSL_GUARDED_BY(mu_);
  int at_post_in_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> at_post_ ABSL_GUARDED_BY(mu_);
};

// Chunked prefills (6-token steps over 4-token blocks, prompts ending mid-block) through the
// recording agent.
class PrefillServiceStreamTest : public PrefillServiceTest {
 protected:
  void AdjustWorker(node::WorkerOptions* options) override { options->max_batch_tokens = 6; }
  PrefillServiceOptions ServiceOptions() override {
    recorder_ = std::make_unique<RecordingAgent>(runtime_->agent(), runtime_->engine()->kv_cache(),
                                                 runtime_->pool_layout());
    PrefillServiceOptions o;
    o.agent = recorder_.get();
    return o;
  }
  void TearDown() override {
    PrefillServiceTest::TearDown();
    recorder_.reset();
  }

  std::unique_ptr<RecordingAgent> recorder_;
};

TEST_F(PrefillServiceStreamTest, FirstLayerIsPostedBeforeTheLastLayerIsComputed) {
  // The second prompt shares the first's first 12 tokens (three blocks): both nodes serve them
  // from their prefix caches.
  const std::vector<std::vector<int32_t>> prompts = {
      {760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44, 31, 17, 200, 301, 402, 503, 604, 705, 22,
       23, 24, 25},
      {760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44, 31, 99, 98, 97, 96, 95, 94, 93}};
  const int layers = decode_model_->config().num_layers;
  ASSERT_GE(layers, 2);
  kv_transfer::NotificationTracker tracker;
  uint64_t tag = 500;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = 10;
    sp.ignore_eos = true;
    auto ref = engine::GenerateOne(*decode_model_, prompts[i], sp, engine::GenerateOptions());
    ASSERT_TRUE(ref.ok()) << ref.status();
    std::vector<int32_t> want;
    for (const auto& step : ref->steps) want.push_back(step.token);

    const std::string id = absl::StrCat("stream-", i);
    engine::EngineRequest req;
    req.request_id = id;
    req.prompt = prompts[i];
    req.sampling = sp;
    std::promise<void> finished;
    std::vector<int32_t> got;
    auto reservation = decode_->ReserveForRemotePrefill(req, [&](const engine::EngineOutput& o) {
      for (const auto& step : o.new_tokens) got.push_back(step.token);
      if (o.finished) finished.set_value();
    });
    ASSERT_TRUE(reservation.ok()) << reservation.status();
    const int skip = static_cast<int>(reservation->cached_tokens / kBlockSize);
    if (i == 1) {
      EXPECT_EQ(skip, 3);
    }

    recorder_->SnapshotLastLayer();
    const size_t events_before = recorder_->events().size();
    PrefillResponse response;
    grpc::Status s =
        CallPrefill(MakeRequest(id, prompts[i], reservation->block_ids, skip, ++tag), &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (i == 1) {
      EXPECT_EQ(response.cached_prompt_tokens(), 12u);
    }
    EXPECT_LE(response.transfer_exposed_us(), response.transfer_us());

    // The transport's order of events: layer 0's first write went out while the engine's last
    // layer still held what it held before the request (its KV not yet computed), and more than
    // one write per layer (chunk by chunk), each block exactly once, one notification per layer.
    std::vector<RecordingAgent::PostEvent> events = recorder_->events();
    events.erase(events.begin(), events.begin() + static_cast<ptrdiff_t>(events_before));
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.front().layer, 0);
    EXPECT_GT(events.front().blocks, 0u);
    EXPECT_FALSE(events.front().last_layer_written)
        << "the first write was posted only after the last layer was computed";
    EXPECT_TRUE(events.back().last_layer_written);
    std::vector<size_t> blocks(layers, 0), posts(layers, 0), notes(layers, 0);
    for (const auto& e : events) {
      ASSERT_GE(e.layer, 0);
      ASSERT_LT(e.layer, layers);
      blocks[e.layer] += e.blocks;
      if (e.blocks > 0) ++posts[e.layer];
      if (e.notification) ++notes[e.layer];
      // Earlier chunks of the layer were still reported in flight when its last blocks went:
      // the notification waited for them and went alone.
      if (e.notification) EXPECT_EQ(e.blocks, 0u) << "layer " << e.layer;
    }
    const size_t sent = reservation->block_ids.size() - skip;
    for (int l = 0; l < layers; ++l) {
      EXPECT_EQ(blocks[l], 2 * sent) << "layer " << l;  // K and V
      EXPECT_GT(posts[l], 1u) << "layer " << l;
      EXPECT_EQ(notes[l], 1u) << "layer " << l;
    }

    bool complete = false;
    while (!complete) {
      ASSERT_TRUE(decode_agent_->WaitForNotifications(absl::Now() + absl::Seconds(10)));
      for (auto& note : decode_agent_->DrainNotifications()) {
        kv_transfer::NotificationTracker::Completed c;
        absl::StatusOr<bool> all = tracker.Add(std::move(note), &c);
        ASSERT_TRUE(all.ok()) << all.status();
        if (*all) {
          EXPECT_EQ(c.request_id, tag);
          complete = true;
        }
      }
    }
    ASSERT_TRUE(decode_
                    ->CompleteRemotePrefill(id, {static_cast<int32_t>(response.first_token_id()),
                                                 response.first_token_logprob().logprob(),
                                                 {}})
                    .ok());
    finished.get_future().wait();
    EXPECT_EQ(got, want) << id;
  }
  EXPECT_TRUE(recorder_->violations().empty()) << recorder_->violations().front();
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(UsedBlocksAfterSettling(decode_.get()), 0);
  EXPECT_EQ(runtime_->agent()->counters().handles, 0);
}

// A write refused in the middle of the stream (after earlier layers' and chunks' writes went):
// the RPC fails with the transport's code, every earlier write is terminal before it returns, not
// every layer's notification was sent, and no block or handle is left behind.
TEST_F(PrefillServiceStreamTest, RefusedWriteMidStreamFailsCleanly) {
  const std::vector<int32_t> prompt = {760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44, 31, 17};
  engine::EngineRequest req;
  req.request_id = "refused";
  req.prompt = prompt;
  req.sampling.max_tokens = 4;
  auto reservation = decode_->ReserveForRemotePrefill(req, [](const engine::EngineOutput&) {});
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  recorder_->RefusePost(3);  // chunk 1: layers 0 and 1 go; chunk 2: layer 0 is refused
  PrefillResponse response;
  grpc::Status s =
      CallPrefill(MakeRequest("refused", prompt, reservation->block_ids, 0, 900), &response);
  EXPECT_EQ(s.error_code(), grpc::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(recorder_->events().size(), 2u);
  EXPECT_EQ(decode_agent_->counters().notifications_received, 0u);
  EXPECT_EQ(runtime_->agent()->counters().in_flight_handles, 0);
  EXPECT_EQ(runtime_->agent()->counters().handles, 0);
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(runtime_->Stats().requests_failed(), 1u);
  ASSERT_TRUE(decode_->FailRemotePrefill("refused", absl::UnavailableError("test")).ok());
  EXPECT_EQ(UsedBlocksAfterSettling(decode_.get()), 0);
}

// Cancel while layer writes are in flight (they never complete on their own here): the Prefill
// ends CANCELLED only once every posted write is terminal, Cancel reports quiesced, no layer's
// notification went, and nothing is left behind on either side.
TEST_F(PrefillServiceStreamTest, CancelWithWritesInFlightQuiescesFirst) {
  const std::vector<int32_t> prompt = {760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44, 31, 17};
  engine::EngineRequest req;
  req.request_id = "inflight";
  req.prompt = prompt;
  req.sampling.max_tokens = 4;
  auto reservation = decode_->ReserveForRemotePrefill(req, [](const engine::EngineOutput&) {});
  ASSERT_TRUE(reservation.ok()) << reservation.status();
  recorder_->HoldUntilCancelled();
  std::future<grpc::Status> cancel;
  bool quiesced = false;
  // At the second write (layer 1 of the first chunk), from the engine's thread: ask for the
  // cancel on another thread (the hook must not block).
  recorder_->AtPost(2, [&] {
    cancel = std::async(std::launch::async, [&] { return CallCancel("inflight", &quiesced); });
  });
  PrefillResponse response;
  grpc::Status s =
      CallPrefill(MakeRequest("inflight", prompt, reservation->block_ids, 0, 901), &response);
  EXPECT_EQ(s.error_code(), grpc::CANCELLED) << s.error_message();
  ASSERT_TRUE(cancel.valid());
  grpc::Status c = cancel.get();
  EXPECT_TRUE(c.ok()) << c.error_message();
  EXPECT_TRUE(quiesced);
  EXPECT_GE(recorder_->events().size(), 2u);
  EXPECT_EQ(decode_agent_->counters().notifications_received, 0u);
  EXPECT_EQ(runtime_->agent()->counters().handles, 0);
  EXPECT_EQ(UsedBlocksAfterSettling(runtime_->engine()), 0);
  EXPECT_EQ(runtime_->Stats().requests_cancelled(), 1u);
  ASSERT_TRUE(decode_->FailRemotePrefill("inflight", absl::CancelledError("test")).ok());
  EXPECT_EQ(UsedBlocksAfterSettling(decode_.get()), 0);
}

}  // namespace
}  // namespace deepinfer::prefill_node
