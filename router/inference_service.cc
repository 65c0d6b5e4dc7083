#include "router/inference_service.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "router/image_prompt.h"
#include "router/prompt_block_hashes.h"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

constexpr int64_t kDefaultBlockSize = 16;
// Placements retried when a chosen worker vanished between the snapshot and the record.
constexpr int kPlaceTries = 3;

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

// The call's authorization metadata; nullopt when it sent none (or there is no call).
std::optional<absl::string_view> Authorization(const grpc::ServerContext* context) {
  if (context == nullptr) return std::nullopt;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

// `status` as a gRPC status; a tenant limit's wait also goes into `retry-after` trailing metadata.
grpc::Status Refuse(grpc::ServerContext* context, const absl::Status& status) {
  if (const int64_t retry = RetryAfterSeconds(status); retry > 0 && context != nullptr) {
    context->AddTrailingMetadata("retry-after", absl::StrCat(retry));
  }
  return ToGrpcStatus(status);
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
  absl::StatusOr<LiveRequest*> Register(const std::string& request_id,
                                        const std::string& tenant_id) {
    absl::MutexLock lock(&service_->mu_);
    auto [it, inserted] = service_->live_.try_emplace(request_id, nullptr);
    if (!inserted) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id: ", Quote(request_id), " is already running"));
    }
    it->second = std::make_shared<LiveRequest>();
    it->second->tenant_id = tenant_id;
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
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("default_timeout: expected > 0; got ",
                                                   absl::FormatDuration(options.default_timeout)));
  }
  DI_ASSIGN_OR_RETURN(
      std::unique_ptr<PlacementPolicy> policy,
      CreatePlacementPolicy(options.placement_policy, options.placement, "placement_policy"));
  DI_ASSIGN_OR_RETURN(api::GenerationDefaults defaults,
                      api::ParseGenerationDefaults(assets->generation_config()));
  return std::unique_ptr<InferenceService>(
      new InferenceService(registry, assets, std::move(options), defaults, std::move(policy)));
}

