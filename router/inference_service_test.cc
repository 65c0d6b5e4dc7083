#include "router/inference_service.h"

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "api/request_validation.h"
#include "common/fake_clock.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "common/metrics_test_util.h"
#include "engine/model_assets.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "router/prompt_block_hashes.h"
#include "router/router_metrics.h"
#include "router/tenants.h"
#include "router/worker_registry.h"

namespace deepinfer::router {
namespace {

using internal::v1::DecodeRequest;
using internal::v1::WorkerInfo;
using v1::ChatChunk;
using v1::ChatRequest;
using v1::GenerateChunk;
using v1::GenerateRequest;

constexpr char kModelDir[] = "engine/testdata/models/llama";
constexpr char kModelId[] = "llama";
constexpr uint64_t kQueuedUs = 7;
constexpr uint64_t kPrefillUs = 11;
// Speculative decoding counts the fake decode worker reports (the router relays them).
constexpr uint32_t kDraftTokens = 6;
constexpr uint32_t kAcceptedDraftTokens = 4;

// The tokens the fake decode worker streams for a prompt of `prompt_size` tokens.
uint32_t FakeToken(size_t prompt_size, int i) {
  return static_cast<uint32_t>((prompt_size * 7 + static_cast<size_t>(i)) % 700 + 1);
}

// What a fake decode worker does with the next requests.
struct Script {
  // Tokens streamed when sampling.max_tokens is 0 (else max_tokens).
  int tokens = 4;
  // When not OK: end the call with this code after `chunks_before_failure` chunks.
  grpc::StatusCode fail_code = grpc::StatusCode::OK;
  int chunks_before_failure = 0;
  // Pause before each token (a slow stream); cancellation is checked between tokens.
  absl::Duration per_token_delay = absl::ZeroDuration();
  // Reported in the last chunk's usage.
  uint32_t cached_prompt_tokens = 0;
};

// A real gRPC server implementing internal::v1::Decode: streams deterministic tokens (one chunk
// per token, then a last chunk with usage), records every DecodeRequest, fails or streams slowly
// as its Script says, and notes when a call's context is cancelled.
class FakeDecodeWorker final : public internal::v1::Decode::Service {
 public:
  explicit FakeDecodeWorker(std::string id) : id_(std::move(id)) {
    GrpcServerOptions options;
    options.services = {this};
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  ~FakeDecodeWorker() override { server_->Shutdown(absl::ZeroDuration()); }

  WorkerInfo Info(bool can_prefill, uint64_t capacity_blocks = 1000) const {
    WorkerInfo w;
    w.set_worker_id(id_);
    w.set_role(internal::v1::WORKER_ROLE_DECODE);
    w.set_address(server_->address());
    w.set_model(kModelId);
    w.set_incarnation(1);
    w.set_block_size(16);
    w.set_kv_capacity_blocks(capacity_blocks);
    w.set_max_context_tokens(2048);
    w.set_can_prefill(can_prefill);
    return w;
  }

  void SetScript(Script script) {
    absl::MutexLock lock(&mu_);
    script_ = script;
  }
  std::vector<DecodeRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // True once a call of this worker saw its context cancelled within `timeout`.
  bool WaitForCancel(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&saw_cancel_), timeout);
  }
  bool WaitIdle(absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_ == 0; };
    return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
  }

