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
  kv_transfer::TransferAgent* agent = this->agent();
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
  kv_transfer::TransferAgent* agent = this->agent();
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

// One request's KV transfer, shared by the RPC thread and the engine's layer hook (which runs on
// the engine's forward thread and must not block: it only posts). Every post uses a handle of its
// own. Layer L's notification goes with the post that completes the layer's blocks when every
// earlier post of the layer has already landed (always so for a one-chunk prompt); otherwise it
// follows in an empty post once they have (the RPC thread's wait loop), so a notification still
// means all of its layer's data is visible at the destination.
struct PrefillService::Stream {
  struct Layer {
    size_t sent = 0;                        // blocks [0, sent) posted (or not to be sent)
    bool all_posted = false;                // every block of the layer posted
    bool noted = false;                     // its notification posted
    std::vector<kv_transfer::HandleId> data;  // its data posts
  };

  kv_transfer::TransferAgent* agent = nullptr;
  PeerLists lists;
  const internal::v1::KvPoolLayout* local = nullptr;
  const internal::v1::KvDestination* dest = nullptr;  // the request's; outlives the Stream's use
  std::function<absl::Time()> now;
  absl::Duration timeout;
  absl::Time request_deadline;
  std::string request_id;  // for logs
  size_t blocks = 0;       // destination blocks (one per block_size prompt tokens)
  int block_size = 0;
  int64_t prompt_len = 0;

  absl::Mutex mu;
  // No further post (the RPC stops or failed).
  bool closed ABSL_GUARDED_BY(mu) = false;
  absl::Status error ABSL_GUARDED_BY(mu);  // the first post refused
  std::vector<Layer> layers ABSL_GUARDED_BY(mu);
  std::vector<kv_transfer::HandleId> handles ABSL_GUARDED_BY(mu);  // every post, in order
  bool any_post ABSL_GUARDED_BY(mu) = false;
  absl::Time first_post_at ABSL_GUARDED_BY(mu);

  // Posts layer `l`'s blocks [sent, end) read from `src` (the engine's block ids by prompt
  // block); `end` == blocks completes the layer.
  void PostData(int l, size_t end, absl::Span<const int32_t> src)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Layer& layer = layers[l];
    if (layer.all_posted) return;
    const size_t begin = layer.sent;
    if (end <= begin && end < blocks) return;
    const bool completes = end == blocks;
    const bool note = completes && AllLanded(layer);
    if (end > begin) {
      std::vector<uint32_t> dst(dest->block_ids().begin() + static_cast<ptrdiff_t>(begin),
                                dest->block_ids().begin() + static_cast<ptrdiff_t>(end));
      std::vector<uint32_t> src_idx, dst_idx;
      node::LayerIndices(*local, dest->pool(), l, src.subspan(begin, end - begin), dst, &src_idx,
                         &dst_idx);
      if (!PostOne(l, src_idx, dst_idx, note)) return;
      layer.data.push_back(handles.back());
    } else if (note) {
      if (!PostOne(l, {}, {}, true)) return;
    }
    layer.sent = end;
    layer.all_posted = completes;
    if (note) layer.noted = true;
  }

  // Posts the notification of every layer whose data all landed; true when every layer's went.
  bool NotifyLanded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    bool all = true;
    for (int l = 0; l < static_cast<int>(layers.size()); ++l) {
      Layer& layer = layers[l];
      if (!layer.noted && layer.all_posted && !closed && AllLanded(layer)) {
        if (PostOne(l, {}, {}, true)) layer.noted = true;
      }
      all = all && layer.noted;
    }
    return all;
  }

  // Closes the stream and cancels every post (best effort; they still end terminal).
  void CloseAndCancel() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    closed = true;
    for (kv_transfer::HandleId h : handles) (void)agent->Cancel(h);
  }

 private:
  bool AllLanded(const Layer& layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (kv_transfer::HandleId h : layer.data) {
      absl::StatusOr<kv_transfer::TransferStatus> st = agent->Poll(h);
      if (!st.ok() || st->state != kv_transfer::TransferState::kDone) return false;
    }
    return true;
  }

  bool PostOne(int l, absl::Span<const uint32_t> src_idx, absl::Span<const uint32_t> dst_idx,
               bool note) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    absl::StatusOr<kv_transfer::HandleId> h = agent->CreateHandle(lists.local_list,
                                                                  lists.remote_list);
    if (!h.ok()) {
      Fail(h.status());
      return false;
    }
    kv_transfer::Notification n;
    n.request_id = dest->notification_tag();
    n.seq = static_cast<uint32_t>(l);
    n.total = static_cast<uint32_t>(layers.size());
    const absl::Time t = now();
    absl::Status posted = agent->Post(*h, kv_transfer::TransferOp::kWrite, src_idx, dst_idx,
                                      note ? &n : nullptr, std::min(request_deadline, t + timeout));
    if (!posted.ok()) {
      (void)agent->ReleaseHandle(*h);
      Fail(posted);
      return false;
    }
    if (!any_post) first_post_at = t;
    any_post = true;
    handles.push_back(*h);
    return true;
  }

  void Fail(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (error.ok()) error = std::move(s);
    CloseAndCancel();
  }
};