InferenceService::InferenceService(WorkerRegistry* registry, const engine::ModelAssets* assets,
                                   InferenceServiceOptions options,
                                   api::GenerationDefaults defaults,
                                   std::unique_ptr<PlacementPolicy> policy)
    : registry_(registry),
      assets_(assets),
      options_(std::move(options)),
      defaults_(defaults),
      limits_{.vocab_size = assets->config().vocab_size,
              .max_context_tokens = assets->config().max_position_embeddings,
              .max_image_bytes = options_.max_image_bytes,
              .max_chat_text_bytes = options_.max_chat_text_bytes},
      encoders_(registry, options_.model_id, options_.max_message_bytes),
      metrics_(options_.metrics),
      policy_(std::move(policy)) {
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

absl::StatusOr<std::shared_ptr<const Tenant>> InferenceService::Authorize(
    const grpc::ServerContext* context) {
  if (options_.tenants == nullptr) return std::shared_ptr<const Tenant>();
  DI_ASSIGN_OR_RETURN(std::shared_ptr<const Tenant> tenant,
                      options_.tenants->Authenticate(Authorization(context)));
  DI_RETURN_IF_ERROR(options_.tenants->CheckModel(*tenant, options_.model_id));
  return tenant;
}

std::string InferenceService::NewRequestId(absl::string_view prefix) {
  uint64_t bits;
  {
    absl::MutexLock lock(&mu_);
    bits = absl::Uniform<uint64_t>(bitgen_);
  }
  return absl::StrFormat("%s-%016x", prefix, bits);
}

absl::StatusOr<InferenceService::Placement> InferenceService::Place(
    const Prepared& request, absl::Span<const std::string> exclude) {
  absl::MutexLock lock(&placement_mu_);
  absl::StatusOr<Placement> placement;
  for (int i = 0; i < kPlaceTries; ++i) {
    placement = PlaceOnce(request, exclude);
    if (placement.status().code() != absl::StatusCode::kAborted) break;
  }
  if (placement.status().code() == absl::StatusCode::kAborted) {
    return absl::UnavailableError(absl::StrCat("placement: ", placement.status().message()));
  }
  return placement;
}

absl::StatusOr<InferenceService::Placement> InferenceService::PlaceOnce(
    const Prepared& request, absl::Span<const std::string> exclude) {
  const std::vector<WorkerSnapshot> live = registry_->ListLive(options_.model_id);
  // Registration makes every prefill/decode worker of a model agree on block size and seed.
  int64_t block_size = kDefaultBlockSize;
  uint64_t hash_seed = 0;
  auto excluded = [&](const WorkerSnapshot& w) {
    return std::find(exclude.begin(), exclude.end(), w.info.worker_id()) != exclude.end();
  };
  bool has_prefill = false;  // outside `exclude`
  bool has_decode = false;
  bool any_decode = false;
  for (const WorkerSnapshot& w : live) {
    const internal::v1::WorkerRole role = w.info.role();
    if (role != internal::v1::WORKER_ROLE_PREFILL && role != internal::v1::WORKER_ROLE_DECODE) {
      continue;
    }
    if (w.info.block_size() > 0) block_size = w.info.block_size();
    hash_seed = w.info.block_hash_seed();
    any_decode = any_decode || role == internal::v1::WORKER_ROLE_DECODE;
    if (excluded(w)) continue;
    has_prefill = has_prefill || role == internal::v1::WORKER_ROLE_PREFILL;
    has_decode = has_decode || role == internal::v1::WORKER_ROLE_DECODE;
  }
  if (!any_decode) {
    return absl::UnavailableError(
        absl::StrCat("no decode worker for model ", Quote(options_.model_id), ": none is live"));
  }
  const std::vector<uint64_t> hashes =
      PromptBlockHashes(request.prompt_token_ids, hash_seed, request.cache_salt, block_size,
                        request.image_spans);

  std::vector<CandidateWorker> candidates;
  std::vector<const WorkerSnapshot*> snapshots;  // parallel to candidates
  for (const WorkerSnapshot& w : live) {
    const internal::v1::WorkerRole role = w.info.role();
    const bool prefill = role == internal::v1::WORKER_ROLE_PREFILL;
    if (!prefill && role != internal::v1::WORKER_ROLE_DECODE) continue;
    // A role left with no candidate outside `exclude` falls back to all its workers.
    if (excluded(w) && (prefill ? has_prefill : has_decode)) continue;
    CandidateWorker c;
    c.worker_id = w.info.worker_id();
    c.role = role;
    c.can_prefill = !prefill && w.info.can_prefill();
    c.queue_depth = static_cast<int64_t>(w.load.queue_depth()) + (prefill ? w.placed_requests : 0);
    c.queued_input_tokens = static_cast<int64_t>(w.load.queued_input_tokens()) + w.placed_tokens;
    c.running_sequences =
        static_cast<int64_t>(w.load.running_sequences()) + (prefill ? 0 : w.placed_requests);
    c.total_kv_blocks = w.has_load ? static_cast<int64_t>(w.load.total_kv_blocks())
                                   : static_cast<int64_t>(w.info.kv_capacity_blocks());
    const int64_t free = w.has_load ? static_cast<int64_t>(w.load.free_kv_blocks())
                                    : static_cast<int64_t>(w.info.kv_capacity_blocks());
    c.free_kv_blocks = std::clamp<int64_t>(free - w.placed_blocks, 0, c.total_kv_blocks);
    c.cached_prefix_blocks = registry_->PrefixOverlap(c.worker_id, hashes);
    if (!prefill && w.has_load && std::isfinite(w.load.decode_tokens_per_second())) {
      c.decode_tokens_per_second = std::max(0.0, w.load.decode_tokens_per_second());
    }
    candidates.push_back(std::move(c));
    snapshots.push_back(&w);
  }

  PlacementRequest preq;
  preq.request_id = request.request_id;
  preq.prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
  preq.block_size = block_size;
  // The prompt plus the first generated token.
  preq.blocks_needed = (preq.prompt_tokens + 1 + block_size - 1) / block_size;
  if (options_.placement.max_exposed_transfer_fraction > 0 ||
      options_.placement.load_aware_local_prefill) {
    preq.transfer_cost = [this](int64_t tokens) { return transfer_cost_.Predict(tokens); };
  }
  absl::StatusOr<PlacementDecision> decision = policy_->Decide(preq, candidates);
  if (decision.status().code() == absl::StatusCode::kResourceExhausted) {
    // The registry's free-block counts are estimates (last load report minus what was placed
    // since); the decode node's engine is the authority on KV room, and refuses with
    // RESOURCE_EXHAUSTED itself when the blocks really are not there.
    spdlog::debug("[req={}] placement: {}; placing without the KV-room estimate",
                  request.request_id, std::string(decision.status().message()));
    preq.blocks_needed = 0;
    decision = policy_->Decide(preq, candidates);
  }
  if (!decision.ok()) {
    if (decision.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat(
          "no live prefill worker for model ", Quote(options_.model_id),
          ", and the decode workers with room cannot prefill (", decision.status().message(), ")"));
    }
    // Snapshots built here are well-formed; anything else is a bug.
    return absl::InternalError(absl::StrCat("placement: ", decision.status().ToString()));
  }

  const WorkerSnapshot* decode = nullptr;
  const WorkerSnapshot* prefill = nullptr;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].worker_id == decision->decode_worker) decode = snapshots[i];
    if (candidates[i].worker_id == decision->prefill_worker) prefill = snapshots[i];
  }
  if (decode == nullptr || (!decision->prefill_worker.empty() && prefill == nullptr)) {
    return absl::InternalError(absl::StrCat("placement chose an unknown worker: decode ",
                                            Quote(decision->decode_worker), ", prefill ",
                                            Quote(decision->prefill_worker)));
  }
  Placement placement;
  placement.decode_blocks = preq.blocks_needed;
  placement.decode_tokens = prefill == nullptr ? decision->uncached_tokens : 0;
  absl::StatusOr<WorkerSnapshot> recorded_decode =
      registry_->RecordPlacement(decode->info.worker_id(), decode->info.incarnation(),
                                 placement.decode_tokens, placement.decode_blocks);
  if (!recorded_decode.ok()) return absl::AbortedError(recorded_decode.status().message());
  placement.decode = std::move(*recorded_decode);
  if (prefill != nullptr) {
    placement.prefill_tokens = decision->uncached_tokens;
    absl::StatusOr<WorkerSnapshot> recorded_prefill = registry_->RecordPlacement(
        prefill->info.worker_id(), prefill->info.incarnation(), placement.prefill_tokens, 0);
    if (!recorded_prefill.ok()) {
      registry_->ReleasePlacement(placement.decode.info.worker_id(),
                                  placement.decode.info.incarnation(), placement.decode.load_epoch,
                                  placement.decode_tokens, placement.decode_blocks);
      return absl::AbortedError(recorded_prefill.status().message());
    }
    placement.prefill = std::move(*recorded_prefill);
    placement.prefill_worker_id = placement.prefill->info.worker_id();
    placement.prefill_address = placement.prefill->info.address();
  }
  if (metrics_ != nullptr) metrics_->RecordPlacement(decision->outcome);
  spdlog::debug(
      "[req={}] placed by {}: decode={} prefill={} outcome={} prompt_tokens={} uncached={} "
      "prompt_blocks={} candidates={} ({})",
      request.request_id, std::string(policy_->name()), decision->decode_worker,
      decision->prefill_worker.empty() ? std::string("local") : decision->prefill_worker,
      std::string(PlacementOutcomeName(decision->outcome)), preq.prompt_tokens,
      decision->uncached_tokens, hashes.size(), candidates.size(), decision->reason);
  return placement;
}

