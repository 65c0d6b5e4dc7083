// The prefill node's gRPC service (deepinfer.internal.v1.Prefill): computes a prompt's KV with the
// node's engine (reusing its prefix cache) and writes it, layer by layer, into the KV blocks a
// decode node reserved, through the node's kv_transfer agent.
//
// Prefill(PrefillRequest), in order:
//  1. RequestScope: UNAVAILABLE while the node drains.
//  2. Validation, each failure INVALID_ARGUMENT naming the field: the worker bounds of
//     api::CheckWorkerRequest (request_id, sampling ranges, cache_salt, prompt_token_ids, prompt
//     + max_tokens within the context), images (this node has no vision encoder), sampling
//     resolved with the model's generation defaults (api::ToEngineSamplingParams; the engine
//     samples exactly one token), destination when set: block_size equal to ours
//     (FAILED_PRECONDITION), block_ids one per block_size prompt tokens, skip_blocks <= that,
//     every block id < destination.pool.num_blocks, metadata naming agent_name/incarnation, pool
//     compatible with ours (node::CheckCompatible). A request id recently cancelled (Cancel
//     arrived first) is refused with CANCELLED; a live one with ALREADY_EXISTS; a deadline
//     already past with DEADLINE_EXCEEDED.
//  3. Peer: the destination agent is imported once per incarnation (a newer one replaces it, an
//     older one is refused with ABORTED) and its pool's descriptor list prepared once (again if
//     its layout changes). This happens before the compute, so the KV can stream out during it.
//  4. Compute: engine SubmitPrefill (engine request id = request_id) with a layer hook
//     (EngineRequest::on_layer_kv). Cancel, the client going away or deadline_unix_us passing
//     stop the stream (step 5) and abort the engine; the engine's callback is still awaited.
//  5. Transfer, streamed layer by layer: each time the engine has stored layer L's KV for a chunk
//     of the prompt, the hook (on the engine's forward thread; it only posts, never waits) posts
//     one write of layer L's K and V for the destination blocks [skip_blocks, n) that chunk
//     completed (a block is complete when all its tokens are computed; the prompt's last block
//     when the prompt is), each post on a handle of its own. So for a long prompt every layer but
//     the last moves while later layers compute. Layer L's Notification{destination.
//     notification_tag, seq = L, total = layers} goes with the post that completes the layer if
//     the layer's earlier posts (earlier chunks) have already landed, else in an empty post once
//     they have: a notification always follows all of its layer's data (the decode side's
//     readiness rule is unchanged). What the hooks did not send (everything when the engine runs
//     on a device backend, which offers no per-layer events, or for all-sliding-window models) is
//     posted after the engine's callback. With no block to write the notifications still go,
//     with empty index lists. Each post's deadline: min(deadline_unix_us, post time +
//     default_transfer_timeout). A refused post aborts the compute (the RPC fails with its
//     code). On cancellation or any failure no further post is made, every
//     post is cancelled, and the RPC still waits until each is terminal (no write can land
//     afterwards) -- also when the compute itself failed after some layers were posted.
//  6. The held blocks are released (their KV stays in the prefix cache) and the handles freed.
//     The engine never preempts a streaming prefill, so the blocks a post reads stay its own
//     until then (after an abort they are freed once the step ends, and what the cancelled posts
//     still read goes into a reservation that can no longer become ready).
// Response timing: compute_us (submit to the engine's callback), transfer_us (first post to the
// last post's completion) and transfer_exposed_us (the engine's callback to the last completion:
// the transfer time the compute did not hide, which the answer and so the TTFT wait for).
// Without a destination the node only prefills (a measurement) and releases the blocks.
//
// Time: every deadline decision, timestamp and duration (deadline_unix_us, the transfer
// deadline, compute_us / transfer_us / transfer_exposed_us, Cancel's memory) reads PrefillServiceOptions::clock, so
// tests drive them with a FakeClock (common/fake_clock.h). deadline_unix_us and the deadline
// handed to the runtime's transfer agent are in that clock's time base: in production the wall
// clock; a test that transfers under a fake clock gives the agent the same clock
// (AgentConfig::clock). The blocking waits themselves (polling the engine, the agent's Wait,
// Cancel waiting for the request to end) sleep in real time, kPollInterval at a time.
// Errors: transfer failures keep their code (UNAVAILABLE peer gone, DEADLINE_EXCEEDED, ABORTED
// stale incarnation); cancellation gives CANCELLED; the engine's own errors pass through
// (RESOURCE_EXHAUSTED when the prompt cannot fit).
//
// Cancel(request_id): marks the live request cancelled and returns once it is terminal
// (quiesced = true: nothing can still be written into its destination). For an unknown id the
// cancellation is remembered for `cancel_memory`, so a Prefill arriving late is refused, and
// quiesced = true.
//
// Thread-safety: every method is thread-safe (gRPC calls them concurrently). Not copyable or
// movable. The runtime must outlive the service; the service must outlive the runtime's server
// (pass it to WorkerRuntime::Start and destroy it after the runtime drained).
#ifndef DEEPINFER_PREFILL_NODE_PREFILL_SERVICE_H_
#define DEEPINFER_PREFILL_NODE_PREFILL_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/request_validation.h"
#include "engine/llm_engine.h"
#include "grpcpp/grpcpp.h"
#include "kv_transfer/transfer_agent.h"
#include "node/worker_runtime.h"
#include "proto/deepinfer/internal/v1/prefill.grpc.pb.h"
#include "proto/deepinfer/internal/v1/prefill.pb.h"

