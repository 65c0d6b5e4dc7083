#include "router/inference_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

constexpr int64_t kDefaultBlockSize = 16;

std::string Quote(absl::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, 128)), s.size() > 128 ? "\"..." : "\"");
}

// ChatChunk and GenerateChunk carry the same fields.
v1::ChatChunk ToChatChunk(v1::GenerateChunk& in) {
  v1::ChatChunk out;
  out.set_request_id(std::move(*in.mutable_request_id()));
  out.mutable_token_ids()->Swap(in.mutable_token_ids());
  out.set_text_delta(std::move(*in.mutable_text_delta()));
  out.mutable_logprobs()->Swap(in.mutable_logprobs());
  out.set_finish_reason(in.finish_reason());
  if (in.has_usage()) out.mutable_usage()->Swap(in.mutable_usage());
  out.set_matched_stop(std::move(*in.mutable_matched_stop()));
  return out;
}

int64_t MicrosSince(absl::Time start) {
  return std::max<int64_t>(0, absl::ToInt64Microseconds(absl::Now() - start));
}

}  // namespace

// Counts a Chat/Generate call as in flight from admission to return, and owns its entry in
// live_ once the request id is known.
class InferenceService::Admission {
 public:
  explicit Admission(InferenceService* service) : service_(service) {
    absl::MutexLock lock(&service_->mu_);
    if (service_->draining_) {
      status_ = absl::UnavailableError("router is draining");
      return;
    }
    ++service_->in_flight_;
  }
  ~Admission() {
    if (!status_.ok()) return;
    absl::MutexLock lock(&service_->mu_);
    if (live_ != nullptr) service_->live_.erase(request_id_);
    --service_->in_flight_;
  }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  const absl::Status& status() const { return status_; }

  // Makes `request_id` abortable; kAlreadyExists when a request with that id is running.
  absl::StatusOr<LiveRequest*> Register(const std::string& request_id) {
    absl::MutexLock lock(&service_->mu_);
    auto [it, inserted] = service_->live_.try_emplace(request_id, nullptr);
    if (!inserted) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id: ", Quote(request_id), " is already running"));
    }
    it->second = std::make_shared<LiveRequest>();
    request_id_ = request_id;
    live_ = it->second.get();
    return live_;
  }

 private:
  InferenceService* const service_;
  absl::Status status_;
  std::string request_id_;
  LiveRequest* live_ = nullptr;
};

absl::StatusOr<std::unique_ptr<InferenceService>> InferenceService::Create(
    WorkerRegistry* registry, const engine::ModelAssets* assets, InferenceServiceOptions options) {
  if (registry == nullptr || assets == nullptr) {
    return absl::InvalidArgumentError("registry and assets: expected non-null");
  }
  if (options.model_id.empty()) {
    return absl::InvalidArgumentError("model_id: expected a non-empty id; got \"\"");
  }
  if (options.colocated_prefill_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("colocated_prefill_tokens: expected >= 0; got ",
                                                   options.colocated_prefill_tokens));
  }
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("default_timeout: expected > 0; got ",
                                                   absl::FormatDuration(options.default_timeout)));
  }
  DI_ASSIGN_OR_RETURN(GenerationDefaults defaults,
                      ParseGenerationDefaults(assets->generation_config()));
  return std::unique_ptr<InferenceService>(
      new InferenceService(registry, assets, std::move(options), defaults));
}

InferenceService::InferenceService(WorkerRegistry* registry, const engine::ModelAssets* assets,
                                   InferenceServiceOptions options, GenerationDefaults defaults)
    : registry_(registry),
      assets_(assets),
      options_(std::move(options)),
      defaults_(defaults),
      limits_{assets->config().vocab_size, assets->config().max_position_embeddings,
              options_.max_image_bytes} {
  model_info_.set_id(options_.model_id);
  model_info_.set_max_context_tokens(static_cast<uint32_t>(
      std::clamp<int64_t>(assets->config().max_position_embeddings, 0, UINT32_MAX)));
  model_info_.set_supports_images(false);
  model_info_.set_architecture(assets->architecture());
  model_info_.set_vocab_size(static_cast<uint32_t>(std::max(0, assets->config().vocab_size)));
}