void InferenceService::ExpectHistory(const Prepared& request,
                                     const internal::v1::WorkerInfo& decode,
                                     const std::vector<uint32_t>& completion) const {
  if (completion.empty() || decode.block_size() <= 0) return;
  // The last generated token was sampled, never fed: its KV is not there.
  std::vector<uint32_t> tokens;
  tokens.reserve(request.prompt_token_ids.size() + completion.size() - 1);
  tokens.insert(tokens.end(), request.prompt_token_ids.begin(), request.prompt_token_ids.end());
  tokens.insert(tokens.end(), completion.begin(), completion.end() - 1);
  const std::vector<uint64_t> hashes =
      PromptBlockHashes(tokens, decode.block_hash_seed(), request.cache_salt, decode.block_size(),
                        request.image_spans);
  registry_->ExpectStored(decode.worker_id(), decode.incarnation(), hashes);
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
    absl::StatusOr<Placement> placement = Place(request, exclude);
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
      ~ReleaseOnExit() {
        registry->ReleasePlacement(p.decode.info.worker_id(), p.decode.info.incarnation(),
                                   p.decode.load_epoch, p.decode_tokens, p.decode_blocks);
        if (p.prefill.has_value()) {
          registry->ReleasePlacement(p.prefill->info.worker_id(), p.prefill->info.incarnation(),
                                     p.prefill->load_epoch, p.prefill_tokens, 0);
        }
      }
    } release_on_exit{registry_, *placement};
    outcome->attempts = attempt + 1;
    outcome->decode_worker = placement->decode.info.worker_id();
    outcome->prefill_worker =
        placement->prefill_worker_id.empty() ? "colocated" : placement->prefill_worker_id;

    internal::v1::DecodeRequest decode_request;
    decode_request.set_request_id(attempt == 0 ? request.request_id
                                               : absl::StrCat(request.request_id, "#r", attempt));
    decode_request.mutable_prompt_token_ids()->Add(request.prompt_token_ids.begin(),
                                                   request.prompt_token_ids.end());
    *decode_request.mutable_sampling() = request.sampling;
    decode_request.set_cache_salt(request.cache_salt);
    decode_request.set_priority(request.priority);
    decode_request.set_prefill_address(placement->prefill_address);
    decode_request.set_deadline_unix_us(absl::ToUnixMicros(deadline));
    decode_request.set_detokenize(request.detokenize);
    for (const internal::v1::EmbeddingHandle& image : request.images) {
      *decode_request.add_images() = image;
    }

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
    std::vector<uint32_t> completion;  // the generated tokens, for ExpectHistory
    absl::Time last_token;
    v1::GenerateChunk chunk;
    while (reader->Read(&chunk)) {
      if (client_gone) continue;  // draining the cancelled call
      chunk.set_request_id(request.request_id);
      if (chunk.token_ids_size() > 0) {
        const absl::Time now = absl::Now();
        if (outcome->first_token_us < 0) {
          outcome->first_token_us = MicrosSince(received);
        } else if (metrics_ != nullptr) {
          metrics_->ObserveInterToken(absl::ToDoubleSeconds(now - last_token),
                                      chunk.token_ids_size());
        }
        last_token = now;
        outcome->completion_tokens += chunk.token_ids_size();
        completion.insert(completion.end(), chunk.token_ids().begin(), chunk.token_ids().end());
      }
      if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        finished = true;
        if (chunk.has_usage()) {
          outcome->cached_prompt_tokens = chunk.usage().cached_prompt_tokens();
          outcome->queued_us = static_cast<int64_t>(chunk.usage().timing().queued_us());
          const v1::Timing& t = chunk.usage().timing();
          if (placement->prefill.has_value() && t.prefill_compute_us() > 0) {
            transfer_cost_.Observe(placement->prefill_tokens,
                                   static_cast<double>(t.prefill_compute_us()),
                                   static_cast<double>(t.kv_transfer_exposed_us()));
          }
        }
        if (!request.images.empty()) {
          chunk.mutable_usage()->set_images(static_cast<uint32_t>(request.images.size()));
          chunk.mutable_usage()->set_cached_images(request.cached_images);
        }
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
    if (status.ok() && finished) {
      ExpectHistory(request, placement->decode.info, completion);
      return status;
    }
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

void InferenceService::Finish(absl::string_view request_id, absl::Time received,
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
  if (metrics_ == nullptr) return;
  FinishedRequest finished;
  if (outcome.aborted) {
    finished.outcome = RequestOutcome::kAborted;
  } else if (status.ok()) {
    finished.outcome = RequestOutcome::kOk;
  } else if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    finished.outcome = RequestOutcome::kInvalid;
  } else if (status.error_code() == grpc::StatusCode::CANCELLED) {
    finished.outcome = RequestOutcome::kCancelled;
  } else {
    finished.outcome = RequestOutcome::kError;
  }
  // Tokens count for requests that reached a worker.
  if (outcome.attempts > 0) finished.prompt_tokens = prompt_tokens;
  finished.generation_tokens = outcome.completion_tokens;
  finished.cached_prompt_tokens = outcome.cached_prompt_tokens;
  if (outcome.first_token_us >= 0) finished.time_to_first_token_s = outcome.first_token_us / 1e6;
  finished.e2e_s = static_cast<double>(MicrosSince(received)) / 1e6;
  if (outcome.queued_us >= 0) finished.queue_time_s = static_cast<double>(outcome.queued_us) / 1e6;
  metrics_->RecordFinished(finished);
}