absl::StatusOr<std::shared_ptr<PrefillService::Stream>> PrefillService::OpenStream(
    const internal::v1::PrefillRequest& request, absl::Time request_deadline) {
  const internal::v1::KvDestination& dest = request.destination();
  DI_ASSIGN_OR_RETURN(PeerLists lists, PreparePeer(dest));
  auto stream = std::make_shared<Stream>();
  stream->agent = agent();
  stream->lists = lists;
  stream->local = &runtime_->pool_layout();
  stream->dest = &dest;
  stream->now = [this] { return Now(); };
  stream->timeout = options_.default_transfer_timeout;
  stream->request_deadline = request_deadline;
  stream->request_id = request.request_id();
  stream->blocks = static_cast<size_t>(dest.block_ids_size());
  stream->block_size = runtime_->options().block_size;
  stream->prompt_len = request.prompt_token_ids_size();
  absl::MutexLock lock(&stream->mu);
  stream->layers.resize(stream->local->num_layers());
  for (Stream::Layer& layer : stream->layers) layer.sent = dest.skip_blocks();
  return stream;
}

engine::LayerKvCallback PrefillService::LayerHook(std::shared_ptr<Stream> stream) {
  return [stream = std::move(stream)](const engine::LayerKvReady& ready) {
    Stream& s = *stream;
    // Blocks every token of which is computed; the prompt's last block once the prompt is.
    const bool whole = ready.kv_end >= s.prompt_len;
    const size_t complete =
        whole ? s.blocks : static_cast<size_t>(ready.kv_end / s.block_size);
    absl::MutexLock lock(&s.mu);
    // Closed: the RPC may have ended; touch nothing else.
    if (s.closed || ready.layer < 0 || ready.layer >= static_cast<int>(s.layers.size())) return;
    if (ready.block_table.size() < complete) return;  // cannot happen (engine contract)
    s.PostData(ready.layer, complete, ready.block_table);
  };
}

