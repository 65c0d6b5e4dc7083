// The decode node's service in one process: a decode WorkerRuntime serving DecodeService and a
// prefill WorkerRuntime serving PrefillService (both standalone, loopback kv_transfer backend,
// real gRPC over loopback TCP), with a client calling Decode.Generate.
#include "decode_node/decode_service.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fake_clock.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "node/worker_runtime.h"
#include "prefill_node/prefill_service.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"
#include "proto/deepinfer/internal/v1/prefill.grpc.pb.h"

namespace deepinfer::decode_node {
namespace {

using internal::v1::DecodeRequest;

constexpr char kModel[] = "engine/testdata/models/llama";
constexpr int kBlockSize = 4;
constexpr int kBlocks = 640;  // 2560 tokens: long generations fit

// One decode node: its runtime, its service and a client.
struct DecodeNode {
  std::unique_ptr<node::WorkerRuntime> runtime;
  std::unique_ptr<DecodeService> service;
  std::unique_ptr<internal::v1::Decode::Stub> stub;

  ~DecodeNode() {
    if (runtime != nullptr) runtime->Drain(absl::Seconds(5));
    if (service != nullptr) service->Stop();
  }
};

node::WorkerOptions Options(internal::v1::WorkerRole role, const std::string& id, bool can_prefill,
                            engine::SpecOptions speculative = {}) {
  node::WorkerOptions o;
  o.role = role;
  o.worker_id = id;
  o.model_path = kModel;
  o.kv_blocks = kBlocks;
  o.block_size = kBlockSize;
  o.threads = 2;
  o.kv_backend = kv_transfer::Backend::kLoopback;
  o.can_prefill = can_prefill;
  o.drain_timeout = absl::Seconds(5);
  o.speculative = speculative;
  return o;
}

absl::StatusOr<std::unique_ptr<DecodeNode>> StartDecode(const std::string& id, bool can_prefill,
                                                        DecodeServiceOptions service_options,
                                                        engine::SpecOptions speculative = {}) {
  auto n = std::make_unique<DecodeNode>();
  auto rt = node::WorkerRuntime::Create(
      Options(internal::v1::WORKER_ROLE_DECODE, id, can_prefill, speculative));
  if (!rt.ok()) return rt.status();
  n->runtime = std::move(*rt);
  n->service = std::make_unique<DecodeService>(n->runtime.get(), service_options);
  absl::Status st = n->service->Start();
  if (!st.ok()) return st;
  DecodeService* service = n->service.get();
  st = n->runtime->Start({service}, {internal::v1::Decode::service_full_name()},
                         [service](internal::v1::WorkerStats* s) { service->ContributeStats(s); });
  if (!st.ok()) return st;
  n->stub = internal::v1::Decode::NewStub(
      grpc::CreateChannel(n->runtime->address(), grpc::InsecureChannelCredentials()));
  return n;
}

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::vector<v1::GenerateChunk> chunks;
};

Outcome Generate(internal::v1::Decode::Stub* stub, const DecodeRequest& request,
                 absl::Duration timeout = absl::Seconds(60)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto reader = stub->Generate(&context, request);
  Outcome out;
  v1::GenerateChunk chunk;
  while (reader->Read(&chunk)) {
    for (uint32_t t : chunk.token_ids()) out.tokens.push_back(static_cast<int32_t>(t));
    out.chunks.push_back(chunk);
  }
  out.status = reader->Finish();
  return out;
}

DecodeRequest Greedy(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens,
                     const std::string& prefill_address) {
  DecodeRequest r;
  r.set_request_id(id);
  for (int32_t t : prompt) r.add_prompt_token_ids(static_cast<uint32_t>(t));
  r.mutable_sampling()->set_temperature(0.0f);  // generation_config.json leaves it at 1.0
  r.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  r.mutable_sampling()->set_ignore_eos(true);
  r.set_prefill_address(prefill_address);
  return r;
}

bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

// No request holds a block or waits for KV.
bool Quiet(const node::WorkerRuntime& rt) {
  const internal::v1::WorkerStats s = rt.Stats();
  return s.used_kv_blocks() == 0 && s.awaiting_kv_sequences() == 0 && s.held_sequences() == 0 &&
         s.running_sequences() == 0 && s.waiting_sequences() == 0 && s.in_flight_transfers() == 0;
}

// A port nothing listens on (bound, then closed).
int DeadPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 1;
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class DecodeServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = engine::Model::Load(kModel, engine::ModelOptions{2});
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = model->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void SetUp() override {
    auto rt = node::WorkerRuntime::Create(
        Options(internal::v1::WORKER_ROLE_PREFILL, "prefill-0", /*can_prefill=*/false));
    ASSERT_TRUE(rt.ok()) << rt.status();
    prefill_ = std::move(*rt);
    prefill_service_ = std::make_unique<prefill_node::PrefillService>(prefill_.get());
    ASSERT_TRUE(prefill_
                    ->Start({prefill_service_.get()}, {prefill_node::PrefillService::ServiceName()},
                            prefill_service_->stats_contributor())
                    .ok());
    DecodeServiceOptions o;
    o.prefill_timeout = absl::Seconds(20);
    auto d = StartDecode("decode-0", /*can_prefill=*/true, o);
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
  }

