#include "prefill_node/prefill_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "api/worker_request_check.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "engine/llm_engine.h"
#include "node/kv_pool.h"
#include "node/image_inputs.h"
#include "spdlog/spdlog.h"

namespace deepinfer::prefill_node {
namespace {

// How often a waiting RPC looks at the cancel flag, the client and the deadline.
constexpr absl::Duration kPollInterval = absl::Milliseconds(5);
constexpr size_t kMaxRequestIdBytes = 128;

int64_t Micros(absl::Duration d) { return absl::ToInt64Microseconds(d); }

}  // namespace

// One Prefill RPC in progress. The engine callback and Cancel reach it through shared_ptr.
struct PrefillService::Live {
  absl::Mutex mu;
  // Cancel asked for it.
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // The engine's callback arrived with `result`.
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::StatusOr<engine::PrefillResult> result ABSL_GUARDED_BY(mu) =
      absl::UnknownError("prefill pending");
  // The RPC finished: nothing of it (compute or transfer) is still running.
  bool terminal ABSL_GUARDED_BY(mu) = false;
};

PrefillService::PrefillService(node::WorkerRuntime* runtime, PrefillServiceOptions options)
    : runtime_(runtime), options_(options) {
  limits_.vocab_size = runtime_->model()->config().vocab_size;
  limits_.max_context_tokens = runtime_->model()->config().max_position_embeddings;
}

PrefillService::~PrefillService() {
  absl::MutexLock lock(&peers_mu_);
  kv_transfer::TransferAgent* agent = runtime_->agent();
  for (auto& [name, peer] : peers_) (void)agent->ReleaseDescriptors(peer.remote_list);
  if (local_prepared_) (void)agent->ReleaseDescriptors(local_list_);
}

node::StatsContributor PrefillService::stats_contributor() {
  return [this](internal::v1::WorkerStats* stats) {
    stats->set_requests_ok(requests_ok_.load());
    stats->set_requests_failed(requests_failed_.load());
    stats->set_requests_cancelled(requests_cancelled_.load());
  };
}

absl::Status PrefillService::Validate(const internal::v1::PrefillRequest& request,
                                      engine::SamplingParams* sampling) const {
  DI_RETURN_IF_ERROR(api::CheckWorkerRequest(request, limits_));
  const int prompt_len = request.prompt_token_ids_size();
  DI_ASSIGN_OR_RETURN(*sampling, api::ToEngineSamplingParams(request.sampling(), defaults_,
                                                             limits_, prompt_len));
  sampling->max_tokens = 1;
  if (!request.has_destination()) return absl::OkStatus();

  const internal::v1::KvDestination& d = request.destination();
  const int block_size = runtime_->options().block_size;
  if (d.block_size() != static_cast<uint32_t>(block_size)) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination.block_size: this node's blocks hold ", block_size,
                     " tokens, the destination's ", d.block_size()));
  }
  if (d.agent_name().empty()) {
    return absl::InvalidArgumentError("destination.agent_name: required");
  }
  if (d.incarnation() == 0) {
    return absl::InvalidArgumentError("destination.incarnation: expected non-zero, got 0");
  }
  const int expected_blocks = (prompt_len + block_size - 1) / block_size;
  if (d.block_ids_size() != expected_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination.block_ids: expected ", expected_blocks, " (one per ", block_size,
                     " prompt tokens), got ", d.block_ids_size()));
  }
  if (d.skip_blocks() > static_cast<uint32_t>(d.block_ids_size())) {
    return absl::InvalidArgumentError(absl::StrCat("destination.skip_blocks: expected <= ",
                                                   d.block_ids_size(), ", got ", d.skip_blocks()));
  }
  DI_RETURN_IF_ERROR(node::CheckCompatible(runtime_->pool_layout(), d.pool()));
  for (int i = 0; i < d.block_ids_size(); ++i) {
    if (d.block_ids(i) >= d.pool().num_blocks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("destination.block_ids[", i, "]: expected < ", d.pool().num_blocks(),
                       " (destination.pool.num_blocks), got ", d.block_ids(i)));
    }
  }
  const internal::v1::KvPeerMetadata& m = d.metadata();
  if (m.agent_name() != d.agent_name()) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination.metadata.agent_name: expected \"", d.agent_name(),
                     "\" (destination.agent_name), got \"", m.agent_name(), "\""));
  }
  if (m.incarnation() != d.incarnation()) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination.metadata.incarnation: expected ", d.incarnation(),
                     " (destination.incarnation), got ", m.incarnation()));
  }
  if (m.version() != runtime_->kv_metadata().version()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination.metadata.version: this node reads version ",
                     runtime_->kv_metadata().version(), ", got ", m.version()));
  }
  if (m.backend() != runtime_->kv_metadata().backend()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination.metadata.backend: this node's kv transport is ",
                     runtime_->kv_metadata().backend(), ", the destination's \"", m.backend(),
                     "\""));
  }
  if (m.blob().empty()) {
    return absl::InvalidArgumentError("destination.metadata.blob: required");
  }
  return absl::OkStatus();
}