  grpc::Status Generate(grpc::ServerContext* context, const DecodeRequest* request,
                        grpc::ServerWriter<GenerateChunk>* writer) override {
    Script script;
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
      script = script_;
      ++active_;
    }
    grpc::Status status = Stream(context, *request, script, writer);
    absl::MutexLock lock(&mu_);
    --active_;
    return status;
  }

  grpc::Status Abort(grpc::ServerContext*, const internal::v1::DecodeAbortRequest*,
                     internal::v1::DecodeAbortResponse*) override {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the router cancels the stream instead");
  }

 private:
  grpc::Status Stream(grpc::ServerContext* context, const DecodeRequest& request,
                      const Script& script, grpc::ServerWriter<GenerateChunk>* writer) {
    const int n = request.sampling().max_tokens() > 0
                      ? static_cast<int>(request.sampling().max_tokens())
                      : script.tokens;
    const size_t prompt = static_cast<size_t>(request.prompt_token_ids_size());
    for (int i = 0; i < n; ++i) {
      if (script.fail_code != grpc::StatusCode::OK && i == script.chunks_before_failure) {
        return grpc::Status(script.fail_code, absl::StrCat(id_, " fails on purpose"));
      }
      const absl::Time wake = absl::Now() + script.per_token_delay;
      while (absl::Now() < wake && !context->IsCancelled()) absl::SleepFor(absl::Milliseconds(2));
      if (context->IsCancelled()) {
        absl::MutexLock lock(&mu_);
        saw_cancel_ = true;
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
      GenerateChunk chunk;
      chunk.set_request_id(request.request_id());
      chunk.add_token_ids(FakeToken(prompt, i));
      if (request.detokenize()) chunk.set_text_delta(absl::StrCat("t", FakeToken(prompt, i)));
      writer->Write(chunk);
    }
    if (script.fail_code != grpc::StatusCode::OK) {
      return grpc::Status(script.fail_code, absl::StrCat(id_, " fails on purpose"));
    }
    GenerateChunk last;
    last.set_request_id(request.request_id());
    last.set_finish_reason(v1::FINISH_REASON_LENGTH);
    v1::Usage* usage = last.mutable_usage();
    usage->set_prompt_tokens(static_cast<uint32_t>(prompt));
    usage->set_completion_tokens(static_cast<uint32_t>(n));
    usage->set_cached_prompt_tokens(script.cached_prompt_tokens);
    usage->set_draft_tokens(kDraftTokens);
    usage->set_accepted_draft_tokens(kAcceptedDraftTokens);
    usage->mutable_timing()->set_queued_us(kQueuedUs);
    usage->mutable_timing()->set_prefill_us(kPrefillUs);
    usage->mutable_timing()->set_first_token_us(999'999'999);  // the router's view replaces it
    usage->mutable_timing()->set_total_us(999'999'999);
    writer->Write(last);
    return grpc::Status::OK;
  }

  const std::string id_;
  std::unique_ptr<GrpcServer> server_;
  mutable absl::Mutex mu_;
  Script script_ ABSL_GUARDED_BY(mu_);
  std::vector<DecodeRequest> requests_ ABSL_GUARDED_BY(mu_);
  bool saw_cancel_ ABSL_GUARDED_BY(mu_) = false;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

WorkerInfo PrefillInfo(absl::string_view id, int port) {
  WorkerInfo w;
  w.set_worker_id(std::string(id));
  w.set_role(internal::v1::WORKER_ROLE_PREFILL);
  w.set_address(absl::StrCat("127.0.0.1:", port));  // never contacted by the router
  w.set_model(kModelId);
  w.set_incarnation(1);
  w.set_block_size(16);
  w.set_kv_capacity_blocks(1000);
  w.set_max_context_tokens(2048);
  return w;
}

ChatRequest SimpleChat(absl::string_view request_id = "") {
  ChatRequest r;
  r.set_request_id(std::string(request_id));
  v1::ChatMessage* system = r.add_messages();
  system->set_role("system");
  system->add_content()->set_text("You are terse.");
  v1::ChatMessage* user = r.add_messages();
  user->set_role("user");
  user->add_content()->set_text("Hello there, how are you?");
  return r;
}

GenerateRequest SimpleGenerate(absl::string_view request_id = "", int prompt_tokens = 5) {
  GenerateRequest r;
  r.set_request_id(std::string(request_id));
  for (int i = 0; i < prompt_tokens; ++i) r.add_prompt_token_ids(static_cast<uint32_t>(i + 3));
  return r;
}

// The classic 1x1 grey PNG.
std::string Png() {
  std::string out;
  EXPECT_TRUE(
      absl::Base64Unescape("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjC"
                           "B0C8AAAAASUVORK5CYII=",
                           &out));
  return out;
}

template <typename Chunk>
struct Result {
  std::vector<Chunk> chunks;
  grpc::Status status;

  std::vector<uint32_t> Tokens() const {
    std::vector<uint32_t> out;
    for (const Chunk& c : chunks) out.insert(out.end(), c.token_ids().begin(), c.token_ids().end());
    return out;
  }
};

class InferenceServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<engine::ModelAssets>> assets =
        engine::ModelAssets::Load(kModelDir);
    ASSERT_TRUE(assets.ok()) << assets.status();
    assets_ = std::move(*assets);
    WorkerRegistry::Options registry_options;
    registry_options.heartbeat_interval = absl::Seconds(60);  // no expiry during a test
    registry_options.rng_seed = 1;
    absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry =
        WorkerRegistry::Create(registry_options);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = std::move(*registry);
    StartService(InferenceServiceOptions{.model_id = kModelId});
  }

  void StartService(InferenceServiceOptions options) {
    stub_.reset();
    server_.reset();
    absl::StatusOr<std::unique_ptr<InferenceService>> service =
        InferenceService::Create(registry_.get(), assets_.get(), std::move(options));
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    GrpcServerOptions server_options;
    server_options.services = {service_.get()};
    absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(server_options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Inference::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  FakeDecodeWorker* AddDecode(absl::string_view id, bool can_prefill,
                              uint64_t capacity_blocks = 1000) {
    decode_workers_.push_back(std::make_unique<FakeDecodeWorker>(std::string(id)));
    FakeDecodeWorker* worker = decode_workers_.back().get();
    absl::StatusOr<internal::v1::RegisterResponse> registered =
        registry_->Register(worker->Info(can_prefill, capacity_blocks));
    EXPECT_TRUE(registered.ok()) << registered.status();
    return worker;
  }

  std::string AddPrefill(absl::string_view id, int port) {
    WorkerInfo info = PrefillInfo(id, port);
    absl::StatusOr<internal::v1::RegisterResponse> registered = registry_->Register(info);
    EXPECT_TRUE(registered.ok()) << registered.status();
    return info.address();
  }

  // An infinite `timeout` sets no deadline.
  static void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
    if (timeout != absl::InfiniteDuration()) {
      context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    }
  }

  Result<ChatChunk> Chat(const ChatRequest& request, absl::Duration timeout = absl::Seconds(20)) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    Result<ChatChunk> result;
    std::unique_ptr<grpc::ClientReader<ChatChunk>> reader = stub_->Chat(&context, request);
    ChatChunk chunk;
    while (reader->Read(&chunk)) result.chunks.push_back(chunk);
    result.status = reader->Finish();
    return result;
  }

  Result<GenerateChunk> Generate(const GenerateRequest& request,
                                 absl::Duration timeout = absl::Seconds(20)) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    Result<GenerateChunk> result;
    std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader = stub_->Generate(&context, request);
    GenerateChunk chunk;
    while (reader->Read(&chunk)) result.chunks.push_back(chunk);
    result.status = reader->Finish();
    return result;
  }

  // Decode workers first, so that they outlive the router's server and service.
  std::vector<std::unique_ptr<FakeDecodeWorker>> decode_workers_;
  std::unique_ptr<engine::ModelAssets> assets_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(InferenceServiceTest, CreateRefusesBadOptions) {
  EXPECT_EQ(InferenceService::Create(registry_.get(), assets_.get(), {}).status().message(),
            "model_id: expected a non-empty id; got \"\"");
  EXPECT_EQ(InferenceService::Create(registry_.get(), assets_.get(),
                                     {.model_id = "m", .placement_policy = "random"})
                .status()
                .message(),
            "--placement_policy: expected least_loaded or cache_aware; got \"random\"");
  EXPECT_EQ(InferenceService::Create(
                registry_.get(), assets_.get(),
                {.model_id = "m", .placement = {.local_prefill_threshold_tokens = -1}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InferenceService::Create(registry_.get(), assets_.get(),
                                     {.model_id = "m", .default_timeout = absl::ZeroDuration()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(InferenceServiceTest, ListModels) {
  grpc::ClientContext context;
  v1::ListModelsResponse response;
  ASSERT_TRUE(stub_->ListModels(&context, {}, &response).ok());
  ASSERT_EQ(response.models_size(), 1);
  const v1::ModelInfo& m = response.models(0);
  EXPECT_EQ(m.id(), kModelId);
  EXPECT_EQ(m.max_context_tokens(), 2048u);
  EXPECT_FALSE(m.supports_images());
  EXPECT_EQ(m.architecture(), "LlamaForCausalLM");
  EXPECT_EQ(m.vocab_size(), 768u);
}

TEST_F(InferenceServiceTest, ChatTokenizesWithTheTemplateAndRelaysTheStream) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/false);
  const std::string prefill_address = AddPrefill("p0", 9);
  ChatRequest request = SimpleChat();
  request.mutable_sampling()->set_temperature(0.5f);
  request.mutable_sampling()->set_max_tokens(5);
  request.mutable_sampling()->add_stop("zz");
  request.set_cache_salt("tenant-a");
  request.set_priority(3);

  const absl::Time before = absl::Now();
  Result<ChatChunk> result = Chat(request, absl::InfiniteDuration());
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();

  // The decode worker got the prompt as ModelAssets renders and tokenizes the same messages.
  absl::StatusOr<api::ChatPrompt> prompt =
      api::ConvertChatMessages(request, api::RequestLimits{768, 2048});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  absl::StatusOr<std::vector<int32_t>> expected_ids =
      assets_->RenderAndTokenize(prompt->messages, /*add_generation_prompt=*/true);
  ASSERT_TRUE(expected_ids.ok()) << expected_ids.status();
  ASSERT_FALSE(expected_ids->empty());
  const std::vector<DecodeRequest> sent = decode->requests();
  ASSERT_EQ(sent.size(), 1u);
  const DecodeRequest& d = sent[0];
  EXPECT_EQ(std::vector<uint32_t>(d.prompt_token_ids().begin(), d.prompt_token_ids().end()),
            std::vector<uint32_t>(expected_ids->begin(), expected_ids->end()));
  // A generated id; the client's sampling with the model's defaults resolved; the chosen prefill
  // worker.
  EXPECT_TRUE(absl::StartsWith(d.request_id(), "chat-")) << d.request_id();
  EXPECT_EQ(d.request_id().size(), 5u + 16u) << d.request_id();
  v1::SamplingParams resolved = request.sampling();
  resolved.set_top_p(1.0f);
  resolved.set_top_k(0);
  resolved.set_min_p(0.0f);
  resolved.set_repetition_penalty(1.0f);
  EXPECT_EQ(d.sampling().DebugString(), resolved.DebugString());
  EXPECT_EQ(d.cache_salt(), "tenant-a");
  EXPECT_EQ(d.priority(), 3);
  EXPECT_EQ(d.prefill_address(), prefill_address);
  EXPECT_TRUE(d.detokenize());
  // No client deadline: now + the default 10 minutes.
  const absl::Time deadline = absl::FromUnixMicros(d.deadline_unix_us());
  EXPECT_GE(deadline, before + absl::Minutes(10));
  EXPECT_LE(deadline, absl::Now() + absl::Minutes(10));

  // Five token chunks and the last one, all under the request's id.
  ASSERT_EQ(result.chunks.size(), 6u);
  std::vector<uint32_t> expected_tokens;
  for (int i = 0; i < 5; ++i) expected_tokens.push_back(FakeToken(expected_ids->size(), i));
  EXPECT_EQ(result.Tokens(), expected_tokens);
  for (const ChatChunk& c : result.chunks) EXPECT_EQ(c.request_id(), d.request_id());
  EXPECT_EQ(result.chunks[0].text_delta(), absl::StrCat("t", expected_tokens[0]));
  const ChatChunk& last = result.chunks.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().prompt_tokens(), expected_ids->size());
  EXPECT_EQ(last.usage().completion_tokens(), 5u);
  // The decode node's queue and prefill times stay; TTFT and total are the router's.
  EXPECT_EQ(last.usage().timing().queued_us(), kQueuedUs);
  EXPECT_EQ(last.usage().timing().prefill_us(), kPrefillUs);
  EXPECT_GT(last.usage().timing().first_token_us(), 0u);
  EXPECT_LE(last.usage().timing().first_token_us(), last.usage().timing().total_us());
  EXPECT_LT(last.usage().timing().total_us(),
            static_cast<uint64_t>(absl::ToInt64Microseconds(absl::Now() - before)) + 1);
  // Speculative decoding counts pass through.
  EXPECT_EQ(last.usage().draft_tokens(), kDraftTokens);
  EXPECT_EQ(last.usage().accepted_draft_tokens(), kAcceptedDraftTokens);
  EXPECT_EQ(service_->in_flight(), 0);
}

TEST_F(InferenceServiceTest, GenerateForwardsTokensDetokenizeAndTheClientDeadline) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  GenerateRequest request = SimpleGenerate("gen-client-1", 7);
  request.set_model(kModelId);
  const absl::Time before = absl::Now();
  Result<GenerateChunk> result = Generate(request, absl::Seconds(30));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  const std::vector<DecodeRequest> sent = decode->requests();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].request_id(), "gen-client-1");
  EXPECT_EQ(sent[0].prompt_token_ids_size(), 7);
  EXPECT_EQ(sent[0].prompt_token_ids(6), 9u);
  EXPECT_FALSE(sent[0].detokenize());
  EXPECT_EQ(sent[0].prefill_address(), "");  // colocated: no prefill worker
  const absl::Time deadline = absl::FromUnixMicros(sent[0].deadline_unix_us());
  // gRPC sends the deadline as a timeout and rebuilds it on the server: allow for rounding.
  EXPECT_GE(deadline, before + absl::Seconds(29));
  EXPECT_LE(deadline, absl::Now() + absl::Seconds(31));
  ASSERT_EQ(result.chunks.size(), 5u);  // 4 tokens (the script's default) + last
  EXPECT_EQ(result.chunks[0].text_delta(), "");
  EXPECT_EQ(result.chunks.back().finish_reason(), v1::FINISH_REASON_LENGTH);

  // With detokenize the decode node is asked for text.
  request.set_request_id("gen-client-2");
  request.set_detokenize(true);
  result = Generate(request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_TRUE(decode->requests().back().detokenize());
  EXPECT_EQ(result.chunks[0].text_delta(), absl::StrCat("t", FakeToken(7, 0)));
}

TEST_F(InferenceServiceTest, MalformedRequestsAreInvalidArgumentNamingTheField) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  struct ChatCase {
    const char* name;
    std::function<void(ChatRequest&)> mutate;
    std::string message_prefix;
  };
  const std::vector<ChatCase> chat_cases = {
      {"no_messages", [](ChatRequest& r) { r.clear_messages(); }, "messages: "},
      {"bad_role", [](ChatRequest& r) { r.mutable_messages(1)->set_role("robot"); },
       "messages[1].role: "},
      {"top_p", [](ChatRequest& r) { r.mutable_sampling()->set_top_p(1.5f); }, "sampling.top_p: "},
      {"temperature", [](ChatRequest& r) { r.mutable_sampling()->set_temperature(-1.0f); },
       "sampling.temperature: "},
      {"top_k", [](ChatRequest& r) { r.mutable_sampling()->set_top_k(-5); }, "sampling.top_k: "},
      {"unknown_model", [](ChatRequest& r) { r.set_model("gpt-9"); },
       "model: unknown model \"gpt-9\"; this router serves \"llama\""},
      {"beyond_context", [](ChatRequest& r) { r.mutable_sampling()->set_max_tokens(2040); },
       "sampling.max_tokens: "},
      {"priority", [](ChatRequest& r) { r.set_priority(101); }, "priority: "},
      {"request_id", [](ChatRequest& r) { r.set_request_id(std::string(129, 'x')); },
       "request_id: "},
      {"image",
       [](ChatRequest& r) {
         r.mutable_messages(1)->add_content()->mutable_image()->set_data(Png());
       },
       "messages[1].content[1].image: model \"llama\" accepts no images (no image token)"},
  };
  for (const ChatCase& c : chat_cases) {
    ChatRequest request = SimpleChat();
    c.mutate(request);
    Result<ChatChunk> result = Chat(request);
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_TRUE(absl::StartsWith(result.status.error_message(), c.message_prefix))
        << c.name << ": " << result.status.error_message();
    EXPECT_TRUE(result.chunks.empty()) << c.name;
  }

  struct GenerateCase {
    const char* name;
    std::function<void(GenerateRequest&)> mutate;
    std::string message_prefix;
  };
  const std::vector<GenerateCase> generate_cases = {
      {"no_prompt", [](GenerateRequest& r) { r.clear_prompt_token_ids(); }, "prompt_token_ids: "},
      {"id_beyond_vocab", [](GenerateRequest& r) { r.set_prompt_token_ids(2, 768); },
       "prompt_token_ids[2]: "},
      {"beyond_context",
       [](GenerateRequest& r) {
         for (int i = 0; i < 2040; ++i) r.add_prompt_token_ids(1);
         r.mutable_sampling()->set_max_tokens(100);
       },
       "sampling.max_tokens: "},
      {"stop_token_beyond_vocab",
       [](GenerateRequest& r) { r.mutable_sampling()->add_stop_token_ids(900); },
       "sampling.stop_token_ids[0]: "},
      {"min_p", [](GenerateRequest& r) { r.mutable_sampling()->set_min_p(2.0f); },
       "sampling.min_p: "},
      {"unknown_model", [](GenerateRequest& r) { r.set_model("other"); }, "model: "},
  };
  for (const GenerateCase& c : generate_cases) {
    GenerateRequest request = SimpleGenerate();
    c.mutate(request);
    Result<GenerateChunk> result = Generate(request);
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_TRUE(absl::StartsWith(result.status.error_message(), c.message_prefix))
        << c.name << ": " << result.status.error_message();
  }

  grpc::ClientContext abort_context;
  v1::AbortResponse abort_response;
  grpc::Status abort_status = stub_->Abort(&abort_context, {}, &abort_response);
  EXPECT_EQ(abort_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(abort_status.error_message(), "request_id: "))
      << abort_status.error_message();

  // Nothing reached the decode worker, and the router still serves.
  EXPECT_TRUE(decode->requests().empty());
  EXPECT_TRUE(Chat(SimpleChat()).status.ok());
  EXPECT_TRUE(Generate(SimpleGenerate()).status.ok());
  EXPECT_EQ(decode->requests().size(), 2u);
  EXPECT_EQ(service_->in_flight(), 0);
}