grpc::Status InferenceService::Serve(grpc::ServerContext* context,
                                     absl::string_view client_request_id, int32_t priority,
                                     absl::FunctionRef<absl::Status(Prepared*)> prepare,
                                     absl::FunctionRef<bool(v1::GenerateChunk&)> write) {
  const absl::Time received = absl::Now();
  // Tenant checks first: a refused call costs no validation, tokenization or placement.
  std::shared_ptr<const Tenant> tenant;
  std::unique_ptr<Tenants::Stream> tenant_stream;
  if (options_.tenants != nullptr) {
    absl::StatusOr<std::shared_ptr<const Tenant>> authorized = Authorize(context);
    absl::Status refused = authorized.status();
    if (refused.ok()) {
      tenant = *authorized;
      refused = options_.tenants->CheckPriority(*tenant, priority);
    }
    if (refused.ok()) {
      absl::StatusOr<std::unique_ptr<Tenants::Stream>> admitted =
          options_.tenants->Admit(*tenant);
      refused = admitted.status();
      if (admitted.ok()) tenant_stream = std::move(*admitted);
    }
    if (!refused.ok()) {
      spdlog::info("[req={}] refused: tenant={} {}",
                   client_request_id.empty() ? std::string("-") : std::string(client_request_id),
                   tenant == nullptr ? std::string("-") : tenant->id, refused.ToString());
      if (metrics_ != nullptr) metrics_->RecordFinished({.outcome = RequestOutcome::kError});
      return Refuse(context, refused);
    }
  }
  Admission admission(this);
  if (!admission.status().ok()) {
    const grpc::Status refused = ToGrpcStatus(admission.status());
    if (metrics_ != nullptr) metrics_->RecordFinished({.outcome = RequestOutcome::kError});
    return refused;
  }
  Outcome outcome;
  Prepared prepared;
  grpc::Status status;
  absl::Status prepared_status = prepare(&prepared);
  if (prepared_status.ok() && tenant != nullptr) {
    prepared.cache_salt = Tenants::CacheSalt(*tenant, prepared.cache_salt);
    tenant_stream->ChargePromptTokens(static_cast<int64_t>(prepared.prompt_token_ids.size()));
  }
  if (!prepared_status.ok()) {
    status = ToGrpcStatus(prepared_status);
  } else if (absl::StatusOr<LiveRequest*> live =
                 admission.Register(prepared.request_id, tenant == nullptr ? "" : tenant->id);
             !live.ok()) {
    status = ToGrpcStatus(live.status());
  } else {
    status = Forward(context, received, prepared, *live, write, &outcome);
  }
  if (tenant_stream != nullptr) tenant_stream->ChargeCompletionTokens(outcome.completion_tokens);
  Finish(prepared.request_id.empty() ? client_request_id : prepared.request_id, received,
         static_cast<int64_t>(prepared.prompt_token_ids.size()), outcome, status);
  return status;
}

