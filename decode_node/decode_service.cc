#include "decode_node/decode_service.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "api/worker_request_check.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "node/image_inputs.h"
#include "spdlog/spdlog.h"

namespace deepinfer::decode_node {
namespace {

using internal::v1::DecodeRequest;

// How often blocked handlers look at client cancellation, Abort and deadlines.
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);
// How long the dispatcher waits for notifications before checking for Stop.
constexpr absl::Duration kDispatchInterval = absl::Milliseconds(50);
// After a successful Prefill, how long past the transfer deadline the notifications may take.
constexpr absl::Duration kNotificationSlack = absl::Seconds(1);

v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::kAborted:
      return v1::FINISH_REASON_ABORTED;
  }
  return v1::FINISH_REASON_ERROR;
}

// The RPC's deadline (a wall-clock time), or InfiniteFuture when it has none.
absl::Time ContextDeadline(const grpc::ServerContext& context) {
  const auto d = context.deadline();
  // No deadline reads as time_point::max(); anything that far out is "none".
  if (d >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 100)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

std::string CodeAndMessage(const grpc::Status& status) { return FromGrpcStatus(status).ToString(); }

}  // namespace

// One Generate call: the engine's outputs are queued here by the engine thread (which must not
// block) and written to the client by the handler thread. Shared with the engine's callback, so
// it outlives the handler when the engine ends the request later (deferred release).
struct DecodeService::Call {
  std::string request_id;
  std::string engine_id;
  bool return_logprobs = false;
  bool detokenize = false;
  std::atomic<bool> aborted{false};  // Abort RPC
  bool ended_aborted = false;        // the stream ended with FINISH_REASON_ABORTED (handler only)

  absl::Mutex mu;
  std::deque<engine::EngineOutput> outputs ABSL_GUARDED_BY(mu);

  bool HasOutput() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !outputs.empty(); }
};

DecodeService::DecodeService(node::WorkerRuntime* runtime, DecodeServiceOptions options)
    : runtime_(runtime), options_(options) {}

DecodeService::~DecodeService() { Stop(); }

absl::Status DecodeService::Start() {
  if (started_) return absl::FailedPreconditionError("DecodeService: already started");
  limits_.vocab_size = runtime_->assets().config().vocab_size;
  limits_.max_context_tokens = runtime_->assets().config().max_position_embeddings;
  started_ = true;
  dispatcher_ = std::thread([this] { DispatchLoop(); });
  reaper_ = std::thread([this] { ReapLoop(); });
  return absl::OkStatus();
}

void DecodeService::Stop() {
  if (!started_) return;
  started_ = false;
  stop_dispatch_.store(true);
  if (dispatcher_.joinable()) dispatcher_.join();
  {
    absl::MutexLock l(&reap_mu_);
    stop_ = true;
    reap_cv_.SignalAll();
  }
  if (reaper_.joinable()) reaper_.join();
}

void DecodeService::ContributeStats(internal::v1::WorkerStats* stats) const {
  stats->set_requests_ok(requests_ok_.load());
  stats->set_requests_failed(requests_failed_.load());
  stats->set_requests_cancelled(requests_cancelled_.load());
}

size_t DecodeService::pending_releases() const {
  absl::MutexLock l(&reap_mu_);
  return releases_.size();
}

absl::Status DecodeService::Validate(const DecodeRequest& request,
                                     engine::SamplingParams* sampling) const {
  DI_RETURN_IF_ERROR(api::CheckWorkerRequest(request, limits_));
  DI_ASSIGN_OR_RETURN(*sampling,
                      api::ToEngineSamplingParams(request.sampling(), defaults_, limits_,
                                                  request.prompt_token_ids_size()));
  return absl::OkStatus();
}