TEST_F(InferenceServiceTest, RetriesOnceElsewhereWhenTheDecodeWorkerIsUnavailable) {
  // d0 has more room, so it is picked first; it fails before any chunk.
  FakeDecodeWorker* d0 = AddDecode("d0", /*can_prefill=*/false, 2000);
  FakeDecodeWorker* d1 = AddDecode("d1", /*can_prefill=*/false, 1000);
  d0->SetScript({.fail_code = grpc::StatusCode::UNAVAILABLE});
  AddPrefill("p0", 9);
  AddPrefill("p1", 10);

  Result<GenerateChunk> result = Generate(SimpleGenerate("r-1"));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_EQ(d0->requests().size(), 1u);
  ASSERT_EQ(d1->requests().size(), 1u);
  EXPECT_EQ(d0->requests()[0].request_id(), "r-1");
  EXPECT_EQ(d1->requests()[0].request_id(), "r-1#r1");
  // The retry avoids the prefill worker of the failed attempt too.
  EXPECT_NE(d1->requests()[0].prefill_address(), d0->requests()[0].prefill_address());
  EXPECT_EQ(result.Tokens().size(), 4u);
  for (const GenerateChunk& c : result.chunks) EXPECT_EQ(c.request_id(), "r-1");
}

TEST_F(InferenceServiceTest, NoRetryAfterTheFirstChunk) {
  FakeDecodeWorker* d0 = AddDecode("d0", /*can_prefill=*/true, 2000);
  FakeDecodeWorker* d1 = AddDecode("d1", /*can_prefill=*/true, 1000);
  d0->SetScript({.fail_code = grpc::StatusCode::UNAVAILABLE, .chunks_before_failure = 1});
  Result<GenerateChunk> result = Generate(SimpleGenerate("r-2"));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(result.status.error_message(), "d0 fails on purpose");
  ASSERT_EQ(result.chunks.size(), 1u);
  EXPECT_EQ(result.chunks[0].token_ids_size(), 1);
  EXPECT_EQ(d0->requests().size(), 1u);
  EXPECT_TRUE(d1->requests().empty());
}

