// The serving engine: many concurrent requests share one model and one paged KV cache.
//
// - Continuous batching with a per-step token budget; chunked prefill mixed with decode tokens
//   in the same step.
// - Prefix reuse: prompts are hashed per block (block_hash.h); blocks whose KV is already cached
//   are shared copy-free (block_manager.h); new full blocks are published once computed.
// - Admission control: a request is admitted (priority first, then FCFS) only when its prompt's
//   blocks can be reserved; it waits otherwise; a full waiting queue rejects Submit with
//   kResourceExhausted.
// - Preemption by recompute when a running sequence cannot grow: the newest lowest-priority
//   sequence gives its blocks back and re-enters the queue with its tokens so far; outputs do not
//   change (its sampler state is kept).
// - Overlap: while step N runs on the executor thread, the scheduler thread prepares step N+1
//   (admission, block allocation, block tables); the only synchronisation is on step N's sampled
//   tokens, which are filled into step N+1's inputs when it is submitted. With overlap off the
//   two alternate on one thread. The executor is where a CUDA stream would be driven.
// - Sliding-window models (every layer windowed) give back blocks older than the window as the
//   sequence advances, so a long generation holds O(window) blocks. (Hybrid models keep all
//   blocks: their full-attention layers read every key; their sliding layers share the table.)
// - Abort at any point frees every block the request held (after the step that may be using
//   them has finished).
// - Speculative decoding (EngineOptions::speculative, off by default; engine/speculative, driven
//   through speculative::SpeculativeController): a decoding sequence's drafter proposes up to k
//   tokens; the step feeds the last accepted token plus the k' drafts it verifies and gets logits
//   for all 1 + k' positions; the verifier (greedy, or rejection sampling: lossless) emits 1..k'+1
//   tokens. The KV of rejected positions is rolled back (the sequence's length returns to the
//   accepted count and blocks needed only by rejected positions are freed); only blocks whose
//   tokens are all accepted are published to the prefix cache. EOS, stop token ids, max_tokens and
//   stop strings apply per emitted token. Overlap with speculation: a step that verifies drafts
//   runs synchronously (the next step's positions depend on how many drafts it accepts, and
//   drafting needs every sequence's latest token). Before scheduling a step the controller decides
//   (Plan), from earlier steps only, whether it may draft. If it may, the step in flight is waited
//   for and processed first; if not (adaptive draft length 0 / verification budget 0, and not a
//   probe), the step is scheduled while the previous one runs, exactly as without speculation.
//   Drafts share the step's token budget with what one token per decode and the running prefills
//   leave. Greedy outputs are token-identical to decoding without speculation; sampled outputs have
//   the same distribution, but a seed reproduces a run only under the same non-adaptive SpecOptions
//   (rejection sampling draws differently; an adaptive budget depends on measured step times).
//
// Thread-safety: Submit, Abort and GetStats are thread-safe. Output callbacks run on the engine's
// scheduler thread and must not block (hand the output to another queue). Start() launches the
// threads; Stop() (or the destructor) aborts what is left, emits a final output for every
// request, and joins them. Not copyable or movable.
#ifndef DEEPINFER_ENGINE_LLM_ENGINE_H_
#define DEEPINFER_ENGINE_LLM_ENGINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/block_manager.h"
#include "engine/forward_backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/speculative/controller.h"
#include "engine/speculative/options.h"
#include "engine/speculative/stats.h"
#include "engine/text_stream.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
class ChatTemplate;
}  // namespace deepinfer::engine