grpc::Status DecodeService::Generate(grpc::ServerContext* context, const DecodeRequest* request,
                                     grpc::ServerWriter<v1::GenerateChunk>* writer) {
  node::WorkerRuntime::RequestScope scope(runtime_);
  if (!scope.ok()) return ToGrpcStatus(scope.status());

  bool ended_aborted = false;
  const absl::Status status = [&]() -> absl::Status {
    engine::SamplingParams sampling;
    DI_RETURN_IF_ERROR(Validate(*request, &sampling));
    const absl::Time now = Now();
    absl::Time deadline = ClockDeadline(ContextDeadline(*context));
    if (request->deadline_unix_us() != 0) {
      deadline = std::min(deadline, absl::FromUnixMicros(request->deadline_unix_us()));
    }
    if (now >= deadline) {
      return absl::DeadlineExceededError("the request's deadline passed before it started");
    }
    const uint64_t serial = next_tag_.fetch_add(1);
    auto call = std::make_shared<Call>();
    call->request_id = request->request_id();
    call->engine_id = absl::StrCat(request->request_id(), "#", serial);
    call->return_logprobs = sampling.return_logprobs;
    call->detokenize = request->detokenize();

    engine::EngineRequest er;
    er.request_id = call->engine_id;
    er.prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
    er.sampling = std::move(sampling);
    er.cache_salt = request->cache_salt();
    er.priority = request->priority();
    // Colocated prefill needs the embeddings; a remote prefill only the hashes (the request's
    // handles go on to the prefill node as they are).
    DI_ASSIGN_OR_RETURN(er.images,
                        node::ImagesFromHandles(request->images(), er.prompt,
                                                runtime_->model()->config().image_token_id,
                                                runtime_->model()->config().hidden_size,
                                                /*with_data=*/request->prefill_address().empty()));

    AddLive(call);
    absl::Status st =
        request->prefill_address().empty()
            ? RunColocated(context, call, std::move(er), deadline, writer)
            : RunDisaggregated(context, *request, call, serial, std::move(er), deadline, writer);
    RemoveLive(*call);
    ended_aborted = call->ended_aborted;
    return st;
  }();

  switch (status.code()) {
    case absl::StatusCode::kOk:
      (ended_aborted ? requests_cancelled_ : requests_ok_).fetch_add(1);
      break;
    case absl::StatusCode::kCancelled:
      requests_cancelled_.fetch_add(1);
      break;
    default:
      requests_failed_.fetch_add(1);
      break;
  }
  if (!status.ok() && status.code() != absl::StatusCode::kCancelled &&
      status.code() != absl::StatusCode::kInvalidArgument) {
    spdlog::warn("[req={}] Generate failed: {}", request->request_id(), status.ToString());
  }
  return ToGrpcStatus(status);
}

engine::OutputCallback DecodeService::QueueOutputs(const std::shared_ptr<Call>& call) {
  return [call](const engine::EngineOutput& output) {
    absl::MutexLock l(&call->mu);
    call->outputs.push_back(output);
  };
}

absl::Status DecodeService::RunColocated(grpc::ServerContext* context, std::shared_ptr<Call> call,
                                         engine::EngineRequest engine_request, absl::Time deadline,
                                         grpc::ServerWriter<v1::GenerateChunk>* writer) {
  if (!runtime_->options().can_prefill) {
    return absl::FailedPreconditionError(
        "prefill_address: empty but this node was started without --can_prefill");
  }
  DI_RETURN_IF_ERROR(runtime_->engine()->Submit(std::move(engine_request), QueueOutputs(call)));
  return Stream(context, *call, deadline, /*cached_prompt_tokens=*/-1, /*prefill_us=*/-1,
                /*remote=*/nullptr, writer);
}