TEST_F(InferenceServiceTest, OtherDecodeErrorsMapOneToOneWithoutRetry) {
  FakeDecodeWorker* d0 = AddDecode("d0", /*can_prefill=*/true, 2000);
  FakeDecodeWorker* d1 = AddDecode("d1", /*can_prefill=*/true, 1000);
  d0->SetScript({.fail_code = grpc::StatusCode::RESOURCE_EXHAUSTED});
  Result<GenerateChunk> result = Generate(SimpleGenerate("r-3"));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(result.status.error_message(), "d0 fails on purpose");
  EXPECT_TRUE(d1->requests().empty());
}

TEST_F(InferenceServiceTest, RetryFallsBackToTheOnlyWorkerWhenExclusionLeavesNone) {
  // The decode node cannot say whether it or its prefill node failed, so with a single decode
  // worker the retry goes to it again (with a prefill node other than the failed attempt's).
  FakeDecodeWorker* d0 = AddDecode("d0", /*can_prefill=*/false);
  AddPrefill("p0", 9);
  AddPrefill("p1", 10);
  d0->SetScript({.fail_code = grpc::StatusCode::UNAVAILABLE});
  Result<GenerateChunk> result = Generate(SimpleGenerate("r-4"));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(result.status.error_message(), "d0 fails on purpose");
  ASSERT_EQ(d0->requests().size(), 2u);
  EXPECT_EQ(d0->requests()[1].request_id(), "r-4#r1");
  EXPECT_NE(d0->requests()[1].prefill_address(), d0->requests()[0].prefill_address());
}

TEST_F(InferenceServiceTest, AbortEndsTheStreamWithAborted) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.tokens = 1000, .per_token_delay = absl::Milliseconds(5)});
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<ChatChunk>> reader = stub_->Chat(&context, SimpleChat("ab-1"));
  ChatChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_EQ(chunk.token_ids_size(), 1);

  {
    grpc::ClientContext abort_context;
    v1::AbortRequest abort;
    abort.set_request_id("ab-1");
    v1::AbortResponse response;
    ASSERT_TRUE(stub_->Abort(&abort_context, abort, &response).ok());
    EXPECT_TRUE(response.found());
  }
  ChatChunk last;
  while (reader->Read(&chunk)) last = chunk;
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(last.request_id(), "ab-1");
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_ABORTED);
  EXPECT_GE(last.usage().completion_tokens(), 1u);
  EXPECT_LT(last.usage().completion_tokens(), 1000u);
  EXPECT_GT(last.usage().prompt_tokens(), 0u);
  EXPECT_TRUE(decode->WaitForCancel(absl::Seconds(5)));

  // The request is gone: a second Abort finds nothing, nor does one for an unknown id.
  for (const char* id : {"ab-1", "never-seen"}) {
    grpc::ClientContext abort_context;
    v1::AbortRequest abort;
    abort.set_request_id(id);
    v1::AbortResponse response;
    ASSERT_TRUE(stub_->Abort(&abort_context, abort, &response).ok());
    EXPECT_FALSE(response.found()) << id;
  }
}