absl::StatusOr<PrefillService::PeerLists> PrefillService::PreparePeer(
    const internal::v1::KvDestination& destination) {
  kv_transfer::TransferAgent* agent = runtime_->agent();
  absl::MutexLock lock(&peers_mu_);
  if (!local_prepared_) {
    DI_ASSIGN_OR_RETURN(local_list_, agent->PrepareLocalDescriptors(
                                         node::PoolDescriptors(runtime_->pool_layout())));
    local_prepared_ = true;
  }
  auto it = peers_.find(destination.agent_name());
  if (it != peers_.end() && destination.incarnation() < it->second.incarnation) {
    return absl::AbortedError(absl::StrCat(
        "destination.incarnation: agent \"", destination.agent_name(), "\" is at incarnation ",
        it->second.incarnation, "; got stale ", destination.incarnation()));
  }
  std::string layout = destination.pool().SerializeAsString();
  if (it != peers_.end() && it->second.incarnation == destination.incarnation() &&
      it->second.layout == layout) {
    return PeerLists{local_list_, it->second.remote_list};
  }
  // Unknown agent, newer incarnation or new layout: (re-)import and prepare once more.
  absl::StatusOr<std::string> peer_name = agent->ImportPeer(destination.metadata().blob());
  if (!peer_name.ok()) {
    absl::Status s = peer_name.status();
    if (s.code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat("destination.metadata.blob: ", s.message()));
    }
    return s;
  }
  if (*peer_name != destination.agent_name()) {
    return absl::InvalidArgumentError(
        absl::StrCat("destination.metadata.blob: names agent \"", *peer_name, "\", expected \"",
                     destination.agent_name(), "\""));
  }
  DI_ASSIGN_OR_RETURN(kv_transfer::DescListId remote,
                      agent->PrepareRemoteDescriptors(
                          *peer_name, node::PoolDescriptors(destination.pool())));
  if (it != peers_.end()) {
    // Handles still using the old list keep it alive; this only drops the service's reference.
    (void)agent->ReleaseDescriptors(it->second.remote_list);
  }
  Peer& peer = peers_[destination.agent_name()];
  peer.incarnation = destination.incarnation();
  peer.peer_name = *peer_name;
  peer.layout = std::move(layout);
  peer.remote_list = remote;
  spdlog::info("kv peer {} incarnation {}: {} layers x {} blocks of {} bytes",
               destination.agent_name(), destination.incarnation(),
               destination.pool().num_layers(), destination.pool().num_blocks(),
               destination.pool().block_bytes());
  return PeerLists{local_list_, remote};
}