absl::Status DecodeService::RunDisaggregated(grpc::ServerContext* context, const DecodeRequest& req,
                                             std::shared_ptr<Call> call, uint64_t tag,
                                             engine::EngineRequest engine_request,
                                             absl::Time deadline,
                                             grpc::ServerWriter<v1::GenerateChunk>* writer) {
  engine::LlmEngine* const engine = runtime_->engine();
  const absl::Time start = Now();
  DI_ASSIGN_OR_RETURN(
      engine::KvReservation reservation,
      engine->ReserveForRemotePrefill(std::move(engine_request), QueueOutputs(call)));
  // From here on the blocks stay reserved until CompleteRemotePrefill or FailRemotePrefill.
  RegisterTag(tag);

  const std::string& address = req.prefill_address();
  const absl::Time transfer_deadline = std::min(deadline, start + options_.prefill_timeout);
  internal::v1::PrefillRequest prefill;
  prefill.set_request_id(absl::StrCat(req.request_id(), "@", runtime_->worker_id(), "#", tag));
  *prefill.mutable_prompt_token_ids() = req.prompt_token_ids();
  *prefill.mutable_sampling() = req.sampling();
  prefill.set_cache_salt(req.cache_salt());
  *prefill.mutable_images() = req.images();
  internal::v1::KvDestination* dst = prefill.mutable_destination();
  dst->set_agent_name(runtime_->kv_metadata().agent_name());
  dst->set_incarnation(runtime_->kv_metadata().incarnation());
  for (int32_t b : reservation.block_ids) dst->add_block_ids(static_cast<uint32_t>(b));
  dst->set_block_size(reservation.block_size);
  dst->set_skip_blocks(static_cast<uint32_t>(reservation.cached_tokens / reservation.block_size));
  dst->set_notification_tag(tag);
  *dst->mutable_metadata() = runtime_->kv_metadata();
  *dst->mutable_pool() = runtime_->pool_layout();
  prefill.set_deadline_unix_us(absl::ToUnixMicros(transfer_deadline));

  internal::v1::Prefill::Stub* stub = PrefillStub(address);
  grpc::ClientContext rpc;
  rpc.set_deadline(absl::ToChronoTime(RealDeadline(transfer_deadline)));
  internal::v1::PrefillResponse response;
  absl::Mutex mu;
  bool done = false;
  grpc::Status rpc_status;
  stub->async()->Prefill(&rpc, &prefill, &response, [&](grpc::Status s) {
    absl::MutexLock l(&mu);
    rpc_status = std::move(s);
    done = true;
  });
  // Why we stopped waiting for the prefill node, if we did.
  enum class Why { kNone, kClientCancel, kAbort, kDeadline } why = Why::kNone;
  {
    absl::MutexLock l(&mu);
    while (!mu.AwaitWithTimeout(absl::Condition(&done), kPollInterval)) {
      if (why != Why::kNone) continue;
      if (context->IsCancelled()) {
        why = Why::kClientCancel;
      } else if (call->aborted.load()) {
        why = Why::kAbort;
      } else if (Now() >= deadline) {
        why = Why::kDeadline;
      }
      if (why != Why::kNone) rpc.TryCancel();
    }
  }

  if (rpc_status.ok()) {
    // The prefill node answers after the notifications were delivered, but they may still sit in
    // the agent's queue or the dispatcher's hands.
    const bool landed = WaitTag(tag, transfer_deadline + kNotificationSlack);
    ReleaseTag(tag);
    if (!landed) {
      // Prefill returned, so its writes are over: the blocks can go now.
      const absl::Status failed = absl::UnavailableError(absl::StrCat(
          "prefill node ", address, " failed: it answered OK but the KV notifications for tag ",
          tag, " did not all arrive"));
      absl::Status st = engine->FailRemotePrefill(call->engine_id, failed);
      if (!st.ok()) spdlog::warn("[req={}] FailRemotePrefill: {}", req.request_id(), st.ToString());
      return failed;
    }
    engine::StepOutput first;
    first.token = static_cast<int32_t>(response.first_token_id());
    first.logprob = response.first_token_logprob().logprob();
    for (const auto& t : response.first_token_logprob().top()) {
      first.top.push_back({static_cast<int32_t>(t.token_id()), t.logprob()});
    }
    DI_RETURN_IF_ERROR(engine->CompleteRemotePrefill(call->engine_id, first));
    // A cancel, Abort or deadline that raced with the answer is handled by Stream.
    return Stream(context, *call, deadline, response.cached_prompt_tokens(),
                  absl::ToInt64Microseconds(Now() - start), &response, writer);
  }

  ReleaseTag(tag);
  absl::Status outcome;
  if (why == Why::kClientCancel || (why == Why::kNone && context->IsCancelled())) {
    outcome = absl::CancelledError("the client cancelled the request during its prefill");
  } else if (why == Why::kAbort) {
    outcome = absl::CancelledError("aborted during the prefill");
  } else if (why == Why::kDeadline || Now() >= deadline) {
    outcome = absl::DeadlineExceededError("the request's deadline passed during its prefill");
  } else {
    outcome = absl::UnavailableError(
        absl::StrCat("prefill node ", address, " failed: ", CodeAndMessage(rpc_status)));
  }

  // Writes into the reservation may still be in flight: ask the prefill node to stop them.
  internal::v1::CancelPrefillRequest cancel;
  cancel.set_request_id(prefill.request_id());
  internal::v1::CancelPrefillResponse cancelled;
  grpc::ClientContext cancel_rpc;
  // A timeout of a real call: real time.
  cancel_rpc.set_deadline(absl::ToChronoTime(absl::Now() + options_.cancel_timeout));
  const grpc::Status cancel_status = stub->Cancel(&cancel_rpc, cancel, &cancelled);
  if (cancel_status.ok() && cancelled.quiesced()) {
    absl::Status st = engine->FailRemotePrefill(call->engine_id, outcome);
    if (!st.ok()) spdlog::warn("[req={}] FailRemotePrefill: {}", req.request_id(), st.ToString());
  } else {
    // No answer: no write can land once the transfer deadline, the agent's abort grace (after
    // which it tears the endpoint down) and a margin have passed.
    const absl::Time due = transfer_deadline + options_.agent_abort_grace + options_.quiesce_grace;
    spdlog::info("[req={}] prefill node {} did not confirm the cancel ({}); blocks freed in {}",
                 req.request_id(), address,
                 cancel_status.ok() ? "not quiesced" : CodeAndMessage(cancel_status),
                 absl::FormatDuration(due - Now()));
    ScheduleRelease({due, call->engine_id, outcome});
  }

  if (why == Why::kAbort) {
    // Abort ends the stream the way an abort while decoding does.
    v1::GenerateChunk chunk;
    chunk.set_request_id(req.request_id());
    chunk.set_finish_reason(v1::FINISH_REASON_ABORTED);
    chunk.mutable_usage()->set_prompt_tokens(req.prompt_token_ids_size());
    call->ended_aborted = true;
    writer->Write(chunk);
    return absl::OkStatus();
  }
  return outcome;
}

