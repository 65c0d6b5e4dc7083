// The router's public front door: deepinfer.v1.Inference (proto/deepinfer/v1/inference.proto)
// over one model, forwarding each request to a decode node (internal::v1::Decode) chosen from a
// WorkerRegistry.
//
// A Chat or Generate call, in order:
//   1. refused with kUnavailable "router is draining" after BeginDrain();
//   2. `model`: empty selects the served model; anything else -> kInvalidArgument naming model;
//   3. validation (api/request_validation.h), kInvalidArgument naming the field. Chat: the
//      messages are converted and rendered with the model's chat template, then tokenized
//      (kFailedPrecondition when the model has none). Image parts: refused with
//      kInvalidArgument naming messages[i].content[j].image when the model has no image token
//      (not a LLaVA-style model), kUnavailable when no vision encoder of the model is live;
//      otherwise the images go to one encoder (router/encoder_client.h: rendezvous by image hash,
//      so a repeated image meets the encoder that cached it), its kInvalidArgument for an
//      undecodable image names messages[i].content[j].image, and each rendered placeholder is
//      repeated once per embedding row (router/image_prompt.h); the embeddings travel inline in
//      DecodeRequest.images, the runs feed the prefix-cache hashes, and the last chunk's usage
//      reports images and cached_images (served from the encoder's embedding cache). Both: the
//      sampling parameters are checked against the model's generation defaults and context
//      (sampling.max_tokens when prompt + max_tokens exceeds it);
//   4. an empty request_id is replaced by a generated one ("chat-<16 hex>" / "gen-<16 hex>"); an
//      id that is already running -> kAlreadyExists naming request_id;
//   5. placement by the configured policy (router/placement.h; see "Placement" below): a decode
//      worker, and a prefill worker or "prefill locally" (DecodeRequest.prefill_address = "").
//      No decode worker -> kUnavailable "no decode worker for model ..."; no prefill worker and
//      no decode worker that can prefill -> kUnavailable; malformed inputs -> kInternal;
//   6. Decode.Generate on the chosen worker (one cached channel per address), with the client's
//      sampling parameters as given, deadline_unix_us from the client's deadline (else now +
//      default_timeout) and the same deadline on the call; cancellation of the client's call
//      propagates to it. Every chunk is relayed with the client's request id; the last chunk's
//      usage.timing gets first_token_us and total_us as the router saw them (microseconds since
//      it received the request; queued_us and prefill_us stay the decode node's);
//   7. one retry: when the decode call ends kUnavailable before any chunk was relayed, placement
//      runs again without the failed decode and prefill workers and the request is sent once
//      more with request_id "<id>#r1". Any other error, or one after the first chunk, ends the
//      client's call with the decode node's status (codes map 1:1).
// Placement: under one lock, a CandidateWorker per live prefill/decode worker of the model
// (WorkerRegistry::ListLive; counts are the last load report plus what this router placed there
// since: queue_depth += placed requests (prefill), running_sequences += placed requests
// (decode), queued_input_tokens += placed tokens, free_kv_blocks -= placed blocks; before the
// first report free = total = kv_capacity_blocks), with cached_prefix_blocks =
// WorkerRegistry::PrefixOverlap of the prompt's block-hash chain (router/prompt_block_hashes.h,
// with the workers' block_hash_seed and block_size, and the request's cache_salt). The policy
// decides with blocks_needed = ceil((prompt + 1) / block_size); when no decode worker has that
// many free blocks by the registry's estimate, it decides again with 0 (the decode node's
// engine is the authority on KV room and refuses with RESOURCE_EXHAUSTED itself). The choice is
// recorded with WorkerRegistry::RecordPlacement (prefill target: the uncached tokens it
// computes; decode worker: the blocks) and released when the attempt ends (ReleasePlacement).
// A retry excludes the failed attempt's workers, but a role left with no candidate falls back
// to all its live workers (the decode node cannot tell whether it or its prefill node failed).
// Each decision is logged at debug level with its inputs and counted in
// deepinfer_placement_decisions_total.
//
// Metrics (options.metrics, router/router_metrics.h): every Chat/Generate call is counted by
// outcome with its latencies and tokens when it returns.
//
// Abort(request_id) cancels the running decode call; that request's stream then ends with a last
// chunk whose finish_reason is ABORTED, and status OK.
//
// Tenants (options.tenants, router/tenants.h; null: every call is served as before, with the
// client's cache salt and priority): every method first authenticates the call's
// `authorization: Bearer <key>` metadata (kUnauthenticated) and checks that the tenant may use
// the served model (kPermissionDenied), before anything else. Chat and Generate then check the
// priority (kPermissionDenied above the tenant's max_priority) and admit the call against the
// tenant's limits (kResourceExhausted, with the seconds to wait in the message and in a
// `retry-after` trailing metadata entry), before validation, so a refused call costs no
// tokenization and reaches no worker. The request's cache salt becomes Tenants::CacheSalt (the
// tenant's namespace), its prompt tokens are charged at admission and its completion tokens when
// it ends. Abort finds only requests of the caller's own tenant (found=false for another's).
//
// Every finished Chat/Generate call logs one info line: request id, decode and prefill worker,
// prompt and completion tokens, TTFT, attempts and outcome.
//
// Thread-safety: every method is thread-safe; the gRPC server calls them from its threads.
#ifndef DEEPINFER_ROUTER_INFERENCE_SERVICE_H_
#define DEEPINFER_ROUTER_INFERENCE_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "api/request_validation.h"
#include "engine/block_hash.h"
#include "engine/model_assets.h"
#include "grpcpp/channel.h"
#include "grpcpp/server_context.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"
#include "proto/deepinfer/v1/inference.grpc.pb.h"
#include "router/encoder_client.h"
#include "router/placement.h"
#include "router/transfer_cost.h"
#include "router/router_metrics.h"
#include "router/tenants.h"
#include "router/worker_registry.h"