namespace deepinfer::engine {

struct EngineOptions {
  int num_blocks = 1024;
  int block_size = 16;
  int max_batch_tokens = 512;  // token budget per step
  int max_running = 64;        // sequences in the running batch
  int max_waiting = 4096;      // queue bound; beyond it Submit returns kResourceExhausted
  bool enable_prefix_cache = true;
  bool chunked_prefill = true;
  // Prepare step N+1 on the scheduler thread while step N runs on the executor thread. Worth it
  // with a CPU for each; on one (a pinned process) the two threads only take turns and it is
  // slower, so workers turn it off there (--overlap).
  bool overlap = true;
  uint64_t hash_seed = 0;
  std::vector<int32_t> eos_token_ids;
  // Optional text support (not owned, must outlive the engine). With a tokenizer, outputs carry
  // text deltas and sampling.stop strings end requests; with a chat template as well, requests
  // may carry chat messages instead of token ids. `template_context` (bos_token, eos_token, ...)
  // is merged into every render.
  const tokenizer::Tokenizer* tokenizer = nullptr;
  // Optional: where the KV pools live. Called once by Create with the bytes of each pool (K, V);
  // returns two 64-byte aligned buffers that outlive the engine (e.g. from
  // kv_transfer::TransferAgent::AllocateMemory, so peers can write blocks straight into them).
  // Unset: the engine allocates them itself.
  std::function<absl::StatusOr<std::pair<void*, void*>>(size_t pool_bytes)> kv_memory;
  // Optional (not owned; outlives the engine): run every forward pass on this backend (a GPU:
  // engine/cuda/cuda_backend.h) over its own KV pools, which must have the host cache's geometry
  // (kInvalidArgument "backend: <field> ..." otherwise). The host cache above stays the transfer
  // surface: a finished SubmitPrefill's prompt blocks are downloaded into it before the
  // PrefillCallback runs, and CompleteRemotePrefill uploads the transferred blocks from it
  // (engine/forward_backend.h). Unset: the CPU model over the host cache. A draft model
  // (SpecOptions::draft_model_path) runs on the CPU either way.
  ForwardBackend* backend = nullptr;
  const ChatTemplate* chat_template = nullptr;
  nlohmann::ordered_json template_context = nlohmann::ordered_json::object();
  SpecOptions speculative;
};

// One image of a multimodal prompt: its embeddings replace the input embeddings of the prompt's
// placeholder tokens (ModelConfig::image_token_id) at [position, position + num_tokens).
struct ImageEmbeddings {
  std::string content_hash;  // 32 bytes (SHA-256 of the encoded image); the prefix-cache key
  int64_t position = 0;      // prompt index of the first of its num_tokens placeholder tokens
  int64_t num_tokens = 0;
  // num_tokens x hidden_size, row-major f32 (the projector's output); shared, never modified.
  // May be null only in ReserveForRemotePrefill (see there).
  std::shared_ptr<const std::vector<float>> data;
};

// Disaggregated serving (prefill side): layer `layer`'s K/V of the request's prompt tokens
// [0, kv_end) is in the engine's KV cache (kv_cache()), in the blocks `block_table` names (at least
// ceil(kv_end / block_size) entries, prompt order; valid only during the call).
struct LayerKvReady {
  int layer = 0;
  int64_t kv_end = 0;
  absl::Span<const int32_t> block_table;
};
// Called on the thread running the step's forward pass (the executor thread, or the scheduler
// thread when the step runs inline), between layers of that pass: it must not block (post a
// transfer and return). See EngineRequest::on_layer_kv.
using LayerKvCallback = std::function<void(const LayerKvReady&)>;

struct EngineRequest {
  std::string request_id;  // unique among live requests
  std::vector<int32_t> prompt;
  // Images, sorted by position, their runs disjoint and inside the prompt (after rendering
  // `messages`), every covered token the model's image_token_id and every image_token_id token
  // of the prompt covered. Each image's content_hash goes into the hash of every block its run
  // overlaps (PromptBlockHashes in block_hash.h): the same tokens with the same image share
  // cached blocks, with another image not from the image's first block on.
  std::vector<ImageEmbeddings> images;
  // Chat messages (a JSON array) rendered with the chat template and tokenized, used instead of
  // `prompt` when not null. Needs EngineOptions::tokenizer and chat_template.
  nlohmann::ordered_json messages;
  bool add_generation_prompt = true;
  SamplingParams sampling;
  std::string cache_salt;
  int priority = 0;  // higher first
  // SubmitPrefill only (ignored elsewhere; may be empty): layer-wise KV streaming. For every
  // forward pass computing a chunk of the prompt, called once per layer in layer order, right
  // after that layer's K/V of the chunk is stored (before the pass's later layers run); chunks in
  // prompt order, so for a layer kv_end only grows. Blocks wholly below kv_end (and the prompt's
  // last block once kv_end == prompt length) hold that layer's final KV and are not written again
  // while the request holds them; the block ids stay the ones PrefillResult::block_ids names. A
  // request with a hook is never preempted (its blocks may be the source of transfers in
  // flight). After an abort, engine stop or failed step its blocks are freed once the step ends:
  // what a transfer reads from them afterwards is garbage. Not called with EngineOptions::backend
  // (forward_backend.h) nor for models whose every layer is sliding-window (their old blocks are
  // released during the prefill): the caller then sends the KV after the PrefillCallback.
  LayerKvCallback on_layer_kv;
};

struct RequestUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t completion_tokens = 0;
  int64_t queue_us = 0;        // arrival -> first scheduled
  int64_t first_token_us = 0;  // arrival -> first token (TTFT)
  int64_t total_us = 0;        // arrival -> finish
  double mean_itl_us = 0.0;    // mean gap between consecutive tokens
  int64_t max_itl_us = 0;
  int64_t preemptions = 0;
  // Speculative decoding (0 when off): draft tokens sent to the model for verification, and of
  // those the ones accepted (for v1::Usage.draft_tokens / accepted_draft_tokens).
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
};