absl::Status InferenceService::PrepareImages(grpc::ServerContext* context,
                                             const api::ChatPrompt& prompt,
                                             const std::vector<int32_t>& rendered,
                                             Prepared* prepared) {
  std::vector<std::string> files;
  std::vector<std::string> hashes;
  files.reserve(prompt.images.size());
  for (const api::ChatImage& image : prompt.images) {
    files.push_back(image.bytes);
    hashes.push_back(Sha256(image.bytes));
  }
  absl::Time deadline = absl::Now() + options_.default_timeout;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = absl::FromChrono(context->deadline());
  }
  absl::StatusOr<EncodedImages> encoded =
      encoders_.Encode(context, prepared->request_id, files, hashes, deadline);
  if (!encoded.ok()) {
    // "images[k].data: reason" from the encoder names the client's part instead.
    absl::string_view message = encoded.status().message();
    size_t k = 0;
    if (encoded.status().code() == absl::StatusCode::kInvalidArgument &&
        absl::ConsumePrefix(&message, "images[")) {
      const size_t close = message.find(']');
      if (close != absl::string_view::npos &&
          absl::SimpleAtoi(message.substr(0, close), &k) && k < prompt.images.size()) {
        message.remove_prefix(close + 1);
        const size_t colon = message.find(": ");
        if (colon != absl::string_view::npos) message.remove_prefix(colon + 2);
        const api::ChatImage& image = prompt.images[k];
        return absl::InvalidArgumentError(absl::StrCat("messages[", image.message_index,
                                                       "].content[", image.part_index,
                                                       "].image: ", message));
      }
    }
    return encoded.status();
  }
  std::vector<int64_t> rows;
  for (const internal::v1::EmbeddingHandle& e : encoded->embeddings) {
    rows.push_back(static_cast<int64_t>(e.num_tokens()));
  }
  DI_ASSIGN_OR_RETURN(
      ExpandedPrompt expanded,
      ExpandImagePlaceholders(rendered, assets_->config().image_token_id, rows));
  prepared->prompt_token_ids = std::move(expanded.token_ids);
  for (size_t k = 0; k < encoded->embeddings.size(); ++k) {
    engine::ImageSpan span;
    span.content_hash = hashes[k];
    span.position = expanded.image_positions[k];
    span.num_tokens = rows[k];
    prepared->image_spans.push_back(std::move(span));
  }
  prepared->images = std::move(encoded->embeddings);
  prepared->cached_images = encoded->cache_hits;
  spdlog::debug("[req={}] {} images encoded by {} ({} from its cache)", prepared->request_id,
                prepared->images.size(), encoded->encoder_id, prepared->cached_images);
  return absl::OkStatus();
}