absl::Status InferenceService::CheckModel(absl::string_view model) const {
  if (model.empty() || model == options_.model_id) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model: unknown model ", Quote(model), "; this router serves ", Quote(options_.model_id)));
}

std::string InferenceService::NewRequestId(absl::string_view prefix) {
  uint64_t bits;
  {
    absl::MutexLock lock(&mu_);
    bits = absl::Uniform<uint64_t>(bitgen_);
  }
  return absl::StrFormat("%s-%016x", prefix, bits);
}

int64_t InferenceService::BlockSize() const {
  // Registration makes every prefill/decode worker of a model agree on block_size.
  for (const WorkerSnapshot& w : registry_->List()) {
    if (w.info.role() == internal::v1::WORKER_ROLE_DECODE && w.info.model() == options_.model_id &&
        w.info.block_size() > 0) {
      return w.info.block_size();
    }
  }
  return kDefaultBlockSize;
}

absl::StatusOr<InferenceService::Placement> InferenceService::Place(
    int64_t prompt_tokens, absl::Span<const std::string> exclude) {
  const int64_t block_size = BlockSize();
  // The prompt plus the first generated token.
  const int64_t blocks_needed = (prompt_tokens + 1 + block_size - 1) / block_size;
  // `exclude` (the workers of a failed attempt) is a preference: the decode node cannot tell
  // whether it or its prefill node failed, so when excluding leaves no candidate the pick falls
  // back to every live worker (a dead one has stopped heartbeating by then, or fails again fast).
  absl::StatusOr<WorkerSnapshot> decode =
      registry_->PickDecode(options_.model_id, blocks_needed, exclude);
  if (!decode.ok() && !exclude.empty()) {
    decode = registry_->PickDecode(options_.model_id, blocks_needed);
  }
  int64_t recorded_blocks = blocks_needed;
  if (!decode.ok() && decode.status().code() == absl::StatusCode::kResourceExhausted) {
    // The registry's free-block counts are estimates (last load report minus what was placed
    // since); the decode node's engine is the authority on KV room, and refuses with
    // RESOURCE_EXHAUSTED itself when the blocks really are not there.
    decode = registry_->PickDecode(options_.model_id, 0);
    recorded_blocks = 0;
  }
  if (!decode.ok()) {
    if (decode.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat("no decode worker for model ",
                                                 Quote(options_.model_id), ": ",
                                                 decode.status().message()));
    }
    return decode.status();
  }
  Placement placement;
  placement.decode = std::move(*decode);
  placement.decode_blocks = recorded_blocks;
  const bool can_prefill = placement.decode.info.can_prefill();
  if (can_prefill && prompt_tokens <= options_.colocated_prefill_tokens) return placement;
  absl::StatusOr<WorkerSnapshot> prefill =
      registry_->PickPrefill(options_.model_id, prompt_tokens, exclude);
  if (!prefill.ok() && !exclude.empty()) {
    prefill = registry_->PickPrefill(options_.model_id, prompt_tokens);
  }
  if (prefill.ok()) {
    placement.prefill = *prefill;
    placement.prefill_worker_id = prefill->info.worker_id();
    placement.prefill_address = prefill->info.address();
    return placement;
  }
  if (prefill.status().code() == absl::StatusCode::kUnavailable && can_prefill) {
    return placement;  // no prefill pool: the decode worker prefills itself
  }
  if (prefill.status().code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(absl::StrCat(prefill.status().message(), ", and decode worker ",
                                               Quote(placement.decode.info.worker_id()),
                                               " cannot prefill"));
  }
  return prefill.status();
}

std::unique_ptr<internal::v1::Decode::Stub> InferenceService::DecodeStub(
    const std::string& address) {
  std::shared_ptr<grpc::Channel> channel;
  {
    absl::MutexLock lock(&channels_mu_);
    std::shared_ptr<grpc::Channel>& cached = channels_[address];
    if (cached == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(options_.max_message_bytes);
      args.SetMaxSendMessageSize(options_.max_message_bytes);
      cached = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    }
    channel = cached;
  }
  return internal::v1::Decode::NewStub(channel);
}

