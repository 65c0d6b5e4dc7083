// PrefillService over a real gRPC channel, in one process: a prefill WorkerRuntime (loopback KV
// backend, standalone) serves it; a decode-side LlmEngine whose pools come from a second
// loopback agent reserves the destination blocks, receives the layer-wise writes and their
// notifications, and continues the generation. Greedy outputs must equal the single-engine
// reference; invalid fields, cancellation and deadlines must leave no block in use.
#include "prefill_node/prefill_service.h"

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

  void SetUp() override {
    node::WorkerOptions o;
    o.role = internal::v1::WORKER_ROLE_PREFILL;
    o.worker_id = "prefill-0";
    o.model_path = kModel;
    o.kv_blocks = kPrefillBlocks;
    o.block_size = kBlockSize;
    o.threads = 2;
    o.kv_backend = kv_transfer::Backend::kLoopback;
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

}  // namespace
}  // namespace deepinfer::prefill_node