grpc::Status InferenceService::Chat(grpc::ServerContext* context, const v1::ChatRequest* request,
                                    grpc::ServerWriter<v1::ChatChunk>* writer) {
  auto prepare = [&](Prepared* prepared) -> absl::Status {
    DI_RETURN_IF_ERROR(CheckModel(request->model()));
    DI_ASSIGN_OR_RETURN(api::ChatPrompt prompt, api::ConvertChatMessages(*request, limits_));
    if (!prompt.images.empty()) {
      const api::ChatImage& image = prompt.images.front();
      const std::string field = absl::StrCat("messages[", image.message_index, "].content[",
                                             image.part_index, "].image");
      if (assets_->config().image_token_id < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": model ", Quote(options_.model_id), " accepts no images (no image token)"));
      }
      if (!encoders_.HasEncoder()) {
        return absl::UnavailableError(absl::StrCat(
            field, ": no vision encoder for model ", Quote(options_.model_id), " is live"));
      }
    }
    DI_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        assets_->RenderAndTokenize(prompt.messages, prompt.add_generation_prompt));
    prepared->request_id =
        request->request_id().empty() ? NewRequestId("chat") : request->request_id();
    if (!prompt.images.empty()) {
      DI_RETURN_IF_ERROR(PrepareImages(context, prompt, ids, prepared));
    } else {
      prepared->prompt_token_ids.assign(ids.begin(), ids.end());
    }
    DI_ASSIGN_OR_RETURN(
        prepared->sampling,
        api::ResolveSampling(request->sampling(), defaults_, limits_,
                             static_cast<int64_t>(prepared->prompt_token_ids.size())));
    prepared->cache_salt = request->cache_salt();
    prepared->priority = request->priority();
    prepared->detokenize = true;
    return absl::OkStatus();
  };
  return Serve(context, request->request_id(), request->priority(), prepare,
               [writer](v1::GenerateChunk& chunk) { return writer->Write(ToChatChunk(chunk)); });
}