TEST_F(InferenceServiceTest, ClientCancelPropagatesToTheDecodeWorker) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.tokens = 1000, .per_token_delay = absl::Milliseconds(5)});
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader =
      stub_->Generate(&context, SimpleGenerate("c-1"));
  GenerateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  context.TryCancel();
  EXPECT_TRUE(decode->WaitForCancel(absl::Seconds(5)));
  while (reader->Read(&chunk)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(service_->WaitIdle(absl::Seconds(5)));
}

TEST_F(InferenceServiceTest, ClientCancelBeforeTheFirstChunkPropagates) {
  // The router is blocked reading the decode call (nothing to relay yet) when the client goes.
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.per_token_delay = absl::Seconds(30)});
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(60));
  std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader =
      stub_->Generate(&context, SimpleGenerate("c-2"));
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (decode->requests().empty() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(decode->requests().size(), 1u);
  context.TryCancel();
  EXPECT_TRUE(decode->WaitForCancel(absl::Seconds(5)));
  GenerateChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(service_->WaitIdle(absl::Seconds(5)));
}

TEST_F(InferenceServiceTest, ColocatedSelection) {
  // A decode worker that can prefill, and no prefill worker: it prefills itself.
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  ASSERT_TRUE(Generate(SimpleGenerate("co-1")).status.ok());
  EXPECT_EQ(decode->requests().back().prefill_address(), "");

  // With a prefill pool and the default threshold 0, the pool prefills.
  const std::string prefill_address = AddPrefill("p0", 9);
  ASSERT_TRUE(Generate(SimpleGenerate("co-2")).status.ok());
  EXPECT_EQ(decode->requests().back().prefill_address(), prefill_address);

  // Below the threshold the decode worker prefills; at or above it the pool does.
  StartService(InferenceServiceOptions{.model_id = kModelId,
                                       .placement = {.local_prefill_threshold_tokens = 11}});
  ASSERT_TRUE(Generate(SimpleGenerate("co-3", 10)).status.ok());
  EXPECT_EQ(decode->requests().back().prefill_address(), "");
  ASSERT_TRUE(Generate(SimpleGenerate("co-4", 11)).status.ok());
  EXPECT_EQ(decode->requests().back().prefill_address(), prefill_address);
}

TEST_F(InferenceServiceTest, NoWorkerIsUnavailable) {
  Result<GenerateChunk> none = Generate(SimpleGenerate());
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StartsWith(none.status.error_message(), "no decode worker for model \"llama\""))
      << none.status.error_message();

  // A decode worker that cannot prefill needs a prefill pool.
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/false);
  Result<GenerateChunk> no_prefill = Generate(SimpleGenerate());
  EXPECT_EQ(no_prefill.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(no_prefill.status.error_message(), "cannot prefill"))
      << no_prefill.status.error_message();
  EXPECT_TRUE(decode->requests().empty());
}

TEST_F(InferenceServiceTest, DrainingRefusesNewCallsAndWaitsForTheRunningOnes) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.tokens = 40, .per_token_delay = absl::Milliseconds(10)});
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader =
      stub_->Generate(&context, SimpleGenerate("dr-1"));
  GenerateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));

  service_->BeginDrain();
  EXPECT_TRUE(service_->draining());
  Result<ChatChunk> refused = Chat(SimpleChat());
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.status.error_message(), "router is draining");
  EXPECT_EQ(Generate(SimpleGenerate()).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(service_->WaitIdle(absl::Milliseconds(20)));
  EXPECT_EQ(service_->in_flight(), 1);
  {
    grpc::ClientContext list_context;
    v1::ListModelsResponse models;
    EXPECT_TRUE(stub_->ListModels(&list_context, {}, &models).ok());
  }

  // The running call finishes normally.
  int tokens = chunk.token_ids_size();
  bool finished = false;
  while (reader->Read(&chunk)) {
    tokens += chunk.token_ids_size();
    finished = chunk.finish_reason() == v1::FINISH_REASON_LENGTH;
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(finished);
  EXPECT_EQ(tokens, 40);
  EXPECT_TRUE(service_->WaitIdle(absl::Seconds(5)));
  EXPECT_EQ(decode->requests().size(), 1u);
}

TEST_F(InferenceServiceTest, ARunningRequestIdCannotBeReused) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.tokens = 1000, .per_token_delay = absl::Milliseconds(5)});
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader =
      stub_->Generate(&context, SimpleGenerate("dup"));
  GenerateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  Result<GenerateChunk> second = Generate(SimpleGenerate("dup"));
  EXPECT_EQ(second.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_TRUE(absl::StartsWith(second.status.error_message(), "request_id: "));
  context.TryCancel();
  while (reader->Read(&chunk)) {
  }
  reader->Finish();
  EXPECT_TRUE(service_->WaitIdle(absl::Seconds(5)));
  EXPECT_TRUE(decode->WaitIdle(absl::Seconds(5)));
}

// Prefill worker `id` reports `queued_input_tokens` queued (its first load report).
void ReportPrefillLoad(WorkerRegistry& registry, absl::string_view id, uint64_t queued_tokens) {
  internal::v1::LoadReport report;
  report.set_worker_id(std::string(id));
  report.set_incarnation(1);
  report.set_sequence(1);
  report.set_queue_depth(queued_tokens > 0 ? 1 : 0);
  report.set_queued_input_tokens(queued_tokens);
  ASSERT_TRUE(registry.ReportLoad(report).known());
}

// Worker `id` publishes that its prefix cache holds `hashes` (a chain from the root).
void PublishStored(WorkerRegistry& registry, absl::string_view id,
                   const std::vector<uint64_t>& hashes) {
  internal::v1::KvEventBatch batch;
  batch.set_worker_id(std::string(id));
  batch.set_incarnation(1);
  batch.set_sequence(1);
  internal::v1::KvEvent* event = batch.add_events();
  event->set_kind(internal::v1::KvEvent::KIND_STORED);
  for (uint64_t h : hashes) event->add_block_hashes(h);
  absl::StatusOr<internal::v1::KvEventAck> ack = registry.PublishKvEvents(batch);
  ASSERT_TRUE(ack.ok()) << ack.status();
}

GenerateRequest LongPrompt(absl::string_view request_id, absl::string_view salt) {
  GenerateRequest r = SimpleGenerate(request_id, 200);
  r.set_cache_salt(std::string(salt));
  return r;
}