absl::Status DecodeService::Stream(grpc::ServerContext* context, Call& call, absl::Time deadline,
                                   int64_t cached_prompt_tokens, int64_t prefill_us,
                                   const internal::v1::PrefillResponse* remote,
                                   grpc::ServerWriter<v1::GenerateChunk>* writer) {
  engine::LlmEngine* const engine = runtime_->engine();
  // Remote prefill: the first token was emitted as the KV became ready; the second is the first
  // decoded here (Timing.decode_queue_us).
  const absl::Time kv_ready = Now();
  int64_t tokens_seen = 0;
  int64_t decode_queue_us = -1;
  auto count_tokens = [&](const engine::EngineOutput& o) {
    tokens_seen += static_cast<int64_t>(o.new_tokens.size());
    if (decode_queue_us < 0 && tokens_seen >= 2) {
      decode_queue_us = absl::ToInt64Microseconds(Now() - kv_ready);
    }
  };
  absl::Status ended;  // set when this side ended the request (cancel, deadline, client gone)
  bool abort_sent = false;
  bool finished = false;
  engine::EngineOutput last;

  auto fill = [&call](const engine::EngineOutput& o, v1::GenerateChunk* chunk) {
    chunk->set_request_id(call.request_id);
    for (const engine::StepOutput& s : o.new_tokens) {
      chunk->add_token_ids(static_cast<uint32_t>(s.token));
      if (call.return_logprobs) {
        v1::TokenLogprob* lp = chunk->add_logprobs();
        lp->set_token_id(static_cast<uint32_t>(s.token));
        lp->set_logprob(s.logprob);
        for (const engine::TokenLogprob& t : s.top) {
          v1::TopLogprob* top = lp->add_top();
          top->set_token_id(static_cast<uint32_t>(t.token));
          top->set_logprob(t.logprob);
        }
      }
    }
    if (call.detokenize) chunk->set_text_delta(o.text_delta);
  };

  while (!finished) {
    std::deque<engine::EngineOutput> batch;
    {
      absl::MutexLock l(&call.mu);
      call.mu.AwaitWithTimeout(absl::Condition(&call, &Call::HasOutput), kPollInterval);
      batch.swap(call.outputs);
    }
    for (engine::EngineOutput& o : batch) {
      count_tokens(o);
      if (o.finished) {
        last = std::move(o);
        finished = true;
        break;
      }
      if (!ended.ok() || (o.new_tokens.empty() && o.text_delta.empty())) continue;
      v1::GenerateChunk chunk;
      fill(o, &chunk);
      if (!writer->Write(chunk)) ended = absl::CancelledError("the client stream closed");
    }
    if (finished) break;
    if (ended.ok()) {
      if (context->IsCancelled()) {
        ended = absl::CancelledError("the client cancelled the request");
      } else if (Now() >= deadline) {
        ended = absl::DeadlineExceededError("the request's deadline passed while decoding");
      }
    }
    if (!abort_sent && (!ended.ok() || call.aborted.load())) {
      // The final output follows (with kAborted) once the engine has freed the blocks.
      engine->Abort(call.engine_id);
      abort_sent = true;
    }
  }

  if (!ended.ok()) return ended;
  if (!last.status.ok() && last.finish_reason != engine::FinishReason::kAborted) {
    return last.status;
  }
  v1::GenerateChunk chunk;
  fill(last, &chunk);
  chunk.set_finish_reason(ToProto(last.finish_reason));
  call.ended_aborted = last.finish_reason == engine::FinishReason::kAborted;
  if (!last.matched_stop.empty()) chunk.set_matched_stop(last.matched_stop);
  const engine::RequestUsage& u = last.usage;
  v1::Usage* usage = chunk.mutable_usage();
  usage->set_prompt_tokens(static_cast<uint32_t>(u.prompt_tokens));
  usage->set_cached_prompt_tokens(static_cast<uint32_t>(
      cached_prompt_tokens >= 0 ? cached_prompt_tokens : u.cached_prompt_tokens));
  usage->set_completion_tokens(static_cast<uint32_t>(u.completion_tokens));
  usage->set_draft_tokens(static_cast<uint32_t>(u.draft_tokens));
  usage->set_accepted_draft_tokens(static_cast<uint32_t>(u.accepted_draft_tokens));
  v1::Timing* timing = usage->mutable_timing();
  timing->set_queued_us(static_cast<uint64_t>(std::max<int64_t>(0, u.queue_us)));
  timing->set_prefill_us(static_cast<uint64_t>(
      prefill_us >= 0 ? prefill_us : std::max<int64_t>(0, u.first_token_us - u.queue_us)));
  timing->set_first_token_us(static_cast<uint64_t>(std::max<int64_t>(0, u.first_token_us)));
  timing->set_total_us(static_cast<uint64_t>(std::max<int64_t>(0, u.total_us)));
  if (remote != nullptr) {
    timing->set_prefill_compute_us(remote->compute_us());
    timing->set_kv_transfer_us(remote->transfer_us());
    timing->set_kv_transfer_exposed_us(remote->transfer_exposed_us());
    if (decode_queue_us >= 0) timing->set_decode_queue_us(static_cast<uint64_t>(decode_queue_us));
  }
  if (!writer->Write(chunk)) return absl::CancelledError("the client stream closed");
  return absl::OkStatus();
}