namespace deepinfer::router {

struct InferenceServiceOptions {
  // The id clients name in ChatRequest.model / GenerateRequest.model and that workers register
  // with (WorkerInfo.model); non-empty.
  std::string model_id;
  // The placement policy's name: "cache_aware" or "least_loaded" (CreatePlacementPolicy).
  std::string placement_policy = "cache_aware";
  // Its options. local_prefill_threshold_tokens: a can_prefill decode worker prefills locally
  // when it would compute fewer than this many prompt tokens; 0 (the default here) = only when
  // no prefill worker is live. max_exposed_transfer_fraction (off by default): it also prefills
  // locally when the transfer measured from earlier disaggregated requests
  // (router/transfer_cost.h) would leave more than that fraction of the compute exposed.
  PlacementOptions placement{.local_prefill_threshold_tokens = 0};
  // Where calls and placements are counted; not owned, must outlive the service. Null: nowhere.
  RouterMetrics* metrics = nullptr;
  // Largest encoded image, bytes (checked before anything is sent to an encoder).
  size_t max_image_bytes = size_t{20} << 20;
  // Most chat text bytes in one Chat request (api::RequestLimits::max_chat_text_bytes), checked
  // before the messages are converted, rendered or tokenized.
  size_t max_chat_text_bytes = size_t{4} << 20;
  // Deadline of a request whose client set none; > 0.
  absl::Duration default_timeout = absl::Minutes(10);
  // Largest message on the channels to decode workers, bytes.
  int max_message_bytes = 64 << 20;
  // Who may call and their limits; not owned, must outlive the service. Null: no checks.
  Tenants* tenants = nullptr;
};

class InferenceService final : public v1::Inference::Service {
 public:
  // `registry` and `assets` are not owned and must outlive the service. kInvalidArgument for an
  // empty model_id, an unknown placement_policy or bad placement options (naming the option), a
  // non-positive default_timeout, or a generation_config.json whose defaults do not parse
  // (naming generation_config.<key>).
  static absl::StatusOr<std::unique_ptr<InferenceService>> Create(WorkerRegistry* registry,
                                                                  const engine::ModelAssets* assets,
                                                                  InferenceServiceOptions options);

  InferenceService(const InferenceService&) = delete;
  InferenceService& operator=(const InferenceService&) = delete;

  grpc::Status Chat(grpc::ServerContext* context, const v1::ChatRequest* request,
                    grpc::ServerWriter<v1::ChatChunk>* writer) override;
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateChunk>* writer) override;
  // kInvalidArgument naming request_id when it is empty; found=false for an id not running.
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  // One model: id, max_context_tokens (config max_position_embeddings), supports_images (the
  // model has an image token and a live encoder),
  // architecture, vocab_size.
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;

  // From now on Chat and Generate are refused with kUnavailable; calls already admitted go on.
  // Abort and ListModels are still served. Idempotent.
  void BeginDrain();
  bool draining() const;
  // Waits until no Chat/Generate call is in flight, at most `timeout`; true when idle.
  bool WaitIdle(absl::Duration timeout);
  // Chat/Generate calls admitted and not yet finished.
  int in_flight() const;

  const v1::ModelInfo& model_info() const { return model_info_; }