  void TearDown() override {
    decode_.reset();
    if (prefill_ != nullptr) prefill_->Drain(absl::Seconds(5));
    prefill_service_.reset();
    prefill_.reset();
  }

  std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens) {
    engine::SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = true;
    engine::GenerateOptions go;
    go.block_size = kBlockSize;
    auto ref = engine::GenerateOne(*model_, prompt, sp, go);
    EXPECT_TRUE(ref.ok()) << ref.status();
    std::vector<int32_t> out;
    if (ref.ok()) {
      for (const auto& s : ref->steps) out.push_back(s.token);
    }
    return out;
  }

  void ExpectQuiet(absl::Duration timeout = absl::Seconds(5)) {
    EXPECT_TRUE(WaitUntil([&] { return Quiet(*decode_->runtime); }, timeout))
        << decode_->runtime->Stats().DebugString();
    EXPECT_TRUE(WaitUntil([&] { return Quiet(*prefill_); }, timeout))
        << prefill_->Stats().DebugString();
  }

  std::string prefill_address() const { return prefill_->address(); }

  static engine::Model* model_;
  std::unique_ptr<node::WorkerRuntime> prefill_;
  std::unique_ptr<prefill_node::PrefillService> prefill_service_;
  std::unique_ptr<DecodeNode> decode_;
};

engine::Model* DecodeServiceTest::model_ = nullptr;

const std::vector<std::vector<int32_t>>& Prompts() {
  static const auto* prompts = new std::vector<std::vector<int32_t>>{
      {760, 39, 68, 410, 78, 311, 268, 624, 5, 9, 44},
      {760, 39, 68, 410, 78, 311, 268, 624, 7},  // shares two blocks with the first
      {12},
      {760, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23},
  };
  return *prompts;
}

TEST_F(DecodeServiceTest, DisaggregatedGreedyOutputsEqualReference) {
  constexpr int kMaxTokens = 8;
  // Round 2 hits the decode node's own prefix cache (skip_blocks > 0) and the prefill node's.
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < Prompts().size(); ++i) {
      const std::string id = absl::StrCat("d", round, "-", i);
      Outcome out =
          Generate(decode_->stub.get(), Greedy(id, Prompts()[i], kMaxTokens, prefill_address()));
      ASSERT_TRUE(out.status.ok()) << id << ": " << out.status.error_message();
      EXPECT_EQ(out.tokens, Reference(Prompts()[i], kMaxTokens)) << id;
      ASSERT_FALSE(out.chunks.empty());
      const v1::GenerateChunk& last = out.chunks.back();
      EXPECT_EQ(last.request_id(), id);
      EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(last.usage().prompt_tokens(), Prompts()[i].size());
      EXPECT_EQ(last.usage().completion_tokens(), static_cast<uint32_t>(kMaxTokens));
      for (size_t c = 0; c + 1 < out.chunks.size(); ++c) {
        EXPECT_EQ(out.chunks[c].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
      }
      // The TTFT breakdown: the prefill node's compute and (streamed) transfer, of which the part
      // after the last layer, and the wait for the first decode step here.
      const v1::Timing& timing = last.usage().timing();
      EXPECT_GT(timing.prefill_compute_us(), 0u) << id;
      EXPECT_GT(timing.kv_transfer_us(), 0u) << id;
      EXPECT_LE(timing.kv_transfer_exposed_us(), timing.kv_transfer_us()) << id;
      EXPECT_GT(timing.decode_queue_us(), 0u) << id;
      if (round == 1 && i == 0) {
        // The prefill node computed this prompt before: its prefix cache served full blocks.
        EXPECT_GE(last.usage().cached_prompt_tokens(), 2u * kBlockSize);
      }
    }
  }
  const internal::v1::WorkerStats s = decode_->runtime->Stats();
  EXPECT_EQ(s.requests_ok(), 2 * Prompts().size());
  EXPECT_EQ(s.requests_failed(), 0u);
  EXPECT_GT(prefill_->Stats().transfer_bytes_written(), 0u);
  ExpectQuiet();
}

