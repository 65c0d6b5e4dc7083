// The decode node's gRPC service (internal.v1.Decode), served through a node::WorkerRuntime.
//
// Generate(DecodeRequest) -> stream GenerateChunk:
//  * Validation: the worker bounds of api::CheckWorkerRequest (request_id, sampling ranges,
//    cache_salt, priority, prompt_token_ids, prompt + max_tokens within the context), then the
//    sampling resolved with the model's generation_config.json defaults
//    (api::ToEngineSamplingParams); bad image handles are refused naming images. Every
//    violation is INVALID_ARGUMENT whose message starts with the field's path. The request's
//    deadline is the earlier of deadline_unix_us (when non-zero) and the RPC's own deadline.
//  * Colocated (prefill_address empty): only on a node started with can_prefill
//    (FAILED_PRECONDITION otherwise); the engine prefills and decodes the request itself.
//  * Disaggregated: the engine reserves KV blocks for the prompt (RESOURCE_EXHAUSTED when it
//    cannot), a fresh notification tag is registered, and Prefill is called on prefill_address
//    with the blocks as destination and the transfer deadline
//    D = min(request deadline, now + prefill_timeout). When Prefill succeeds and every part of
//    the tag's notifications has landed (waited for until D + 1 s), the request joins the batch
//    with the prefill node's first token. When Prefill fails, the client cancels or the deadline
//    passes, the prefill node is asked to Cancel: if it answers quiesced the blocks are freed at
//    once, otherwise (node unreachable) at D + agent_abort_grace + quiesce_grace, when no write
//    into them can still land (a reaper thread does it; the RPC does not wait). The RPC then
//    returns UNAVAILABLE "prefill node <addr> failed: ..." (the router retries elsewhere),
//    CANCELLED or DEADLINE_EXCEEDED.
//  * Streaming: one chunk per engine output (token ids, text_delta when `detokenize`, logprobs
//    when sampling.return_logprobs); the last one carries finish_reason and usage. A client
//    cancel, a passed deadline or a failed Write aborts the request in the engine, waits for its
//    final output (so its blocks are freed) and returns CANCELLED / DEADLINE_EXCEEDED. A request
//    that fails in the engine returns the engine's status. After a disaggregated prefill the
//    usage's Timing also breaks the TTFT down: prefill_compute_us, kv_transfer_us and
//    kv_transfer_exposed_us from the prefill node's answer, decode_queue_us measured here (the
//    first token emitted to the second, the first decoded here).
// Abort(request_id) aborts the live request(s) with that id (a Generate in its prefill phase
// cancels its Prefill call); the stream then ends with FINISH_REASON_ABORTED and status OK.
//
// Time: every deadline decision, timestamp and duration (the request deadline, the transfer
// deadline D, deferred-release times, stray-tag expiry, Timing.prefill_us / decode_queue_us) reads
// DecodeServiceOptions::clock, so tests drive them with a FakeClock (common/fake_clock.h).
// deadline_unix_us is read in that clock's time base (the wall clock in production); the RPC's
// own deadline, a wall-clock time, counts as the same time remaining from the clock's now.
// Blocking waits run in real time: the polls every kPollInterval, the dispatcher's wait for
// notifications and the Cancel call's cancel_timeout; a wait until a clock deadline (the Prefill
// call's gRPC deadline, the wait for the notifications, the reaper) lasts the same remaining time
// on the real clock.
//
// Threads: Start() launches a notification dispatcher (drains the runtime agent's notifications
// into a kv_transfer::NotificationTracker) and a reaper (deferred FailRemotePrefill). Stop()
// joins them; it is meant to run after the runtime has drained (WorkerRuntime::Drain stops the
// engine and the agent, so no write can land and every block is freed): releases still pending
// are then done at once. Called while the runtime still serves, Stop() waits for each pending
// release until it is due instead.
//
// Thread-safety: the RPC handlers and ContributeStats are thread-safe; Start/Stop are called
// once each by the owner. Not copyable or movable. The runtime must outlive the service.
#ifndef DEEPINFER_DECODE_NODE_DECODE_SERVICE_H_
#define DEEPINFER_DECODE_NODE_DECODE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/request_validation.h"
#include "grpcpp/grpcpp.h"
#include "kv_transfer/notification_tracker.h"
#include "node/worker_runtime.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"
#include "proto/deepinfer/internal/v1/prefill.grpc.pb.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::decode_node {

struct DecodeServiceOptions {
  // Longest a remote prefill (compute + KV transfer) may take before the decode node gives up on
  // the prefill node (UNAVAILABLE, so the router retries elsewhere).
  absl::Duration prefill_timeout = absl::Seconds(30);
  // Margin past the transfer deadline plus the agent's abort_grace after which a write from an
  // unreachable prefill node can no longer land in reserved blocks.
  absl::Duration quiesce_grace = absl::Seconds(2);
  // The runtime agent's AgentConfig::abort_grace (the agent tears endpoints down this long after
  // a post's deadline).
  absl::Duration agent_abort_grace = absl::Seconds(1);
  // Deadline of the Cancel call to a prefill node.
  absl::Duration cancel_timeout = absl::Seconds(2);
  // Completions of notification tags no request is waiting for are kept this long (the prefill
  // response and the notifications may arrive in either order).
  absl::Duration stray_tag_ttl = absl::Seconds(60);
  // The time every deadline and duration is judged by (see the header comment); absl::Now when
  // empty.
  std::function<absl::Time()> clock;
};