grpc::Status InferenceService::Generate(grpc::ServerContext* context,
                                        const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateChunk>* writer) {
  auto prepare = [&](Prepared* prepared) -> absl::Status {
    DI_RETURN_IF_ERROR(CheckModel(request->model()));
    DI_RETURN_IF_ERROR(api::ValidateGenerateRequest(*request, limits_));
    DI_ASSIGN_OR_RETURN(prepared->sampling,
                        api::ResolveSampling(request->sampling(), defaults_, limits_,
                                             request->prompt_token_ids_size()));
    prepared->prompt_token_ids.assign(request->prompt_token_ids().begin(),
                                      request->prompt_token_ids().end());
    prepared->request_id =
        request->request_id().empty() ? NewRequestId("gen") : request->request_id();
    prepared->cache_salt = request->cache_salt();
    prepared->priority = request->priority();
    prepared->detokenize = request->detokenize();
    return absl::OkStatus();
  };
  return Serve(context, request->request_id(), request->priority(), prepare,
               [writer](v1::GenerateChunk& chunk) { return writer->Write(chunk); });
}

grpc::Status InferenceService::Abort(grpc::ServerContext* context,
                                     const v1::AbortRequest* request, v1::AbortResponse* response) {
  absl::StatusOr<std::shared_ptr<const Tenant>> tenant = Authorize(context);
  if (!tenant.ok()) return Refuse(context, tenant.status());
  const std::string tenant_id = *tenant == nullptr ? "" : (*tenant)->id;
  if (request->request_id().empty()) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("request_id: expected the id of a running request; got \"\""));
  }
  std::shared_ptr<LiveRequest> live;
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(request->request_id());
    // Another tenant's request is not found (not even its existence is revealed).
    if (it != live_.end() && it->second->tenant_id == tenant_id) live = it->second;
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

grpc::Status InferenceService::ListModels(grpc::ServerContext* context,
                                          const v1::ListModelsRequest* /*request*/,
                                          v1::ListModelsResponse* response) {
  // context is null for the HTTP API's in-process listing, which checks the key itself.
  if (context != nullptr) {
    absl::StatusOr<std::shared_ptr<const Tenant>> tenant = Authorize(context);
    if (!tenant.ok()) return Refuse(context, tenant.status());
  }
  v1::ModelInfo* model = response->add_models();
  *model = model_info_;
  model->set_supports_images(assets_->config().image_token_id >= 0 && encoders_.HasEncoder());
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