// A decode node that speculates (n-gram drafts, k = 4) after a remote prefill: the first token
// comes from the prefill node and anchors the first draft; greedy outputs equal decoding without
// speculation, and the last chunk's usage reports the drafts.
TEST_F(DecodeServiceTest, SpeculativeDecodeNodeMatchesReferenceAndReportsDrafts) {
  engine::SpecOptions spec;
  spec.enabled = true;
  spec.num_speculative_tokens = 4;
  DecodeServiceOptions o;
  o.prefill_timeout = absl::Seconds(20);
  auto d = StartDecode("decode-spec", /*can_prefill=*/true, o, spec);
  ASSERT_TRUE(d.ok()) << d.status();
  // Repetitive prompts (a motif repeated, then a tail) give the n-gram drafter matches.
  std::vector<std::vector<int32_t>> prompts = {
      {11, 12, 13, 14, 11, 12, 13, 14, 11, 12, 13, 14, 11},
      {300, 301, 300, 301, 300, 301, 300},
      {5, 6, 7, 5, 6, 7, 5, 6, 7, 700, 5, 6},
  };
  prompts.push_back(Prompts()[0]);
  constexpr int kMaxTokens = 24;
  uint64_t drafts = 0;
  uint64_t accepted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Disaggregated, then colocated (the decode node prefills itself).
    for (const std::string& prefill : {prefill_address(), std::string()}) {
      const std::string id = absl::StrCat("s", i, prefill.empty() ? "-local" : "-remote");
      Outcome out = Generate((*d)->stub.get(), Greedy(id, prompts[i], kMaxTokens, prefill));
      ASSERT_TRUE(out.status.ok()) << id << ": " << out.status.error_message();
      EXPECT_EQ(out.tokens, Reference(prompts[i], kMaxTokens)) << id;
      ASSERT_FALSE(out.chunks.empty());
      const v1::Usage& usage = out.chunks.back().usage();
      EXPECT_EQ(usage.completion_tokens(), static_cast<uint32_t>(kMaxTokens)) << id;
      EXPECT_LE(usage.accepted_draft_tokens(), usage.draft_tokens()) << id;
      drafts += usage.draft_tokens();
      accepted += usage.accepted_draft_tokens();
    }
  }
  EXPECT_GT(accepted, 0u);
  // The worker's stats count what the requests' usage reported (verified drafts); the engine
  // counts a step's drafts just after that step's outputs went out.
  EXPECT_TRUE(WaitUntil([&] { return (*d)->runtime->Stats().spec_verified_tokens() >= drafts; },
                        absl::Seconds(5)));
  const internal::v1::WorkerStats s = (*d)->runtime->Stats();
  EXPECT_EQ(s.spec_verified_tokens(), drafts);
  EXPECT_EQ(s.spec_accepted_tokens(), accepted);
  EXPECT_GE(s.spec_draft_tokens(), s.spec_verified_tokens());
  EXPECT_GT(s.spec_steps(), 0u);
  // The plain decode node and the prefill node never speculated.
  EXPECT_EQ(decode_->runtime->Stats().spec_draft_tokens(), 0u);
  EXPECT_EQ(prefill_->Stats().spec_draft_tokens(), 0u);
  EXPECT_TRUE(WaitUntil([&] { return Quiet(*(*d)->runtime); }, absl::Seconds(5)))
      << (*d)->runtime->Stats().DebugString();
}

TEST_F(DecodeServiceTest, ConcurrentDisaggregatedRequests) {
  constexpr int kMaxTokens = 12;
  constexpr int kCopies = 2;
  std::vector<Outcome> outs(Prompts().size() * kCopies);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < outs.size(); ++k) {
    threads.emplace_back([&, k] {
      const auto& prompt = Prompts()[k % Prompts().size()];
      outs[k] = Generate(decode_->stub.get(),
                         Greedy(absl::StrCat("c", k), prompt, kMaxTokens, prefill_address()));
    });
  }
  for (auto& t : threads) t.join();
  for (size_t k = 0; k < outs.size(); ++k) {
    ASSERT_TRUE(outs[k].status.ok()) << k << ": " << outs[k].status.error_message();
    EXPECT_EQ(outs[k].tokens, Reference(Prompts()[k % Prompts().size()], kMaxTokens)) << k;
  }
  ExpectQuiet();
}