absl::Status PrefillService::FinishStream(grpc::ServerContext* context, Live* live,
                                          Stream* stream, const std::vector<int32_t>* src_blocks,
                                          absl::Status stop, TransferTimes* times) {
  kv_transfer::TransferAgent* agent = this->agent();
  absl::Status status = stop;
  {
    absl::MutexLock lock(&stream->mu);
    if (!status.ok()) {
      stream->CloseAndCancel();
    } else if (src_blocks->size() != stream->blocks) {
      status = absl::InternalError(absl::StrCat("engine held ", src_blocks->size(),
                                                " prompt blocks, the destination has ",
                                                stream->blocks));
      stream->CloseAndCancel();
    } else if (!stream->closed) {
      // What the layer hooks did not send (all of it without hooks: a device backend).
      for (int l = 0; l < static_cast<int>(stream->layers.size()) && !stream->closed; ++l) {
        if (!stream->layers[l].all_posted) stream->PostData(l, stream->blocks, *src_blocks);
      }
    }
  }
  // Every post must be terminal before the blocks are released: until then the backend may still
  // read them (and write into the destination). Notifications held back for earlier posts of
  // their layer go once those landed.
  absl::Status transfer_error;
  size_t checked = 0;  // handles [0, checked) are terminal
  for (;;) {
    kv_transfer::HandleId next = 0;
    bool have_next = false;
    {
      absl::MutexLock lock(&stream->mu);
      const bool all_noted = stream->NotifyLanded();
      if (checked < stream->handles.size()) {
        next = stream->handles[checked];
        have_next = true;
      } else if (all_noted || stream->closed) {
        break;
      }
    }
    if (!have_next) {
      absl::SleepFor(absl::Microseconds(200));  // a held-back notification's layer is landing
    } else {
      // A real-time poll: the agent's Wait sleeps on the wall clock.
      absl::StatusOr<kv_transfer::TransferStatus> st =
          agent->Wait(next, absl::Now() + kPollInterval);
      if (!st.ok() || st->terminal()) {
        ++checked;
        const absl::Status failed =
            !st.ok() ? st.status()
                     : (st->state == kv_transfer::TransferState::kFailed ? st->status
                                                                         : absl::OkStatus());
        if (!failed.ok()) {
          if (transfer_error.ok()) transfer_error = failed;
          absl::MutexLock lock(&stream->mu);
          stream->CloseAndCancel();
        }
        continue;
      }
    }
    if (status.ok()) {
      status = StopReason(context, live, stream->request_deadline);
      if (!status.ok()) {
        absl::MutexLock lock(&stream->mu);
        stream->CloseAndCancel();
      }
    }
  }
  const absl::Time landed = Now();
  absl::Status post_error;
  {
    absl::MutexLock lock(&stream->mu);
    stream->closed = true;  // the hook, if the engine still held it, must post nothing now
    post_error = stream->error;
    for (kv_transfer::HandleId h : stream->handles) {
      absl::Status s = agent->ReleaseHandle(h);
      if (!s.ok()) {
        spdlog::error("[req={}] ReleaseHandle({}): {}", stream->request_id, h, s.ToString());
      }
    }
    stream->handles.clear();
    if (times != nullptr) {
      times->first_post = stream->any_post ? stream->first_post_at : landed;
      times->landed = landed;
    }
  }
  if (!status.ok()) return status;
  if (!post_error.ok()) return post_error;
  return transfer_error;
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
  // With a destination the KV streams out layer by layer while the engine computes it.
  std::shared_ptr<Stream> stream;
  if (request.has_destination()) {
    DI_ASSIGN_OR_RETURN(stream, OpenStream(request, deadline));
    if (options_.layer_streaming) er.on_layer_kv = LayerHook(stream);
  }

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

  // Wait for the engine; on cancellation stop the stream and abort the engine, but still wait for
  // its callback, which then reports the abort (or, if the prefill had just finished, the held
  // blocks to release).
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
      if (stop.ok() && stream != nullptr) {
        // A refused write ends the request now rather than after the compute.
        absl::MutexLock lock(&stream->mu);
        stop = stream->error;
      }
      if (!stop.ok()) {
        if (stream != nullptr) {
          absl::MutexLock lock(&stream->mu);
          stream->CloseAndCancel();
        }
        engine->Abort(request.request_id());
        aborted = true;
      }
    }
  }
  const absl::Time compute_end = Now();
  const absl::Duration compute = compute_end - compute_start;
  if (!aborted && result.ok()) stop = StopReason(context, live, deadline);
  absl::Status status = result.ok() ? stop : (aborted ? stop : result.status());

  uint64_t bytes = 0;
  TransferTimes times;
  if (stream != nullptr) {
    // Also on failure: posts made by the layer hooks must be terminal before the RPC ends.
    status = FinishStream(context, live, stream.get(),
                          result.ok() ? &result->block_ids : nullptr, status, &times);
    if (status.ok()) {
      const internal::v1::KvDestination& dest = request.destination();
      bytes = uint64_t{2} * runtime_->pool_layout().num_layers() *
              (dest.block_ids_size() - dest.skip_blocks()) * runtime_->pool_layout().block_bytes();
    }
  }
  if (result.ok()) {
    absl::Status released = engine->ReleasePrefilled(request.request_id());
    if (!released.ok()) {
      spdlog::error("[req={}] ReleasePrefilled: {}", request.request_id(), released.ToString());
    }
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
  if (stream != nullptr) {
    // Exposed: what the answer waited for after the engine reported the prefill.
    response->set_transfer_us(
        static_cast<uint64_t>(std::max<int64_t>(0, Micros(times.landed - times.first_post))));
    response->set_transfer_exposed_us(
        static_cast<uint64_t>(std::max<int64_t>(0, Micros(times.landed - compute_end))));
  }
  return absl::OkStatus();
}

kv_transfer::TransferAgent* PrefillService::agent() const {
  return options_.agent != nullptr ? options_.agent : runtime_->agent();
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