std::vector<uint32_t> PromptOf(const GenerateRequest& r) {
  return std::vector<uint32_t>(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
}

TEST_F(InferenceServiceTest, CacheAwareSendsThePrefillToTheWorkerHoldingThePrefix) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/false);
  const std::string idle_address = AddPrefill("pA", 9);
  const std::string holder_address = AddPrefill("pB", 10);
  // pA is idle; pB has 50 tokens queued but holds the 200-token prompt's 12 full blocks (with
  // the workers' seed 0 and block size 16, and the request's salt).
  ReportPrefillLoad(*registry_, "pB", 50);
  const GenerateRequest request = LongPrompt("ca-1", "tenant-a");
  PublishStored(*registry_, "pB", PromptBlockHashes(PromptOf(request), 0, "tenant-a", 16));

  ASSERT_TRUE(Generate(request).status.ok());
  EXPECT_EQ(decode->requests().back().prefill_address(), holder_address);
  // Every later turn too: the choice is by cost, not by chance.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(Generate(LongPrompt(absl::StrCat("ca-more-", i), "tenant-a")).status.ok());
    EXPECT_EQ(decode->requests().back().prefill_address(), holder_address);
  }
  // Another tenant's salt makes other hashes: nothing cached anywhere, the idle worker wins.
  ASSERT_TRUE(Generate(LongPrompt("ca-2", "tenant-b")).status.ok());
  EXPECT_EQ(decode->requests().back().prefill_address(), idle_address);
  // Placements are given back once the requests ended.
  for (const char* id : {"pA", "pB", "d0"}) {
    std::optional<WorkerSnapshot> w = registry_->Get(id);
    ASSERT_TRUE(w.has_value());
    EXPECT_EQ(w->placed_requests, 0) << id;
    EXPECT_EQ(w->placed_tokens, 0) << id;
    EXPECT_EQ(w->placed_blocks, 0) << id;
  }
}

TEST_F(InferenceServiceTest, LeastLoadedIgnoresThePrefix) {
  StartService(InferenceServiceOptions{.model_id = kModelId, .placement_policy = "least_loaded"});
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/false);
  const std::string idle_address = AddPrefill("pA", 9);
  AddPrefill("pB", 10);
  ReportPrefillLoad(*registry_, "pB", 50);
  const GenerateRequest request = LongPrompt("ll-1", "tenant-a");
  PublishStored(*registry_, "pB", PromptBlockHashes(PromptOf(request), 0, "tenant-a", 16));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Generate(LongPrompt(absl::StrCat("ll-", i), "tenant-a")).status.ok());
    EXPECT_EQ(decode->requests().back().prefill_address(), idle_address);
  }
}

TEST_F(InferenceServiceTest, PlacementIsRecordedWhileTheRequestRuns) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/false);
  AddPrefill("pB", 10);
  const GenerateRequest request = LongPrompt("rec-1", "");
  // pB holds the first 5 blocks (80 tokens): it computes the other 120.
  std::vector<uint64_t> hashes = PromptBlockHashes(PromptOf(request), 0, "", 16);
  hashes.resize(5);
  PublishStored(*registry_, "pB", hashes);
  decode->SetScript({.tokens = 1000, .per_token_delay = absl::Milliseconds(5)});
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader = stub_->Generate(&context, request);
  GenerateChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_EQ(registry_->Get("pB")->placed_requests, 1);
  EXPECT_EQ(registry_->Get("pB")->placed_tokens, 120);
  EXPECT_EQ(registry_->Get("d0")->placed_requests, 1);
  EXPECT_EQ(registry_->Get("d0")->placed_blocks, (200 + 1 + 15) / 16);
  EXPECT_EQ(registry_->Get("d0")->placed_tokens, 0);  // prefilled remotely
  context.TryCancel();
  while (reader->Read(&chunk)) {
  }
  reader->Finish();
  EXPECT_TRUE(service_->WaitIdle(absl::Seconds(5)));
  EXPECT_EQ(registry_->Get("pB")->placed_tokens, 0);
  EXPECT_EQ(registry_->Get("d0")->placed_blocks, 0);
}

TEST_F(InferenceServiceTest, CacheAwareLocalPrefillOnTheDecodeWorkerHoldingThePrefix) {
  // Two colocated decode workers, no prefill pool, threshold 64: d1 holds the prompt's prefix so
  // it computes only 8 tokens locally (below the threshold); d0 would compute all 200.
  StartService(InferenceServiceOptions{.model_id = kModelId,
                                       .placement = {.local_prefill_threshold_tokens = 64}});
  FakeDecodeWorker* d0 = AddDecode("d0", /*can_prefill=*/true, 2000);
  FakeDecodeWorker* d1 = AddDecode("d1", /*can_prefill=*/true, 1000);
  AddPrefill("p0", 9);
  const GenerateRequest request = LongPrompt("loc-1", "");
  PublishStored(*registry_, "d1", PromptBlockHashes(PromptOf(request), 0, "", 16));
  ASSERT_TRUE(Generate(request).status.ok());
  EXPECT_TRUE(d0->requests().empty());
  ASSERT_EQ(d1->requests().size(), 1u);
  EXPECT_EQ(d1->requests()[0].prefill_address(), "");
}

TEST_F(InferenceServiceTest, TheNextTurnPrefillsWhereTheLastAnswerIsBeforeTheEventsSaySo) {
  // Threshold 64, two colocated decode workers and a prefill worker. Turn 1 (200 prompt tokens,
  // nobody holds them) prefills remotely; turn 2 repeats it with the 40-token answer and 10 new
  // tokens. No KV event has told the router of the answer's blocks, but the worker that served
  // turn 1 holds 239 of turn 2's tokens (14 full blocks: 26 uncached), so turn 2 prefills there.
  StartService(InferenceServiceOptions{.model_id = kModelId,
                                       .placement = {.local_prefill_threshold_tokens = 64}});
  FakeDecodeWorker* d0 = AddDecode("d0", /*can_prefill=*/true, 2000);
  FakeDecodeWorker* d1 = AddDecode("d1", /*can_prefill=*/true, 1000);
  AddPrefill("p0", 9);
  // Both have a prefix cache (their events stored something once).
  PublishStored(*registry_, "d0", {777});
  PublishStored(*registry_, "d1", {778});
  GenerateRequest turn1 = LongPrompt("turn-1", "");
  turn1.mutable_sampling()->set_max_tokens(40);
  const Result<GenerateChunk> answer = Generate(turn1);
  ASSERT_TRUE(answer.status.ok()) << answer.status.error_message();
  ASSERT_EQ(answer.Tokens().size(), 40u);
  FakeDecodeWorker* first = d0->requests().size() == 1 ? d0 : d1;
  FakeDecodeWorker* other = first == d0 ? d1 : d0;
  ASSERT_EQ(first->requests().size(), 1u);
  EXPECT_NE(first->requests()[0].prefill_address(), "");  // remote: 200 uncached

  GenerateRequest turn2 = LongPrompt("turn-2", "");
  for (uint32_t t : answer.Tokens()) turn2.add_prompt_token_ids(t);
  for (int i = 0; i < 10; ++i) turn2.add_prompt_token_ids(static_cast<uint32_t>(100 + i));
  ASSERT_TRUE(Generate(turn2).status.ok());
  ASSERT_EQ(first->requests().size(), 2u);
  EXPECT_TRUE(other->requests().empty());
  EXPECT_EQ(first->requests()[1].prefill_address(), "");  // local: 26 uncached
  // Turn 2 left 250 + 4 - 1 tokens: 15 full blocks, 14 of them turn 1's; none reported yet.
  const std::string id = first == d0 ? "d0" : "d1";
  const std::string other_id = first == d0 ? "d1" : "d0";
  EXPECT_EQ(registry_->Get(id)->expected_blocks, 15);
  EXPECT_EQ(registry_->Get(other_id)->expected_blocks, 0);

  // A failed request leaves no expectation behind.
  other->SetScript({.fail_code = grpc::StatusCode::INTERNAL});
  first->SetScript({.fail_code = grpc::StatusCode::INTERNAL});
  EXPECT_FALSE(Generate(LongPrompt("turn-x", "salt")).status.ok());
  EXPECT_EQ(registry_->Get(id)->expected_blocks, 15);
  EXPECT_EQ(registry_->Get(other_id)->expected_blocks, 0);
}