struct EngineOutput {
  std::string request_id;
  std::vector<StepOutput> new_tokens;  // tokens since the previous output
  std::string text_delta;              // with a tokenizer: their final text (UTF-8 safe)
  std::string matched_stop;            // the stop string that ended the request, if any
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  absl::Status status;  // non-OK when the request failed (finished is then true)
  RequestUsage usage;   // filled on the final output
};

using OutputCallback = std::function<void(const EngineOutput&)>;

// Disaggregated serving (decode side): blocks reserved for a prompt whose KV another node writes.
struct KvReservation {
  std::vector<int32_t> block_ids;  // one per block_size prompt tokens, in prompt order
  int64_t cached_tokens = 0;       // leading tokens already present here (prefix cache)
  int block_size = 0;
};

// Disaggregated serving (prefill side): the prompt's KV is computed and held for transfer.
struct PrefillResult {
  int32_t first_token = 0;
  float first_logprob = 0.0f;
  std::vector<TokenLogprob> first_top;
  std::vector<int32_t> block_ids;  // the prompt's blocks in this engine's KV cache
  int64_t cached_tokens = 0;       // prompt tokens this engine served from its prefix cache
};
using PrefillCallback = std::function<void(absl::StatusOr<PrefillResult>)>;

// Queue, step and block figures; the speculative-decoding ones (spec_*) come from
// speculative::SpecStats.
struct EngineStats : speculative::SpecStats {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t awaiting_kv = 0;  // reserved for a remote prefill (ReserveForRemotePrefill)
  int64_t held = 0;         // prefilled here, blocks held for transfer (SubmitPrefill)
  // Tokens still to compute before waiting sequences (and running ones still in their prompt)
  // produce their first token: the prefill backlog a load report calls queued input tokens.
  int64_t pending_prefill_tokens = 0;
  BlockManagerStats blocks;
  int64_t steps = 0;
  int64_t step_tokens = 0;     // tokens computed over all steps
  int64_t step_sequences = 0;  // sequences over all steps (mean batch = this / steps)
  int64_t last_step_tokens = 0;
  int64_t last_step_sequences = 0;
  double forward_seconds = 0.0;           // executor time in forward + sampling
  double schedule_seconds = 0.0;          // scheduler time preparing steps
  double exposed_schedule_seconds = 0.0;  // of which not hidden behind a running step
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t window_released_blocks = 0;  // blocks given back early by sliding-window models
  int64_t kv_events_dropped = 0;
  // Overlap (EngineOptions::overlap): steps handed to the executor thread while the scheduler
  // prepared the next one, and (speculation) steps that first waited for the step in flight
  // because they were allowed to draft.
  int64_t overlapped_steps = 0;
  int64_t spec_synced_steps = 0;
};