absl::Status PrefillService::StopReason(grpc::ServerContext* context, Live* live,
                                        absl::Time deadline) const {
  {
    absl::MutexLock lock(&live->mu);
    if (live->cancelled) return absl::CancelledError("cancelled by Prefill.Cancel");
  }
  if (context != nullptr && context->IsCancelled()) {
    return absl::CancelledError("the caller cancelled the RPC");
  }
  if (Now() >= deadline) {
    return absl::DeadlineExceededError("deadline_unix_us passed");
  }
  return absl::OkStatus();
}

absl::Status PrefillService::Transfer(grpc::ServerContext* context,
                                      const internal::v1::PrefillRequest& request, Live* live,
                                      absl::Time request_deadline,
                                      const std::vector<int32_t>& src_blocks, uint64_t* bytes) {
  const internal::v1::KvDestination& dest = request.destination();
  const internal::v1::KvPoolLayout& local = runtime_->pool_layout();
  kv_transfer::TransferAgent* agent = runtime_->agent();
  const size_t n = static_cast<size_t>(dest.block_ids_size());
  const size_t skip = dest.skip_blocks();
  if (src_blocks.size() != n) {
    return absl::InternalError(absl::StrCat("engine held ", src_blocks.size(),
                                            " prompt blocks, the destination has ", n));
  }
  DI_ASSIGN_OR_RETURN(PeerLists lists, PreparePeer(dest));

  const int layers = static_cast<int>(local.num_layers());
  std::vector<kv_transfer::HandleId> handles;
  handles.reserve(layers);
  auto release_handles = [&]() {
    for (kv_transfer::HandleId h : handles) {
      absl::Status s = agent->ReleaseHandle(h);
      if (!s.ok()) {
        spdlog::error("[req={}] ReleaseHandle({}): {}", request.request_id(), h, s.ToString());
      }
    }
  };
  for (int l = 0; l < layers; ++l) {
    absl::StatusOr<kv_transfer::HandleId> h = agent->CreateHandle(lists.local_list,
                                                                  lists.remote_list);
    if (!h.ok()) {
      release_handles();
      return h.status();
    }
    handles.push_back(*h);
  }

  const absl::Time deadline = std::min(request_deadline, Now() + options_.default_transfer_timeout);
  absl::Span<const int32_t> src = absl::MakeConstSpan(src_blocks).subspan(skip);
  std::vector<uint32_t> dst(dest.block_ids().begin() + static_cast<ptrdiff_t>(skip),
                            dest.block_ids().end());
  std::vector<uint32_t> src_idx, dst_idx;
  absl::Status post_error;
  size_t posted = 0;
  for (int l = 0; l < layers; ++l) {
    node::LayerIndices(local, dest.pool(), l, src, dst, &src_idx, &dst_idx);
    kv_transfer::Notification note;
    note.request_id = dest.notification_tag();
    note.seq = static_cast<uint32_t>(l);
    note.total = static_cast<uint32_t>(layers);
    post_error = agent->Post(handles[l], kv_transfer::TransferOp::kWrite, src_idx, dst_idx, &note,
                             deadline);
    if (!post_error.ok()) break;
    ++posted;
  }

  // Every posted handle must be terminal before the blocks are released: until then the backend
  // may still read them (and write into the destination).
  absl::Status stop;
  absl::Status transfer_error;
  for (size_t i = 0; i < posted; ++i) {
    for (;;) {
      // A real-time poll: the agent's Wait sleeps on the wall clock.
      absl::StatusOr<kv_transfer::TransferStatus> st =
          agent->Wait(handles[i], absl::Now() + kPollInterval);
      if (!st.ok()) {
        // Unknown handle: cannot happen for a handle this RPC created and has not released.
        if (transfer_error.ok()) transfer_error = st.status();
        break;
      }
      if (st->terminal()) {
        if (st->state == kv_transfer::TransferState::kFailed && transfer_error.ok()) {
          transfer_error = st->status;
        }
        break;
      }
      if (stop.ok()) {
        stop = StopReason(context, live, request_deadline);
        if (!stop.ok()) {
          for (size_t j = 0; j < posted; ++j) (void)agent->Cancel(handles[j]);
        }
      }
    }
  }
  release_handles();
  if (!stop.ok()) return stop;
  if (!post_error.ok()) return post_error;
  if (!transfer_error.ok()) return transfer_error;
  *bytes = uint64_t{2} * static_cast<uint64_t>(layers) * (n - skip) * local.block_bytes();
  return absl::OkStatus();
}