TEST_F(DecodeServiceTest, ColocatedGreedyOutputsEqualReference) {
  constexpr int kMaxTokens = 8;
  for (size_t i = 0; i < Prompts().size(); ++i) {
    Outcome out =
        Generate(decode_->stub.get(), Greedy(absl::StrCat("l", i), Prompts()[i], kMaxTokens, ""));
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.tokens, Reference(Prompts()[i], kMaxTokens)) << i;
    EXPECT_EQ(out.chunks.back().finish_reason(), v1::FINISH_REASON_LENGTH);
    const v1::Timing& timing = out.chunks.back().usage().timing();
    EXPECT_EQ(timing.prefill_compute_us() + timing.kv_transfer_us() +
                  timing.kv_transfer_exposed_us() + timing.decode_queue_us(),
              0u);
  }
  // The prefill node was not involved.
  EXPECT_EQ(prefill_->Stats().requests_ok(), 0u);
  ExpectQuiet();
}

TEST_F(DecodeServiceTest, LogprobsAndTextWhenAsked) {
  DecodeRequest r = Greedy("lp", Prompts()[0], 6, prefill_address());
  r.mutable_sampling()->set_return_logprobs(true);
  r.mutable_sampling()->set_logprobs(3);
  r.set_detokenize(true);
  Outcome out = Generate(decode_->stub.get(), r);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.tokens.size(), 6u);
  std::vector<int32_t> logprob_tokens;
  for (const auto& c : out.chunks) {
    ASSERT_EQ(c.logprobs_size(), c.token_ids_size());
    for (const auto& lp : c.logprobs()) {
      logprob_tokens.push_back(static_cast<int32_t>(lp.token_id()));
      EXPECT_LE(lp.logprob(), 0.0f);
      EXPECT_EQ(lp.top_size(), 3);
      // Greedy: the chosen token is the most likely one.
      if (lp.top_size() > 0) {
        EXPECT_EQ(lp.top(0).token_id(), lp.token_id());
      }
    }
  }
  EXPECT_EQ(logprob_tokens, out.tokens);
}

TEST_F(DecodeServiceTest, InvalidFieldsAreNamed) {
  struct Case {
    std::function<void(DecodeRequest*)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](DecodeRequest* r) { r->clear_request_id(); }, "request_id"},
      {[](DecodeRequest* r) { r->clear_prompt_token_ids(); }, "prompt_token_ids"},
      {[](DecodeRequest* r) { r->set_prompt_token_ids(2, 900); }, "prompt_token_ids[2]"},
      {[](DecodeRequest* r) { r->add_images(); }, "images"},
      {[](DecodeRequest* r) { r->mutable_sampling()->set_top_p(1.5f); }, "sampling.top_p"},
      {[](DecodeRequest* r) { r->mutable_sampling()->set_max_tokens(5000); },
       "sampling.max_tokens"},
      {[](DecodeRequest* r) { r->set_priority(1000); }, "priority"},
      {[](DecodeRequest* r) { r->set_cache_salt(std::string(300, 's')); }, "cache_salt"},
  };
  for (const std::string& address : {prefill_address(), std::string()}) {
    for (const Case& c : cases) {
      DecodeRequest r = Greedy("bad", Prompts()[0], 4, address);
      c.mutate(&r);
      Outcome out = Generate(decode_->stub.get(), r);
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << c.field << ": " << out.status.error_message();
      EXPECT_EQ(out.status.error_message().rfind(c.field + ":", 0), 0u)
          << c.field << ": " << out.status.error_message();
      EXPECT_TRUE(out.chunks.empty());
    }
  }
  ExpectQuiet();
}

TEST_F(DecodeServiceTest, ColocatedNeedsCanPrefill) {
  auto d = StartDecode("decode-no-prefill", /*can_prefill=*/false, DecodeServiceOptions());
  ASSERT_TRUE(d.ok()) << d.status();
  Outcome out = Generate((*d)->stub.get(), Greedy("x", Prompts()[0], 4, ""));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(out.status.error_message().rfind("prefill_address:", 0), 0u)
      << out.status.error_message();
  // Disaggregated still works there.
  out = Generate((*d)->stub.get(), Greedy("y", Prompts()[0], 4, prefill_address()));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.tokens, Reference(Prompts()[0], 4));
}