namespace deepinfer::prefill_node {

struct PrefillServiceOptions {
  // Longest a request's KV transfer may take when its deadline_unix_us is later (or unset).
  absl::Duration default_transfer_timeout = absl::Seconds(30);
  // How long a Cancel for an unknown request id is remembered.
  absl::Duration cancel_memory = absl::Seconds(60);
  // The time every deadline and duration is judged by (see the header comment); absl::Now when
  // empty.
  std::function<absl::Time()> clock;
  // The agent every transfer goes through (not owned; outlives the service); the runtime's when
  // null. A test passes a wrapper around the runtime's agent to watch or delay the posts.
  kv_transfer::TransferAgent* agent = nullptr;
  // Stream the KV layer by layer during the compute (step 5). False: post it all after the
  // prefill, as on a device backend (a baseline for comparisons).
  bool layer_streaming = true;
};

class PrefillService final : public internal::v1::Prefill::Service {
 public:
  // `runtime` (not owned) must have been created with role PREFILL and must outlive this.
  explicit PrefillService(node::WorkerRuntime* runtime, PrefillServiceOptions options = {});
  ~PrefillService() override;

  PrefillService(const PrefillService&) = delete;
  PrefillService& operator=(const PrefillService&) = delete;

  grpc::Status Prefill(grpc::ServerContext* context, const internal::v1::PrefillRequest* request,
                       internal::v1::PrefillResponse* response) override;
  grpc::Status Cancel(grpc::ServerContext* context,
                      const internal::v1::CancelPrefillRequest* request,
                      internal::v1::CancelPrefillResponse* response) override;

  // Adds requests_ok / requests_failed / requests_cancelled; pass to WorkerRuntime::Start.
  node::StatsContributor stats_contributor();

  // The service name the runtime's health reports on.
  static std::string ServiceName() { return internal::v1::Prefill::service_full_name(); }

 private:
  struct Live;
  struct Stream;
  struct TransferTimes {
    absl::Time first_post;
    absl::Time landed;
  };
  struct Peer {
    uint64_t incarnation = 0;
    std::string peer_name;  // as the agent knows it
    std::string layout;     // serialized KvPoolLayout the remote list was prepared for
    kv_transfer::DescListId remote_list = 0;
  };
  struct PeerLists {
    kv_transfer::DescListId local_list = 0;
    kv_transfer::DescListId remote_list = 0;
  };

  absl::Status DoPrefill(grpc::ServerContext* context, const internal::v1::PrefillRequest& request,
                         const std::shared_ptr<Live>& live,
                         internal::v1::PrefillResponse* response);
  absl::Status Validate(const internal::v1::PrefillRequest& request,
                        engine::SamplingParams* sampling) const;
  // Imports / refreshes the destination's agent and returns the descriptor lists to use.
  absl::StatusOr<PeerLists> PreparePeer(const internal::v1::KvDestination& destination);
  // Why the request must stop now (Cancel, client gone, deadline), or OK to go on.
  absl::Status StopReason(grpc::ServerContext* context, Live* live, absl::Time deadline) const;
  // The request's transfer state (peer prepared), before the compute starts.
  absl::StatusOr<std::shared_ptr<Stream>> OpenStream(const internal::v1::PrefillRequest& request,
                                                     absl::Time request_deadline);
  // The engine's layer hook posting into `stream`.
  static engine::LayerKvCallback LayerHook(std::shared_ptr<Stream> stream);
  // After the engine's callback: with `stop` OK posts what the hooks did not (from `src_blocks`,
  // the prompt's blocks) and waits for every post, sending held-back notifications; otherwise
  // cancels every post. Returns once every post is terminal and its handle released: `stop`,
  // else the first post or transfer error.
  absl::Status FinishStream(grpc::ServerContext* context, Live* live, Stream* stream,
                            const std::vector<int32_t>* src_blocks, absl::Status stop,
                            TransferTimes* times);
  void ForgetExpiredCancels(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // options_.clock, or absl::Now.
  absl::Time Now() const;
  // options_.agent, or the runtime's.
  kv_transfer::TransferAgent* agent() const;

  node::WorkerRuntime* const runtime_;
  const PrefillServiceOptions options_;
  // The built-in (neutral) defaults: the router resolves the model's (api::ResolveSampling), so
  // these apply only to fields a caller other than the router left unset.
  const api::GenerationDefaults defaults_;
  api::RequestLimits limits_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Live>> live_ ABSL_GUARDED_BY(mu_);
  // Cancelled before they arrived: id -> when to forget it.
  absl::flat_hash_map<std::string, absl::Time> early_cancels_ ABSL_GUARDED_BY(mu_);

  absl::Mutex peers_mu_;
  kv_transfer::DescListId local_list_ ABSL_GUARDED_BY(peers_mu_) = 0;
  bool local_prepared_ ABSL_GUARDED_BY(peers_mu_) = false;
  absl::flat_hash_map<std::string, Peer> peers_ ABSL_GUARDED_BY(peers_mu_);

  std::atomic<uint64_t> requests_ok_{0};
  std::atomic<uint64_t> requests_failed_{0};
  std::atomic<uint64_t> requests_cancelled_{0};
};

}  // namespace deepinfer::prefill_node

#endif  // DEEPINFER_PREFILL_NODE_PREFILL_SERVICE_H_