grpc::Status DecodeService::Abort(grpc::ServerContext* /*context*/,
                                  const internal::v1::DecodeAbortRequest* request,
                                  internal::v1::DecodeAbortResponse* response) {
  if (request->request_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "request_id: expected 1..128 printable ASCII bytes, got \"\"");
  }
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock l(&live_mu_);
    auto [begin, end] = live_.equal_range(request->request_id());
    for (auto it = begin; it != end; ++it) calls.push_back(it->second);
  }
  for (const auto& call : calls) {
    call->aborted.store(true);
    // Running or waiting: ends now. Awaiting KV: only marked; the handler cancels its prefill.
    runtime_->engine()->Abort(call->engine_id);
  }
  response->set_found(!calls.empty());
  return grpc::Status::OK;
}

absl::Time DecodeService::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

absl::Time DecodeService::ClockDeadline(absl::Time real_deadline) const {
  if (!options_.clock || real_deadline == absl::InfiniteFuture()) return real_deadline;
  return options_.clock() + (real_deadline - absl::Now());
}

absl::Time DecodeService::RealDeadline(absl::Time deadline) const {
  if (!options_.clock || deadline == absl::InfiniteFuture()) return deadline;
  return absl::Now() + (deadline - options_.clock());
}

void DecodeService::AddLive(const std::shared_ptr<Call>& call) {
  absl::MutexLock l(&live_mu_);
  live_.emplace(call->request_id, call);
}

void DecodeService::RemoveLive(const Call& call) {
  absl::MutexLock l(&live_mu_);
  auto [begin, end] = live_.equal_range(call.request_id);
  for (auto it = begin; it != end; ++it) {
    if (it->second.get() == &call) {
      live_.erase(it);
      return;
    }
  }
}