TEST_F(DecodeServiceTest, ClientCancelMidStreamFreesEverything) {
  for (const std::string& address : {prefill_address(), std::string()}) {
    grpc::ClientContext context;
    auto reader = decode_->stub->Generate(&context, Greedy("cancel", Prompts()[3], 1500, address));
    v1::GenerateChunk chunk;
    int tokens = 0;
    while (tokens < 3 && reader->Read(&chunk)) tokens += chunk.token_ids_size();
    ASSERT_GE(tokens, 3) << address;
    context.TryCancel();
    while (reader->Read(&chunk)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    ExpectQuiet();
  }
  EXPECT_TRUE(WaitUntil([&] { return decode_->runtime->Stats().requests_cancelled() == 2; },
                        absl::Seconds(5)));
}

// Cancels at spread-out moments (during the prefill, the transfer, or decoding): every request
// ends CANCELLED (or OK when it finished first) and nothing stays reserved on either node.
TEST_F(DecodeServiceTest, CancelAtAnyMomentLeaksNothing) {
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt.push_back((i * 37 + 11) % 760);
  for (int k = 0; k < 12; ++k) {
    grpc::ClientContext context;
    DecodeRequest r = Greedy(absl::StrCat("rc", k), long_prompt, 64, prefill_address());
    r.set_cache_salt(absl::StrCat("salt", k));  // no prefix-cache hits: every prefill computes
    auto reader = decode_->stub->Generate(&context, r);
    absl::SleepFor(absl::Milliseconds(3 * k));
    context.TryCancel();
    v1::GenerateChunk chunk;
    while (reader->Read(&chunk)) {
    }
    const grpc::Status st = reader->Finish();
    EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::CANCELLED)
        << k << ": " << st.error_code() << " " << st.error_message();
  }
  ExpectQuiet();
  EXPECT_EQ(decode_->service->pending_releases(), 0u);
}