grpc::Status InferenceService::Forward(grpc::ServerContext* context, absl::Time received,
                                       const Prepared& request, LiveRequest* live,
                                       absl::FunctionRef<bool(v1::GenerateChunk&)> write,
                                       Outcome* outcome) {
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
  absl::Time deadline = received + options_.default_timeout;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = absl::FromChrono(context->deadline());
  }

  // Ends the client's stream with ABORTED (after Abort cancelled the decode call).
  auto finish_aborted = [&]() {
    outcome->aborted = true;
    v1::GenerateChunk last;
    last.set_request_id(request.request_id);
    last.set_finish_reason(v1::FINISH_REASON_ABORTED);
    v1::Usage* usage = last.mutable_usage();
    usage->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
    usage->set_completion_tokens(static_cast<uint32_t>(outcome->completion_tokens));
    if (outcome->first_token_us >= 0) {
      usage->mutable_timing()->set_first_token_us(static_cast<uint64_t>(outcome->first_token_us));
    }
    usage->mutable_timing()->set_total_us(static_cast<uint64_t>(MicrosSince(received)));
    write(last);
    return grpc::Status::OK;
  };

  std::vector<std::string> exclude;
  grpc::Status first_failure;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<Placement> placement = Place(prompt_tokens, exclude);
    if (!placement.ok()) {
      if (attempt == 0) return ToGrpcStatus(placement.status());
      // The retry found nowhere to go: the client sees the failure that caused it.
      return grpc::Status(first_failure.error_code(),
                          absl::StrCat(first_failure.error_message(),
                                       " (retry not placed: ", placement.status().message(), ")"));
    }
    // When this attempt ends, what the picks recorded is given back (see ReleasePlacement).
    struct ReleaseOnExit {
      WorkerRegistry* registry;
      const Placement& p;
      int64_t prompt_tokens;
      ~ReleaseOnExit() {
        registry->ReleasePlacement(p.decode.info.worker_id(), p.decode.info.incarnation(),
                                   p.decode.load_epoch, 0, p.decode_blocks);
        if (p.prefill.has_value()) {
          registry->ReleasePlacement(p.prefill->info.worker_id(), p.prefill->info.incarnation(),
                                     p.prefill->load_epoch, prompt_tokens, 0);
        }
      }
    } release_on_exit{registry_, *placement, prompt_tokens};
    outcome->attempts = attempt + 1;
    outcome->decode_worker = placement->decode.info.worker_id();
    outcome->prefill_worker =
        placement->prefill_worker_id.empty() ? "colocated" : placement->prefill_worker_id;

    internal::v1::DecodeRequest decode_request;
    decode_request.set_request_id(attempt == 0 ? request.request_id
                                               : absl::StrCat(request.request_id, "#r", attempt));
    decode_request.mutable_prompt_token_ids()->Add(request.prompt_token_ids.begin(),
                                                   request.prompt_token_ids.end());
    *decode_request.mutable_sampling() = *request.sampling;
    decode_request.set_cache_salt(request.cache_salt);
    decode_request.set_priority(request.priority);
    decode_request.set_prefill_address(placement->prefill_address);
    decode_request.set_deadline_unix_us(absl::ToUnixMicros(deadline));
    decode_request.set_detokenize(request.detokenize);

    // Deadline and cancellation of the client's call propagate to the decode call.
    std::unique_ptr<grpc::ClientContext> call = grpc::ClientContext::FromServerContext(*context);
    call->set_deadline(absl::ToChronoTime(deadline));
    {
      absl::MutexLock lock(&live->mu);
      if (live->aborted) return finish_aborted();
      live->call = call.get();
    }
    std::unique_ptr<internal::v1::Decode::Stub> stub = DecodeStub(placement->decode.info.address());
    std::unique_ptr<grpc::ClientReader<v1::GenerateChunk>> reader =
        stub->Generate(call.get(), decode_request);

    int64_t relayed = 0;
    bool client_gone = false;
    bool finished = false;
    v1::GenerateChunk chunk;
    while (reader->Read(&chunk)) {
      if (client_gone) continue;  // draining the cancelled call
      chunk.set_request_id(request.request_id);
      if (chunk.token_ids_size() > 0) {
        if (outcome->first_token_us < 0) outcome->first_token_us = MicrosSince(received);
        outcome->completion_tokens += chunk.token_ids_size();
      }
      if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        finished = true;
        v1::Timing* timing = chunk.mutable_usage()->mutable_timing();
        timing->set_first_token_us(
            static_cast<uint64_t>(std::max<int64_t>(0, outcome->first_token_us)));
        timing->set_total_us(static_cast<uint64_t>(MicrosSince(received)));
      }
      ++relayed;
      if (!write(chunk)) {
        client_gone = true;
        call->TryCancel();
      }
    }
    const grpc::Status status = reader->Finish();
    bool aborted;
    {
      absl::MutexLock lock(&live->mu);
      live->call = nullptr;
      aborted = live->aborted;
    }
    if (client_gone || context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
    }
    if (status.ok() && finished) return status;
    if (aborted && !finished) return finish_aborted();
    if (status.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("decode worker ", Quote(outcome->decode_worker),
                                       " ended the stream without a last chunk"));
    }
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && relayed == 0 && attempt == 0) {
      spdlog::info("[req={}] decode worker {} unavailable before the first chunk ({}); retrying",
                   request.request_id, outcome->decode_worker, status.error_message());
      first_failure = status;
      exclude.push_back(placement->decode.info.worker_id());
      if (!placement->prefill_worker_id.empty()) exclude.push_back(placement->prefill_worker_id);
      continue;
    }
    return status;
  }
  return first_failure;  // not reached: the second attempt always returns
}