TEST_F(InferenceServiceTest, MetricsCountCallsTokensAndPlacementsOverHttp) {
  MetricsRegistry metrics_registry;
  std::unique_ptr<RouterMetrics> metrics = RouterMetrics::Create(&metrics_registry).value();
  StartService(InferenceServiceOptions{.model_id = kModelId, .metrics = metrics.get()});
  MetricsHttpServerOptions server_options;
  server_options.before_scrape = [&] { metrics->RefreshPools(*registry_, kModelId); };
  std::unique_ptr<MetricsHttpServer> http =
      MetricsHttpServer::Create(&metrics_registry, server_options).value();
  ASSERT_TRUE(http->Start().ok());
  auto scrape = [&](absl::string_view series) {
    absl::StatusOr<std::string> text = testutil::HttpGet(http->port());
    EXPECT_TRUE(text.ok()) << text.status();
    return testutil::SampleValue(text.ok() ? *text : "", series).value_or(-1);
  };
  EXPECT_EQ(scrape("deepinfer_requests_total{outcome=\"ok\"}"), 0);

  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  AddPrefill("p0", 9);
  decode->SetScript({.tokens = 4, .cached_prompt_tokens = 5});
  ASSERT_TRUE(Generate(SimpleGenerate("m-1", 20)).status.ok());  // remote prefill on p0
  GenerateRequest invalid = SimpleGenerate("m-2");
  invalid.set_prompt_token_ids(0, 900);
  EXPECT_EQ(Generate(invalid).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  decode->SetScript({.fail_code = grpc::StatusCode::RESOURCE_EXHAUSTED});
  EXPECT_FALSE(Generate(SimpleGenerate("m-3", 20)).status.ok());

  EXPECT_EQ(scrape("deepinfer_requests_total{outcome=\"ok\"}"), 1);
  EXPECT_EQ(scrape("deepinfer_requests_total{outcome=\"invalid\"}"), 1);
  EXPECT_EQ(scrape("deepinfer_requests_total{outcome=\"error\"}"), 1);
  EXPECT_EQ(scrape("deepinfer_placement_decisions_total{outcome=\"remote_prefill\"}"), 2);
  EXPECT_EQ(scrape("deepinfer_prompt_tokens_total"), 40);
  EXPECT_EQ(scrape("deepinfer_generation_tokens_total"), 4);
  EXPECT_EQ(scrape("deepinfer_cached_prompt_tokens_total"), 5);
  EXPECT_EQ(scrape("deepinfer_prefix_cache_hit_ratio"), 0.25);
  EXPECT_EQ(scrape("deepinfer_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(scrape("deepinfer_inter_token_latency_seconds_count"), 3);
  EXPECT_EQ(scrape("deepinfer_queue_time_seconds_count"), 1);
  EXPECT_EQ(scrape("deepinfer_e2e_request_latency_seconds_count"), 3);
  EXPECT_EQ(scrape("deepinfer_workers{pool=\"prefill\"}"), 1);
  EXPECT_EQ(scrape("deepinfer_workers{pool=\"decode\"}"), 1);

  // Below the threshold on a colocated worker: local.
  StartService(InferenceServiceOptions{.model_id = kModelId,
                                       .placement = {.local_prefill_threshold_tokens = 100},
                                       .metrics = metrics.get()});
  decode->SetScript({});
  ASSERT_TRUE(Generate(SimpleGenerate("m-4", 20)).status.ok());
  EXPECT_EQ(scrape("deepinfer_placement_decisions_total{outcome=\"local_below_threshold\"}"), 1);
  http->Stop();
}

// --- Tenants: every public method checks the caller (router/tenants.h) ---

std::string TenantEntry(absl::string_view id, absl::string_view key, absl::string_view extra = "") {
  return absl::StrCat("{\"id\": \"", id, "\", \"key_sha256\": [\"", HashApiKey(key), "\"]",
                      extra.empty() ? "" : ", ", extra, "}");
}

class TenantsServiceTest : public InferenceServiceTest {
 protected:
  void SetUp() override {
    InferenceServiceTest::SetUp();
    file_ = absl::StrCat(::testing::TempDir(), "/tenants_service_", getpid(), ".json");
    WriteTenants({TenantEntry("acme", "key-acme",
                              absl::StrCat("\"models\": [\"", kModelId, "\"], \"max_priority\": 5")),
                  TenantEntry("beta", "key-beta"),
                  TenantEntry("other", "key-other", "\"models\": [\"some-other-model\"]"),
                  TenantEntry("revoked", "key-revoked"),
                  TenantEntry("slow", "key-slow",
                              "\"requests_per_second\": 1, \"max_concurrent_streams\": 1")});
    absl::StatusOr<std::unique_ptr<Tenants>> tenants =
        Tenants::Create({.file = file_, .clock = clock_.AsFunction()});
    ASSERT_TRUE(tenants.ok()) << tenants.status();
    tenants_ = std::move(*tenants);
    StartService(InferenceServiceOptions{.model_id = kModelId, .tenants = tenants_.get()});
  }
  void TearDown() override { std::remove(file_.c_str()); }

  void WriteTenants(const std::vector<std::string>& entries) {
    const std::string tmp = file_ + ".tmp";
    std::ofstream(tmp) << "{\"tenants\": [" << absl::StrJoin(entries, ", ") << "]}";
    ASSERT_EQ(std::rename(tmp.c_str(), file_.c_str()), 0);
  }

  // An authorization value; "" sends none.
  static void Authorize(grpc::ClientContext* context, const std::string& authorization) {
    if (!authorization.empty()) context->AddMetadata("authorization", authorization);
  }

  grpc::Status CallChat(const std::string& authorization, ChatRequest request = SimpleChat()) {
    grpc::ClientContext context;
    Authorize(&context, authorization);
    SetDeadline(&context, absl::Seconds(20));
    std::unique_ptr<grpc::ClientReader<ChatChunk>> reader = stub_->Chat(&context, request);
    ChatChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }
  grpc::Status CallGenerate(const std::string& authorization,
                            GenerateRequest request = SimpleGenerate(),
                            std::string* retry_after = nullptr) {
    grpc::ClientContext context;
    Authorize(&context, authorization);
    SetDeadline(&context, absl::Seconds(20));
    std::unique_ptr<grpc::ClientReader<GenerateChunk>> reader = stub_->Generate(&context, request);
    GenerateChunk chunk;
    while (reader->Read(&chunk)) {
    }
    grpc::Status status = reader->Finish();
    if (retry_after != nullptr) {
      auto it = context.GetServerTrailingMetadata().find("retry-after");
      *retry_after = it == context.GetServerTrailingMetadata().end()
                         ? ""
                         : std::string(it->second.data(), it->second.size());
    }
    return status;
  }
  grpc::Status CallListModels(const std::string& authorization) {
    grpc::ClientContext context;
    Authorize(&context, authorization);
    v1::ListModelsResponse response;
    return stub_->ListModels(&context, {}, &response);
  }
  grpc::Status CallAbort(const std::string& authorization, const std::string& id,
                         bool* found = nullptr) {
    grpc::ClientContext context;
    Authorize(&context, authorization);
    v1::AbortRequest request;
    request.set_request_id(id);
    v1::AbortResponse response;
    grpc::Status status = stub_->Abort(&context, request, &response);
    if (found != nullptr) *found = response.found();
    return status;
  }

  FakeClock clock_;
  std::string file_;
  std::unique_ptr<Tenants> tenants_;
};

TEST_F(TenantsServiceTest, EveryMethodRefusesCallersWithoutAGoodKey) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  // The revoked key works until the file without it is reloaded.
  ASSERT_TRUE(CallListModels("Bearer key-revoked").ok());
  WriteTenants({TenantEntry("acme", "key-acme"), TenantEntry("other", "key-other",
                                                             "\"models\": [\"x\"]")});
  ASSERT_TRUE(tenants_->Reload().ok());

  struct Case {
    std::string name;
    std::string authorization;
    grpc::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"no key", "", grpc::StatusCode::UNAUTHENTICATED},
      {"not a bearer token", "Basic a2V5LWFjbWU=", grpc::StatusCode::UNAUTHENTICATED},
      {"unknown key", "Bearer key-nobody", grpc::StatusCode::UNAUTHENTICATED},
      {"revoked key", "Bearer key-revoked", grpc::StatusCode::UNAUTHENTICATED},
      {"key for another model", "Bearer key-other", grpc::StatusCode::PERMISSION_DENIED},
  };
  using Method = std::function<grpc::Status(const std::string&)>;
  const std::vector<std::pair<std::string, Method>> methods = {
      {"Chat", [&](const std::string& a) { return CallChat(a); }},
      {"Generate", [&](const std::string& a) { return CallGenerate(a); }},
      {"ListModels", [&](const std::string& a) { return CallListModels(a); }},
      {"Abort", [&](const std::string& a) { return CallAbort(a, "some-id"); }},
  };
  for (const auto& [method, call] : methods) {
    for (const Case& c : cases) {
      const grpc::Status status = call(c.authorization);
      EXPECT_EQ(status.error_code(), c.code)
          << method << ", " << c.name << ": " << status.error_message();
    }
  }
  // Nothing reached a worker.
  EXPECT_TRUE(decode->requests().empty());
  // The good key is served.
  EXPECT_TRUE(CallGenerate("Bearer key-acme").ok());
  EXPECT_EQ(decode->requests().size(), 1u);
}

TEST_F(TenantsServiceTest, PriorityAboveTheTenantsIsRefused) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  ChatRequest request = SimpleChat();
  request.set_priority(6);
  const grpc::Status status = CallChat("Bearer key-acme", request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(status.error_message().find("priority"), std::string::npos);
  EXPECT_TRUE(decode->requests().empty());
  request.set_priority(5);
  EXPECT_TRUE(CallChat("Bearer key-acme", request).ok());
  ASSERT_EQ(decode->requests().size(), 1u);
  EXPECT_EQ(decode->requests()[0].priority(), 5);
}

TEST_F(TenantsServiceTest, CacheSaltComesFromTheTenant) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  GenerateRequest request = SimpleGenerate();
  request.set_cache_salt("someone-elses-salt");
  ASSERT_TRUE(CallGenerate("Bearer key-acme", request).ok());
  ASSERT_TRUE(CallGenerate("Bearer key-beta", request).ok());
  ASSERT_EQ(decode->requests().size(), 2u);
  EXPECT_EQ(decode->requests()[0].cache_salt(), Tenants::CacheSalt(Tenant{.cache_namespace = "acme"}, ""));
  EXPECT_NE(decode->requests()[0].cache_salt(), decode->requests()[1].cache_salt());
  EXPECT_NE(decode->requests()[0].cache_salt(), "someone-elses-salt");
}