TEST_F(DecodeServiceTest, AbortEndsTheStreamWithAborted) {
  grpc::ClientContext context;
  auto reader =
      decode_->stub->Generate(&context, Greedy("abort-me", Prompts()[0], 1500, prefill_address()));
  v1::GenerateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  {
    grpc::ClientContext abort_context;
    internal::v1::DecodeAbortRequest abort;
    abort.set_request_id("abort-me");
    internal::v1::DecodeAbortResponse response;
    ASSERT_TRUE(decode_->stub->Abort(&abort_context, abort, &response).ok());
    EXPECT_TRUE(response.found());
  }
  v1::GenerateChunk last = chunk;
  while (reader->Read(&chunk)) last = chunk;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_ABORTED);
  ExpectQuiet();
  EXPECT_EQ(decode_->runtime->Stats().requests_cancelled(), 1u);
  // Unknown ids are not found; an empty id is invalid.
  grpc::ClientContext c2;
  internal::v1::DecodeAbortRequest abort;
  abort.set_request_id("never-seen");
  internal::v1::DecodeAbortResponse response;
  ASSERT_TRUE(decode_->stub->Abort(&c2, abort, &response).ok());
  EXPECT_FALSE(response.found());
  grpc::ClientContext c3;
  abort.clear_request_id();
  EXPECT_EQ(decode_->stub->Abort(&c3, abort, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(DecodeServiceTest, DeadlinePassedWhileDecoding) {
  // 2000 tokens take about 0.6 s here, so the deadline passes mid-stream. On a loaded machine a
  // stalled thread can move it out of the stream: the deadline passes before the first token
  // (prefill, transfer or this thread late) or the whole stream ends before the handler looks
  // (OK). Neither is this test's case: try again (a deadline never enforced while decoding ends
  // OK every time, and fails below).
  Outcome out;
  for (int attempt = 0; attempt < 5; ++attempt) {
    DecodeRequest r = Greedy(absl::StrCat("late", attempt), Prompts()[3], 2000, prefill_address());
    r.set_deadline_unix_us(absl::ToUnixMicros(absl::Now() + absl::Milliseconds(150)));
    out = Generate(decode_->stub.get(), r);
    const bool before_first_token =
        out.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && out.tokens.empty();
    if (!before_first_token && !out.status.ok()) break;
  }
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << out.status.error_message();
  EXPECT_FALSE(out.tokens.empty());
  EXPECT_LT(out.tokens.size(), 2000u);
  ExpectQuiet();
}

TEST_F(DecodeServiceTest, DeadlineIsJudgedByTheInjectedClock) {
  FakeClock clock;
  DecodeServiceOptions o;
  o.clock = clock.AsFunction();
  auto d = StartDecode("decode-fake-clock", /*can_prefill=*/true, o);
  ASSERT_TRUE(d.ok()) << d.status();
  // Already past by the wall clock (the fake one is years behind), a second ahead by the
  // service's: the request starts, and ends when the fake clock passes the deadline.
  DecodeRequest r = Greedy("fake-late", Prompts()[3], 2000, /*prefill_address=*/"");
  r.set_deadline_unix_us(absl::ToUnixMicros(clock.Now() + absl::Seconds(1)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = (*d)->stub->Generate(&context, r);
  v1::GenerateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  size_t tokens = static_cast<size_t>(chunk.token_ids_size());
  EXPECT_GT(tokens, 0u);
  clock.Advance(absl::Seconds(1));
  while (reader->Read(&chunk)) tokens += static_cast<size_t>(chunk.token_ids_size());
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_EQ(status.error_message(), "the request's deadline passed while decoding");
  EXPECT_LT(tokens, 2000u);
  EXPECT_TRUE(WaitUntil([&] { return Quiet(*(*d)->runtime); }, absl::Seconds(5)))
      << (*d)->runtime->Stats().DebugString();

  // At the deadline by the clock, a new request does not start.
  r.set_request_id("fake-past");
  r.set_deadline_unix_us(absl::ToUnixMicros(clock.Now()));
  Outcome out = Generate((*d)->stub.get(), r);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << out.status.error_message();
  EXPECT_TRUE(out.chunks.empty());
}

TEST_F(DecodeServiceTest, DeadPrefillNodeFailsFastAndFreesAfterTheTransferDeadline) {
  DecodeServiceOptions o;
  o.prefill_timeout = absl::Seconds(1);
  o.quiesce_grace = absl::Milliseconds(200);
  auto d = StartDecode("decode-dead-peer", /*can_prefill=*/false, o);
  ASSERT_TRUE(d.ok()) << d.status();
  node::WorkerRuntime& rt = *(*d)->runtime;
  const std::string dead = absl::StrCat("127.0.0.1:", DeadPort());
  const absl::Time start = absl::Now();
  Outcome out = Generate((*d)->stub.get(), Greedy("dead", Prompts()[0], 4, dead));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
  EXPECT_EQ(out.status.error_message().rfind(absl::StrCat("prefill node ", dead, " failed"), 0), 0u)
      << out.status.error_message();
  EXPECT_LT(took, absl::Milliseconds(900));
  // The node did not confirm the cancel: the blocks stay reserved until no write can land
  // (transfer deadline + the agent's abort grace + quiesce grace = 2.2 s after the start).
  internal::v1::WorkerStats s = rt.Stats();
  EXPECT_EQ(s.awaiting_kv_sequences(), 1u);
  EXPECT_GT(s.used_kv_blocks(), 0u);
  EXPECT_EQ((*d)->service->pending_releases(), 1u);
  EXPECT_EQ(s.requests_failed(), 1u);
  // Watch for the release rather than look once at 1.9 s: a look that a loaded machine delays
  // past 2.2 s sees it freed on time. Seen free only after it was freed, never before.
  EXPECT_TRUE(
      WaitUntil([&] { return rt.Stats().awaiting_kv_sequences() == 0; }, absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(1900)) << "freed before the transfer deadline";
  EXPECT_TRUE(WaitUntil([&] { return Quiet(rt); }, absl::Seconds(3))) << rt.Stats().DebugString();
  EXPECT_EQ((*d)->service->pending_releases(), 0u);
}

TEST_F(DecodeServiceTest, DrainingRefusesNewRequests) {
  decode_->runtime->Drain(absl::Seconds(1));
  // The server is gone after the drain; a direct call sees the draining scope.
  grpc::ServerContext context;
  DecodeRequest r = Greedy("drain", Prompts()[0], 4, prefill_address());
  grpc::Status st = decode_->service->Generate(&context, &r, nullptr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(st.error_message().find("draining"), std::string::npos) << st.error_message();
}

}  // namespace
}  // namespace deepinfer::decode_node