void InferenceService::LogFinished(absl::string_view request_id, absl::Time received,
                                   int64_t prompt_tokens, const Outcome& outcome,
                                   const grpc::Status& status) const {
  const std::string ttft =
      outcome.first_token_us < 0 ? "-" : absl::StrFormat("%.1fms", outcome.first_token_us / 1e3);
  std::string result;
  if (outcome.aborted) {
    result = "ABORTED";
  } else if (status.ok()) {
    result = "OK";
  } else {
    result =
        absl::StrCat(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                     ": ", status.error_message());
  }
  spdlog::info(
      "[req={}] finished: decode={} prefill={} prompt_tokens={} completion_tokens={} ttft={} "
      "total={:.1f}ms attempts={} outcome={}",
      request_id.empty() ? std::string("-") : std::string(request_id), outcome.decode_worker,
      outcome.prefill_worker, prompt_tokens, outcome.completion_tokens, ttft,
      MicrosSince(received) / 1e3, outcome.attempts, result);
}

grpc::Status InferenceService::Chat(grpc::ServerContext* context, const v1::ChatRequest* request,
                                    grpc::ServerWriter<v1::ChatChunk>* writer) {
  const absl::Time received = absl::Now();
  Admission admission(this);
  if (!admission.status().ok()) return ToGrpcStatus(admission.status());
  Outcome outcome;
  Prepared prepared;
  auto prepare = [&]() -> absl::Status {
    DI_RETURN_IF_ERROR(CheckModel(request->model()));
    DI_ASSIGN_OR_RETURN(ChatPrompt prompt, ConvertChatMessages(*request, limits_));
    if (!prompt.images.empty()) {
      const ChatImage& image = prompt.images.front();
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", image.message_index, "].content[", image.part_index, "].image: model ",
          Quote(options_.model_id), " accepts no images (no encoder pool)"));
    }
    DI_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        assets_->RenderAndTokenize(prompt.messages, prompt.add_generation_prompt));
    DI_RETURN_IF_ERROR(ToEngineSamplingParams(request->sampling(), defaults_, limits_,
                                              static_cast<int64_t>(ids.size()))
                           .status());
    prepared.prompt_token_ids.assign(ids.begin(), ids.end());
    prepared.request_id =
        request->request_id().empty() ? NewRequestId("chat") : request->request_id();
    prepared.sampling = &request->sampling();
    prepared.cache_salt = request->cache_salt();
    prepared.priority = request->priority();
    prepared.detokenize = true;
    return absl::OkStatus();
  };
  grpc::Status status;
  if (absl::Status s = prepare(); !s.ok()) {
    status = ToGrpcStatus(s);
  } else if (absl::StatusOr<LiveRequest*> live = admission.Register(prepared.request_id);
             !live.ok()) {
    status = ToGrpcStatus(live.status());
  } else {
    status = Forward(
        context, received, prepared, *live,
        [writer](v1::GenerateChunk& chunk) { return writer->Write(ToChatChunk(chunk)); }, &outcome);
  }
  LogFinished(prepared.request_id.empty() ? request->request_id() : prepared.request_id, received,
              static_cast<int64_t>(prepared.prompt_token_ids.size()), outcome, status);
  return status;
}