 private:
  // A request ready to forward.
  struct Prepared {
    std::string request_id;
    std::vector<uint32_t> prompt_token_ids;
    // The client's sampling with the model's defaults resolved (api::ResolveSampling): workers
    // receive it as is.
    v1::SamplingParams sampling;
    std::string cache_salt;
    int32_t priority = 0;
    bool detokenize = false;
    // Images (Chat only): their embeddings in prompt order (inline data from an encoder), where
    // their placeholder runs are (for the prefix-cache hashes), and how many came from an
    // encoder's embedding cache.
    std::vector<internal::v1::EmbeddingHandle> images;
    std::vector<engine::ImageSpan> image_spans;
    uint32_t cached_images = 0;
  };
  // What a finished call did, for its log line and metrics.
  struct Outcome {
    std::string decode_worker = "-";
    std::string prefill_worker = "-";
    int attempts = 0;
    int64_t completion_tokens = 0;
    int64_t first_token_us = -1;
    bool aborted = false;
    // From the last chunk's usage; -1 when none arrived.
    int64_t cached_prompt_tokens = -1;
    int64_t queued_us = -1;
  };
  // Where one attempt goes, and what RecordPlacement recorded (given back when it ends).
  struct Placement {
    WorkerSnapshot decode;
    int64_t decode_blocks = 0;
    int64_t decode_tokens = 0;              // the uncached tokens when prefilling locally
    std::optional<WorkerSnapshot> prefill;  // unset: colocated
    int64_t prefill_tokens = 0;
    std::string prefill_worker_id;  // empty: colocated
    std::string prefill_address;    // empty: colocated
  };
  // A running request, by its client-facing id (for Abort).
  struct LiveRequest {
    absl::Mutex mu;
    grpc::ClientContext* call ABSL_GUARDED_BY(mu) = nullptr;
    bool aborted ABSL_GUARDED_BY(mu) = false;
    // The tenant that started it (set before it is published in live_); "" without tenants.
    std::string tenant_id;
  };
  class Admission;

  InferenceService(WorkerRegistry* registry, const engine::ModelAssets* assets,
                   InferenceServiceOptions options, api::GenerationDefaults defaults,
                   std::unique_ptr<PlacementPolicy> policy);

  absl::Status CheckModel(absl::string_view model) const;
  // The caller's tenant from its metadata, allowed to use the served model; null without
  // options.tenants.
  absl::StatusOr<std::shared_ptr<const Tenant>> Authorize(const grpc::ServerContext* context);
  // Chat with images: encodes `prompt.images` on the encoder pool and expands the rendered
  // prompt's placeholders (router/image_prompt.h) into `prepared`.
  absl::Status PrepareImages(grpc::ServerContext* context, const api::ChatPrompt& prompt,
                             const std::vector<int32_t>& rendered, Prepared* prepared);
  std::string NewRequestId(absl::string_view prefix);
  absl::StatusOr<Placement> Place(const Prepared& request, absl::Span<const std::string> exclude);
  // A request finished on `decode` having generated `completion`: tells the registry that the
  // decode worker now holds the KV of the prompt and all but the last generated token
  // (WorkerRegistry::ExpectStored), so that the conversation's next turn, which arrives before the
  // worker's KV events, is placed where its history is.
  void ExpectHistory(const Prepared& request, const internal::v1::WorkerInfo& decode,
                     const std::vector<uint32_t>& completion) const;
  // One placement from the registry's current state; kAborted when a chosen worker vanished
  // before its placement was recorded (the caller tries again).
  absl::StatusOr<Placement> PlaceOnce(const Prepared& request,
                                      absl::Span<const std::string> exclude)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(placement_mu_);
  std::unique_ptr<internal::v1::Decode::Stub> DecodeStub(const std::string& address);
  // Places and forwards `request`, relaying chunks through `write` (false: the client is gone).
  grpc::Status Forward(grpc::ServerContext* context, absl::Time received, const Prepared& request,
                       LiveRequest* live, absl::FunctionRef<bool(v1::GenerateChunk&)> write,
                       Outcome* outcome);
  // What Chat and Generate share: the tenant checks, admission, `prepare` (validation through
  // tokenization, filling a Prepared), Forward, and the final log line and metrics. `priority` is
  // the client's.
  grpc::Status Serve(grpc::ServerContext* context, absl::string_view client_request_id,
                     int32_t priority,
                     absl::FunctionRef<absl::Status(Prepared*)> prepare,
                     absl::FunctionRef<bool(v1::GenerateChunk&)> write);
  // Logs the call's line and counts it in the metrics.
  void Finish(absl::string_view request_id, absl::Time received, int64_t prompt_tokens,
              const Outcome& outcome, const grpc::Status& status) const;

  WorkerRegistry* const registry_;
  const engine::ModelAssets* const assets_;
  const InferenceServiceOptions options_;
  const api::GenerationDefaults defaults_;
  const api::RequestLimits limits_;
  EncoderClient encoders_;
  v1::ModelInfo model_info_;
  RouterMetrics* const metrics_;

  // Serialises placements, so that each sees the counts the previous one recorded.
  absl::Mutex placement_mu_;
  const std::unique_ptr<PlacementPolicy> policy_;
  // Measured prefill compute and exposed KV transfer of finished disaggregated requests (their
  // Timing), for placement.max_exposed_transfer_fraction.
  TransferCostModel transfer_cost_;

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<LiveRequest>> live_ ABSL_GUARDED_BY(mu_);
  absl::BitGen bitgen_ ABSL_GUARDED_BY(mu_);

  absl::Mutex channels_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_
      ABSL_GUARDED_BY(channels_mu_);
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_INFERENCE_SERVICE_H_