absl::Status PrefillService::DoPrefill(grpc::ServerContext* context,
                                       const internal::v1::PrefillRequest& request,
                                       const std::shared_ptr<Live>& live_owner,
                                       internal::v1::PrefillResponse* response) {
  Live* live = live_owner.get();
  engine::EngineRequest er;
  DI_RETURN_IF_ERROR(Validate(request, &er.sampling));
  const absl::Time deadline = request.deadline_unix_us() > 0
                                  ? absl::FromUnixMicros(request.deadline_unix_us())
                                  : absl::InfiniteFuture();
  if (Now() >= deadline) {
    return absl::DeadlineExceededError("deadline_unix_us: already passed on arrival");
  }
  er.request_id = request.request_id();
  er.prompt.assign(request.prompt_token_ids().begin(), request.prompt_token_ids().end());
  er.cache_salt = request.cache_salt();
  DI_ASSIGN_OR_RETURN(er.images,
                      node::ImagesFromHandles(request.images(), er.prompt,
                                              runtime_->model()->config().image_token_id,
                                              runtime_->model()->config().hidden_size,
                                              /*with_data=*/true));

  engine::LlmEngine* engine = runtime_->engine();
  const absl::Time compute_start = Now();
  std::shared_ptr<Live> keep = live_owner;
  DI_RETURN_IF_ERROR(engine->SubmitPrefill(std::move(er), [keep](
                                                              absl::StatusOr<engine::PrefillResult>
                                                                  r) {
    absl::MutexLock lock(&keep->mu);
    keep->result = std::move(r);
    keep->done = true;
  }));

  // Wait for the engine; on cancellation abort it but still wait for its callback, which then
  // reports the abort (or, if the prefill had just finished, the held blocks to release).
  absl::Status stop;
  bool aborted = false;
  absl::StatusOr<engine::PrefillResult> result;
  for (;;) {
    {
      absl::MutexLock lock(&live->mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(live->mu) {
        return live->done || (live->cancelled && !aborted);
      };
      live->mu.AwaitWithTimeout(absl::Condition(&ready), kPollInterval);
      if (live->done) {
        result = std::move(live->result);
        break;
      }
    }
    if (!aborted) {
      stop = StopReason(context, live, deadline);
      if (!stop.ok()) {
        engine->Abort(request.request_id());
        aborted = true;
      }
    }
  }
  const absl::Duration compute = Now() - compute_start;
  if (!result.ok()) return aborted ? stop : result.status();
  if (!aborted) stop = StopReason(context, live, deadline);

  absl::Status status = stop;
  uint64_t bytes = 0;
  absl::Duration transfer_time;
  if (status.ok() && request.has_destination()) {
    const absl::Time transfer_start = Now();
    status = Transfer(context, request, live, deadline, result->block_ids, &bytes);
    transfer_time = Now() - transfer_start;
  }
  absl::Status released = engine->ReleasePrefilled(request.request_id());
  if (!released.ok()) {
    spdlog::error("[req={}] ReleasePrefilled: {}", request.request_id(), released.ToString());
  }
  if (!status.ok()) return status;

  response->set_first_token_id(static_cast<uint32_t>(result->first_token));
  v1::TokenLogprob* lp = response->mutable_first_token_logprob();
  lp->set_token_id(static_cast<uint32_t>(result->first_token));
  lp->set_logprob(result->first_logprob);
  for (const engine::TokenLogprob& t : result->first_top) {
    v1::TopLogprob* top = lp->add_top();
    top->set_token_id(static_cast<uint32_t>(t.token));
    top->set_logprob(t.logprob);
  }
  response->set_cached_prompt_tokens(static_cast<uint32_t>(result->cached_tokens));
  response->set_transferred_bytes(bytes);
  response->set_compute_us(static_cast<uint64_t>(Micros(compute)));
  response->set_transfer_us(static_cast<uint64_t>(Micros(transfer_time)));
  return absl::OkStatus();
}

absl::Time PrefillService::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

void PrefillService::ForgetExpiredCancels(absl::Time now) {
  for (auto it = early_cancels_.begin(); it != early_cancels_.end();) {
    if (it->second <= now) {
      early_cancels_.erase(it++);
    } else {
      ++it;
    }
  }
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* context,
                                     const internal::v1::PrefillRequest* request,
                                     internal::v1::PrefillResponse* response) {
  node::WorkerRuntime::RequestScope scope(runtime_);
  if (!scope.ok()) return ToGrpcStatus(scope.status());
  const std::string& id = request->request_id();
  auto live = std::make_shared<Live>();
  absl::Status status;
  bool registered = false;
  {
    absl::MutexLock lock(&mu_);
    ForgetExpiredCancels(Now());
    if (id.empty()) {
      // Validate names the field; nothing to register under.
    } else if (early_cancels_.contains(id)) {
      status = absl::CancelledError(
          absl::StrCat("request_id: \"", id, "\" was cancelled before it arrived"));
    } else if (live_.contains(id)) {
      status = absl::AlreadyExistsError(
          absl::StrCat("request_id: \"", id, "\" is already being prefilled"));
    } else {
      live_[id] = live;
      registered = true;
    }
  }
  if (status.ok()) {
    if (registered) {
      status = DoPrefill(context, *request, live, response);
    } else {
      engine::SamplingParams unused;
      status = Validate(*request, &unused);
    }
  }
  if (registered) {
    {
      absl::MutexLock lock(&live->mu);
      live->terminal = true;
    }
    absl::MutexLock lock(&mu_);
    live_.erase(id);
  }
  if (status.ok()) {
    requests_ok_.fetch_add(1);
    spdlog::debug("[req={}] prefilled {} tokens ({} cached), {} bytes in {}us + {}us",
                  id, request->prompt_token_ids_size(), response->cached_prompt_tokens(),
                  response->transferred_bytes(), response->compute_us(),
                  response->transfer_us());
  } else if (status.code() == absl::StatusCode::kCancelled) {
    requests_cancelled_.fetch_add(1);
    spdlog::info("[req={}] prefill cancelled: {}", id, std::string(status.message()));
  } else {
    requests_failed_.fetch_add(1);
    spdlog::warn("[req={}] prefill failed: {}", id, status.ToString());
  }
  return ToGrpcStatus(status);
}

grpc::Status PrefillService::Cancel(grpc::ServerContext* context,
                                    const internal::v1::CancelPrefillRequest* request,
                                    internal::v1::CancelPrefillResponse* response) {
  const std::string& id = request->request_id();
  if (id.empty() || id.size() > kMaxRequestIdBytes) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "request_id: expected 1..", kMaxRequestIdBytes, " bytes, got ", id.size())));
  }
  std::shared_ptr<Live> live;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = Now();
    ForgetExpiredCancels(now);
    auto it = live_.find(id);
    if (it == live_.end()) {
      early_cancels_[id] = now + options_.cancel_memory;
      response->set_quiesced(true);
      return grpc::Status::OK;
    }
    live = it->second;
  }
  absl::MutexLock lock(&live->mu);
  live->cancelled = true;
  auto terminal = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(live->mu) { return live->terminal; };
  while (!live->mu.AwaitWithTimeout(absl::Condition(&terminal), absl::Milliseconds(20))) {
    if (context->IsCancelled()) {
      return ToGrpcStatus(absl::CancelledError("the caller cancelled the Cancel RPC"));
    }
  }
  response->set_quiesced(true);
  return grpc::Status::OK;
}

}  // namespace deepinfer::prefill_node