class LlmEngine {
 public:
  // `model` must outlive the engine. kInvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<LlmEngine>> Create(Model* model,
                                                           const EngineOptions& options);
  LlmEngine(const LlmEngine&) = delete;
  LlmEngine& operator=(const LlmEngine&) = delete;
  ~LlmEngine();

  absl::Status Start();
  void Stop();

  // Queues a request. kInvalidArgument (named field) for bad input, kAlreadyExists for a live
  // id, kResourceExhausted when the queue is full or the prompt can never fit in the KV cache,
  // kFailedPrecondition when not started. On OK, `on_output` will be called at least once, the
  // last time with finished == true.
  absl::Status Submit(EngineRequest request, OutputCallback on_output);

  // Aborts a request (waiting or running); its final output has kAborted. False if unknown.
  // Requests reserved for a remote prefill or held after a local prefill are only marked: their
  // blocks may be the source or target of a transfer in flight, so they end (aborted) when the
  // caller calls FailRemotePrefill / CompleteRemotePrefill / ReleasePrefilled.
  bool Abort(const std::string& request_id);

  // ---- Disaggregated prefill/decode (thread-safe; they wait for the scheduler thread) ----

  // Decode side: validates `request` as Submit does and reserves KV blocks for its prompt, reusing
  // this engine's prefix cache (those leading blocks need no transfer). The request then waits,
  // outside the batch, until CompleteRemotePrefill or FailRemotePrefill. kResourceExhausted when
  // the blocks cannot be reserved now. Images need their content_hash, position and num_tokens
  // (for the block hashes); their `data` may be null (the prefill node computes the prompt), but
  // then a preemption cannot recompute the prompt here and ends the request with
  // kResourceExhausted instead.
  absl::StatusOr<KvReservation> ReserveForRemotePrefill(EngineRequest request,
                                                        OutputCallback on_output);
  // Every reserved block now holds the prompt's KV (the transfer's notification arrived) and the
  // prefill node sampled `first.token`: the request emits it and joins the running batch.
  absl::Status CompleteRemotePrefill(const std::string& request_id, const StepOutput& first);
  // The remote prefill failed or was cancelled, and no write into the reservation can still land
  // (the caller waited for the transfer to be terminal): frees the blocks and ends the request
  // with `status`.
  absl::Status FailRemotePrefill(const std::string& request_id, absl::Status status);

  // Prefill side: computes the prompt's KV (reusing the prefix cache; images need their data) and
  // samples the first token; `done` receives the blocks, which stay allocated (for the transfer)
  // until ReleasePrefilled. `done` runs on the scheduler thread and must not block.
  // request.on_layer_kv, when set, streams the KV as it is computed (see EngineRequest).
  absl::Status SubmitPrefill(EngineRequest request, PrefillCallback done);
  // Releases a held prefill's blocks (their KV stays in the prefix cache). kNotFound if unknown.
  absl::Status ReleasePrefilled(const std::string& request_id);

  // The KV cache, for registering its memory with a transfer engine. Valid for the engine's
  // lifetime; blocks are addressed as KvCache documents.
  KvCache* kv_cache() const { return cache_.get(); }

  EngineStats GetStats() const;

  // KV events (blocks stored in / removed from the prefix index) since the last call, oldest
  // first, for the worker's publisher and the router's global prefix index. Events are kept until
  // drained, up to `kMaxPendingKvEvents`; beyond that the oldest are dropped and
  // `kv_events_dropped` tells the subscriber to resynchronise from a snapshot.
  static constexpr size_t kMaxPendingKvEvents = 1 << 20;
  std::vector<KvEvent> DrainKvEvents();

 private:
  struct Sequence;
  struct Planned;
  struct Step;

  LlmEngine(Model* model, const EngineOptions& options, std::unique_ptr<KvCache> cache);

  void SchedulerLoop();
  // Scheduler thread, mu_ held: the queue and block figures of stats_ (running, waiting, awaiting
  // KV, held, pending prefill, blocks) from the scheduler's lists, and the block manager's new KV
  // events into kv_events_. After every loop iteration and every RunOnScheduler command.
  void PublishQueueStats();
  void ExecutorLoop();
  // Plans the next step. With speculation, `plan.may_draft` requires that no step is in flight.
  std::unique_ptr<Step> Schedule(const speculative::StepPlan& plan);
  // Plans `seq` for up to `*budget` tokens of `step` (with the drafts in its `draft`); sets
  // `*preempting` when it had to ask another sequence to give its blocks back.
  void PlanSequence(Sequence* seq, Step* step, int64_t* budget, bool* preempting);
  // Admits the first waiting sequence (its blocks, the prefix cache) into running_; false when
  // its blocks cannot be allocated now.
  bool AdmitWaiting();
  // Speculative decoding: the next step's decoding sequences (one known token to feed, counting
  // samples in flight; `views` for the controller, parallel to `decodes`), and the tokens and
  // sequences of the prompts it continues.
  void CollectDecodes(std::vector<Sequence*>* decodes,
                      std::vector<speculative::DecodeView>* views, int64_t* prefill_tokens,
                      int* prefills);
  // Whether the next step may draft (controller_->Plan); no drafting without a controller.
  speculative::StepPlan PlanDrafting();
  // Speculative decoding in Schedule: drafts for the decoding sequences (or the draft model's
  // upkeep) within `budget`, into each sequence's `draft`.
  void PrepareSpeculation(const speculative::StepPlan& plan, int64_t budget, Step* step);
  // Fills step inputs from the now-known tokens and runs it (inline without overlap or with
  // drafts, else on the executor). Returns true when the step was handed to the executor; else
  // sets `*executed_at` to when its execution ended (if it ran).
  bool FinalizeAndSubmit(std::unique_ptr<Step> step,
                         std::chrono::steady_clock::time_point* executed_at);
  // `image_data_required`: false only for ReserveForRemotePrefill (hashes suffice there).
  absl::StatusOr<std::unique_ptr<Sequence>> MakeSequence(EngineRequest request,
                                                         OutputCallback on_output,
                                                         bool image_data_required = true);
  // kInvalidArgument naming the field when `images` do not fit `prompt` (see EngineRequest).
  absl::Status ValidateImages(const std::vector<int32_t>& prompt,
                              const std::vector<ImageEmbeddings>& images, bool data_required) const;
  // Every full block's hash of the sequence's tokens (PromptBlockHashes with its images).
  std::vector<uint64_t> FullBlockHashes(const Sequence& seq) const;
  // Admission bookkeeping shared by Submit and SubmitPrefill: the live-id check, the queue bound,
  // then hand-off to the scheduler.
  absl::Status Enqueue(std::unique_ptr<Sequence> seq);
  // Runs `fn` on the scheduler thread and waits for it. kFailedPrecondition when not running.
  absl::Status RunOnScheduler(std::function<absl::Status()> fn);
  Sequence* FindIn(std::list<std::unique_ptr<Sequence>>& list, const std::string& id);
  // Per-step counts Process gathers over a step's items.
  struct StepTally {
    int64_t tokens = 0;            // tokens the step computed
    int64_t emitted_tokens = 0;    // sequences that sampled (one token each before drafts)
    int64_t verified = 0;          // draft tokens verified
    int64_t accepted = 0;          // of those, accepted
    int64_t generated_before = 0;  // the sampled sequences' output tokens before the step
  };
  // Processes a finished step's outputs: every item (ProcessItem), then the step's figures
  // (FinishStep).
  void Process(Step& step);
  // One item of a processed step: its KV and blocks, its verified drafts, its emitted tokens.
  void ProcessItem(const Step& step, Planned& p, StepTally* tally);
  // A prefill-only sequence sampled its first token: hold its blocks for the transfer.
  void HoldPrefilled(Sequence* seq, SampleResult& first, int64_t kv_end);
  // Emits a sampling sequence's tokens up to the first stop condition; its KV is valid up to
  // `kv_end`; `drafted`: the step verified drafts for it (blocks of rejected positions freed).
  void EmitTokens(Sequence* seq, bool drafted, std::vector<SampleResult>* emitted,
                  int64_t kv_end);
  // The step's timing and counters (stats_, the controller's OnStepProcessed).
  void FinishStep(const Step& step, const StepTally& tally);
  // The debug-level "step-trace" line (tools/bench/step_trace_summary.py reads it).
  void LogStepTrace(const Step& step, const StepTally& tally,
                    std::chrono::steady_clock::time_point processed_at) const;
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);
  void HandleAborts();
  void Preempt(Sequence* seq);
  void CommitBlocks(Sequence* seq);
  // Sliding-window models: gives back blocks no future step will read.
  void ReleaseOutOfWindow(Sequence* seq);
  void ExecuteStep(Step& step);
  // Records a sampled or verified token in the sequence's sampler state.
  void RecordOutputToken(Sequence* seq, int32_t token);
  // The cost profile's forward pass (speculative::ProfileStepFn): `requests` sequences at
  // `context` cached tokens feed `tokens` new ones into scratch blocks; returns its seconds.
  absl::StatusOr<double> ProfileStep(int tokens, int requests, int64_t context);
  // Speculative decoding: the controller's counters into stats_ (mu_ held).
  void ExportSpecStats();
  // Tokens the backend's projections multiply per pass over the weights (kernels::
  // LinearRowsPerPass on the CPU; 0 for another backend, whose passes are not the CPU's).
  int RowsPerPass() const;
  // One forward pass on EngineOptions::backend, or on the CPU model over the host cache.
  // `on_layer_kv` (may be empty) goes to Model::Forward; a backend gets none (forward_backend.h).
  absl::Status RunForward(const std::vector<SequenceInput>& batch, std::vector<float>* logits,
                          const std::function<void(int layer)>& on_layer_kv = nullptr);

  Model* const model_;
  const EngineOptions options_;
  std::unique_ptr<KvCache> cache_;
  BlockManager blocks_;  // scheduler thread only
  const bool overlap_;   // options.overlap

  // Submission side (guarded by mu_).
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  std::vector<std::string> abort_requests_;
  std::deque<KvEvent> kv_events_;
  std::deque<std::function<void()>> commands_;
  std::unordered_map<std::string, Sequence*> live_;  // all requests not yet finished
  bool started_ = false;
  bool stopping_ = false;
  int64_t queued_ = 0;  // requests submitted and not yet admitted (incoming + waiting)
  EngineStats stats_;

  // Scheduler thread state.
  std::list<std::unique_ptr<Sequence>> waiting_;
  std::list<std::unique_ptr<Sequence>> running_;
  std::list<std::unique_ptr<Sequence>> awaiting_kv_;  // reserved for a remote prefill
  std::list<std::unique_ptr<Sequence>> held_;         // prefilled here, blocks held for transfer
  std::vector<std::unique_ptr<Sequence>> finished_pending_free_;
  uint64_t next_seq_id_ = 1;
  uint64_t arrival_counter_ = 0;

  // Executor mailbox (guarded by exec_mu_).
  std::mutex exec_mu_;
  std::condition_variable exec_cv_;
  std::unique_ptr<Step> exec_in_;
  std::unique_ptr<Step> exec_out_;
  bool exec_stop_ = false;

  std::thread scheduler_;
  std::thread executor_;

  // Speculative decoding (scheduler thread only; null when off).
  std::unique_ptr<speculative::SpeculativeController> controller_;
  // When the last step's outputs were processed (scheduler thread); a step's period starts there.
  // Unset after the engine idled.
  std::chrono::steady_clock::time_point last_processed_at_;
  bool have_last_processed_ = false;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_LLM_ENGINE_H_