grpc::Status InferenceService::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateChunk>* writer) {
  const absl::Time received = absl::Now();
  Admission admission(this);
  if (!admission.status().ok()) return ToGrpcStatus(admission.status());
  Outcome outcome;
  Prepared prepared;
  auto prepare = [&]() -> absl::Status {
    DI_RETURN_IF_ERROR(CheckModel(request->model()));
    DI_RETURN_IF_ERROR(ValidateGenerateRequest(*request, limits_));
    DI_RETURN_IF_ERROR(ToEngineSamplingParams(request->sampling(), defaults_, limits_,
                                              request->prompt_token_ids_size())
                           .status());
    prepared.prompt_token_ids.assign(request->prompt_token_ids().begin(),
                                     request->prompt_token_ids().end());
    prepared.request_id =
        request->request_id().empty() ? NewRequestId("gen") : request->request_id();
    prepared.sampling = &request->sampling();
    prepared.cache_salt = request->cache_salt();
    prepared.priority = request->priority();
    prepared.detokenize = request->detokenize();
    return absl::OkStatus();
  };
  grpc::Status status;
  if (absl::Status s = prepare(); !s.ok()) {
    status = ToGrpcStatus(s);
  } else if (absl::StatusOr<LiveRequest*> live = admission.Register(prepared.request_id);
             !live.ok()) {
    status = ToGrpcStatus(live.status());
  } else {
    status = Forward(
        context, received, prepared, *live,
        [writer](v1::GenerateChunk& chunk) { return writer->Write(chunk); }, &outcome);
  }
  LogFinished(prepared.request_id.empty() ? request->request_id() : prepared.request_id, received,
              static_cast<int64_t>(prepared.prompt_token_ids.size()), outcome, status);
  return status;
}

grpc::Status InferenceService::Abort(grpc::ServerContext* /*context*/,
                                     const v1::AbortRequest* request, v1::AbortResponse* response) {
  if (request->request_id().empty()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("request_id: expected the id of a running request; got \"\""));
  }
  std::shared_ptr<LiveRequest> live;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(request->request_id());
    if (it != live_.end()) live = it->second;
  }
  response->set_found(live != nullptr);
  if (live == nullptr) return grpc::Status::OK;
  {
    absl::MutexLock lock(&live->mu);
    live->aborted = true;
    if (live->call != nullptr) live->call->TryCancel();
  }
  spdlog::info("[req={}] abort requested", request->request_id());
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext* /*context*/,
                                          const v1::ListModelsRequest* /*request*/,
                                          v1::ListModelsResponse* response) {
  *response->add_models() = model_info_;
  return grpc::Status::OK;
}

void InferenceService::BeginDrain() {
  absl::MutexLock lock(&mu_);
  if (!draining_) spdlog::info("draining: refusing new requests, {} in flight", in_flight_);
  draining_ = true;
}

bool InferenceService::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool InferenceService::WaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

int InferenceService::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace deepinfer::router