class DecodeService final : public internal::v1::Decode::Service {
 public:
  DecodeService(node::WorkerRuntime* runtime, DecodeServiceOptions options);
  ~DecodeService() override;  // Stop()
  DecodeService(const DecodeService&) = delete;
  DecodeService& operator=(const DecodeService&) = delete;

  // Parses the model's generation defaults and starts the dispatcher and reaper threads.
  // kInvalidArgument naming generation_config.<key> for a bad generation_config.json.
  absl::Status Start();
  void Stop();

  grpc::Status Generate(grpc::ServerContext* context, const internal::v1::DecodeRequest* request,
                        grpc::ServerWriter<v1::GenerateChunk>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const internal::v1::DecodeAbortRequest* request,
                     internal::v1::DecodeAbortResponse* response) override;

  // Adds requests_ok / requests_failed / requests_cancelled (a node::StatsContributor).
  void ContributeStats(internal::v1::WorkerStats* stats) const;

  // Deferred releases not yet done (for tests).
  size_t pending_releases() const;

 private:
  struct Call;
  struct Release {
    absl::Time due;
    std::string engine_id;
    absl::Status status;
  };

  absl::Status Validate(const internal::v1::DecodeRequest& request,
                        engine::SamplingParams* sampling) const;
  // The whole request after validation; the returned status is the RPC's.
  absl::Status RunColocated(grpc::ServerContext* context, std::shared_ptr<Call> call,
                            engine::EngineRequest engine_request, absl::Time deadline,
                            grpc::ServerWriter<v1::GenerateChunk>* writer);
  absl::Status RunDisaggregated(grpc::ServerContext* context,
                                const internal::v1::DecodeRequest& req, std::shared_ptr<Call> call,
                                uint64_t tag, engine::EngineRequest engine_request,
                                absl::Time deadline, grpc::ServerWriter<v1::GenerateChunk>* writer);
  // The engine callback: queues each output for the handler (never blocks).
  static engine::OutputCallback QueueOutputs(const std::shared_ptr<Call>& call);
  // Writes the engine's outputs until the final one; see the header comment.
  // `remote`: the prefill node's answer for a remote prefill (its timing goes into Timing), else
  // null.
  absl::Status Stream(grpc::ServerContext* context, Call& call, absl::Time deadline,
                      int64_t cached_prompt_tokens, int64_t prefill_us,
                      const internal::v1::PrefillResponse* remote,
                      grpc::ServerWriter<v1::GenerateChunk>* writer);

  internal::v1::Prefill::Stub* PrefillStub(const std::string& address);

  // Notification tags (unique per node; registered before the Prefill call that uses them).
  void RegisterTag(uint64_t tag);
  // True once every part of `tag` has landed; false when `deadline` passed first.
  bool WaitTag(uint64_t tag, absl::Time deadline);
  void ReleaseTag(uint64_t tag);
  void DispatchLoop();

  void ScheduleRelease(Release release);
  void ReapLoop();

  // options_.clock, or absl::Now.
  absl::Time Now() const;
  // The wall-clock time at which `deadline` (by Now()) is due, for real blocking waits, and the
  // reverse, for a wall-clock deadline such as the RPC's. Identities when options_.clock is empty.
  absl::Time RealDeadline(absl::Time deadline) const;
  absl::Time ClockDeadline(absl::Time real_deadline) const;

  void AddLive(const std::shared_ptr<Call>& call);
  void RemoveLive(const Call& call);

  node::WorkerRuntime* const runtime_;
  const DecodeServiceOptions options_;
  // The built-in (neutral) defaults: the router resolves the model's (api::ResolveSampling), so
  // these apply only to fields a caller other than the router left unset.
  const api::GenerationDefaults defaults_;
  api::RequestLimits limits_;

  // Serial of each Generate call: its notification tag and part of its engine and prefill ids.
  std::atomic<uint64_t> next_tag_{1};
  std::atomic<uint64_t> requests_ok_{0};
  std::atomic<uint64_t> requests_failed_{0};
  std::atomic<uint64_t> requests_cancelled_{0};

  // Prefill stubs, one channel per address.
  absl::Mutex stubs_mu_;
  std::map<std::string, std::unique_ptr<internal::v1::Prefill::Stub>> stubs_
      ABSL_GUARDED_BY(stubs_mu_);

  // Live requests by client request id (several when a retry reuses an id).
  absl::Mutex live_mu_;
  std::multimap<std::string, std::shared_ptr<Call>> live_ ABSL_GUARDED_BY(live_mu_);

  // Tags: registered ones (value: complete?) and completions of unregistered ones (value: when).
  absl::Mutex tags_mu_;
  absl::flat_hash_map<uint64_t, bool> tags_ ABSL_GUARDED_BY(tags_mu_);
  absl::flat_hash_map<uint64_t, absl::Time> stray_done_ ABSL_GUARDED_BY(tags_mu_);
  absl::flat_hash_map<uint64_t, absl::Time> stray_parts_ ABSL_GUARDED_BY(tags_mu_);
  kv_transfer::NotificationTracker tracker_ ABSL_GUARDED_BY(tags_mu_);

  mutable absl::Mutex reap_mu_;
  std::vector<Release> releases_ ABSL_GUARDED_BY(reap_mu_);  // unordered; few
  bool stop_ ABSL_GUARDED_BY(reap_mu_) = false;
  absl::CondVar reap_cv_;

  std::atomic<bool> stop_dispatch_{false};
  bool started_ = false;
  std::thread dispatcher_;
  std::thread reaper_;
};

}  // namespace deepinfer::decode_node

#endif  // DEEPINFER_DECODE_NODE_DECODE_SERVICE_H_