TEST_F(TenantsServiceTest, AbortOfAnotherTenantsRequestFindsNothing) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.tokens = 1000, .per_token_delay = absl::Milliseconds(5)});
  grpc::ClientContext context;
  Authorize(&context, "Bearer key-acme");
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<ChatChunk>> reader = stub_->Chat(&context, SimpleChat("t-1"));
  ChatChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  bool found = true;
  ASSERT_TRUE(CallAbort("Bearer key-beta", "t-1", &found).ok());
  EXPECT_FALSE(found);
  ASSERT_TRUE(reader->Read(&chunk));  // still streaming
  EXPECT_EQ(chunk.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  ASSERT_TRUE(CallAbort("Bearer key-acme", "t-1", &found).ok());
  EXPECT_TRUE(found);
  ChatChunk last;
  while (reader->Read(&chunk)) last = chunk;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_ABORTED);
}

TEST_F(TenantsServiceTest, RequestRateWithRetryAfter) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  ASSERT_TRUE(CallGenerate("Bearer key-slow").ok());
  std::string retry_after;
  const grpc::Status refused = CallGenerate("Bearer key-slow", SimpleGenerate(), &retry_after);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("requests_per_second"), std::string::npos);
  EXPECT_EQ(retry_after, "1");
  EXPECT_EQ(decode->requests().size(), 1u);
  // Other tenants are not limited by it.
  EXPECT_TRUE(CallGenerate("Bearer key-acme").ok());
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(CallGenerate("Bearer key-slow").ok());
}

TEST_F(TenantsServiceTest, ConcurrentStreamsAreCapped) {
  FakeDecodeWorker* decode = AddDecode("d0", /*can_prefill=*/true);
  decode->SetScript({.tokens = 1000, .per_token_delay = absl::Milliseconds(5)});
  grpc::ClientContext context;
  Authorize(&context, "Bearer key-slow");
  SetDeadline(&context, absl::Seconds(20));
  std::unique_ptr<grpc::ClientReader<ChatChunk>> reader = stub_->Chat(&context, SimpleChat("s-1"));
  ChatChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  clock_.Advance(absl::Seconds(10));  // the request rate is not what refuses the next one
  std::string retry_after;
  const grpc::Status refused = CallGenerate("Bearer key-slow", SimpleGenerate(), &retry_after);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("max_concurrent_streams"), std::string::npos);
  EXPECT_EQ(retry_after, "1");
  ASSERT_TRUE(CallAbort("Bearer key-slow", "s-1").ok());
  while (reader->Read(&chunk)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
  decode->SetScript({});
  EXPECT_TRUE(CallGenerate("Bearer key-slow").ok());
}

}  // namespace
}  // namespace deepinfer::router