internal::v1::Prefill::Stub* DecodeService::PrefillStub(const std::string& address) {
  absl::MutexLock l(&stubs_mu_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second.get();
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  args.SetMaxReceiveMessageSize(64 << 20);
  // A prefill node that restarts on the same address is usable again within seconds (gRPC's
  // default reconnect backoff grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto stub = internal::v1::Prefill::NewStub(channel);
  internal::v1::Prefill::Stub* raw = stub.get();
  stubs_.emplace(address, std::move(stub));
  return raw;
}

// ---- Notification tags ----

void DecodeService::RegisterTag(uint64_t tag) {
  absl::MutexLock l(&tags_mu_);
  // The notifications may have come first (a tag is registered before its Prefill call, so only
  // by a bug, but both orders are handled).
  const bool complete = stray_done_.erase(tag) > 0;
  tags_[tag] = complete;
}

bool DecodeService::WaitTag(uint64_t tag, absl::Time deadline) {
  struct Arg {
    DecodeService* self;
    uint64_t tag;
  } arg{this, tag};
  absl::MutexLock l(&tags_mu_);
  return tags_mu_.AwaitWithDeadline(absl::Condition(
                                        +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                          auto it = a->self->tags_.find(a->tag);
                                          return it != a->self->tags_.end() && it->second;
                                        },
                                        &arg),
                                    RealDeadline(deadline));
}

void DecodeService::ReleaseTag(uint64_t tag) {
  absl::MutexLock l(&tags_mu_);
  const auto it = tags_.find(tag);
  if (it == tags_.end()) return;
  // Parts of an incomplete tag may still arrive; they are kept as strays until they expire.
  if (!it->second) stray_parts_.emplace(tag, Now());
  tags_.erase(it);
}

void DecodeService::DispatchLoop() {
  kv_transfer::TransferAgent* const agent = runtime_->agent();
  while (!stop_dispatch_.load()) {
    // A real-time wait: Stop is looked at every kDispatchInterval.
    const absl::Time wait_until = absl::Now() + kDispatchInterval;
    if (!agent->WaitForNotifications(wait_until)) {
      // A stopped agent may answer at once; do not spin.
      absl::SleepFor(std::max(absl::ZeroDuration(), wait_until - absl::Now()));
    }
    std::vector<kv_transfer::Notification> notes = agent->DrainNotifications();
    const absl::Time now = Now();
    absl::MutexLock l(&tags_mu_);
    for (kv_transfer::Notification& n : notes) {
      const uint64_t tag = n.request_id;
      auto known = tags_.find(tag);
      if (known == tags_.end()) stray_parts_.emplace(tag, now);  // keeps the first sighting
      kv_transfer::NotificationTracker::Completed completed;
      absl::StatusOr<bool> all = tracker_.Add(std::move(n), &completed);
      if (!all.ok()) {
        spdlog::warn("KV notification for tag {} refused: {}", tag, all.status().ToString());
        continue;
      }
      if (!*all) continue;
      if (known != tags_.end()) {
        known->second = true;
      } else {
        stray_parts_.erase(tag);
        stray_done_[tag] = now;
      }
    }
    // Forget what no request claimed in time.
    for (auto it = stray_parts_.begin(); it != stray_parts_.end();) {
      if (now - it->second > options_.stray_tag_ttl) {
        tracker_.Forget(it->first);
        stray_parts_.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto it = stray_done_.begin(); it != stray_done_.end();) {
      if (now - it->second > options_.stray_tag_ttl) {
        stray_done_.erase(it++);
      } else {
        ++it;
      }
    }
  }
}

// ---- Deferred releases ----

void DecodeService::ScheduleRelease(Release release) {
  absl::MutexLock l(&reap_mu_);
  releases_.push_back(std::move(release));
  reap_cv_.Signal();
}

void DecodeService::ReapLoop() {
  absl::MutexLock l(&reap_mu_);
  for (;;) {
    // After the runtime drained, the engine and the agent are stopped: nothing can land.
    const bool flush = stop_ && runtime_->draining();
    const absl::Time now = Now();
    std::vector<Release> due;
    absl::Time next = absl::InfiniteFuture();
    for (auto it = releases_.begin(); it != releases_.end();) {
      if (flush || it->due <= now) {
        due.push_back(std::move(*it));
        it = releases_.erase(it);
      } else {
        next = std::min(next, it->due);
        ++it;
      }
    }
    if (!due.empty()) {
      reap_mu_.Unlock();
      for (Release& r : due) {
        absl::Status st = runtime_->engine()->FailRemotePrefill(r.engine_id, r.status);
        if (!st.ok()) spdlog::debug("[req={}] FailRemotePrefill: {}", r.engine_id, st.ToString());
      }
      reap_mu_.Lock();
      continue;
    }
    if (stop_ && releases_.empty()) return;
    reap_cv_.WaitWithDeadline(&reap_mu_, RealDeadline(next));
  }
}

}  // namespace deepinfer::decode_node
