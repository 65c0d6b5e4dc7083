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
// - Speculative decoding (EngineOptions::speculative, off by default): a decoding sequence's
//   drafter (engine/speculative) proposes up to k tokens; the step feeds the last accepted token
//   plus the k' drafts it verifies and gets logits for all 1 + k' positions; the verifier (greedy,
//   or rejection sampling: lossless) emits 1..k'+1 tokens. The KV of rejected positions is rolled
//   back (the sequence's length returns to the accepted count and blocks needed only by
//   rejected positions are freed); only blocks whose tokens are all accepted are published to
//   the prefix cache. EOS, stop token ids, max_tokens and stop strings apply per emitted token.
//   Overlap with speculation: a step that verifies drafts runs synchronously (the next step's
//   positions depend on how many drafts it accepts, and drafting needs every sequence's latest
//   token). Before scheduling a step the engine decides, from earlier steps only (the adaptive
//   planner's inputs: cost tables, overhead estimates, acceptance estimates, the probe counter;
//   without `adaptive`: always), whether it may draft. If it may, the step in flight is waited
//   for and processed first; if not (adaptive draft length 0 / verification budget 0, and not a
//   probe), the step is scheduled while the previous one runs, exactly as without speculation.
//   Drafts share the step's token budget with what one token per decode and the running
//   prefills leave.
//   Greedy outputs are token-identical to decoding without speculation; sampled outputs have the
//   same distribution, but a seed reproduces a run only under the same non-adaptive SpecOptions
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
#include "engine/block_manager.h"
#include "engine/forward_backend.h"
#include "engine/generate.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/speculative/budget.h"
#include "engine/speculative/mode_selector.h"
#include "engine/text_stream.h"
#include "nlohmann/json.hpp"

namespace deepinfer::engine {
class ChatTemplate;
namespace speculative {
class DraftCalibration;
class Drafter;
class ModelDrafter;
class NgramSurvivalStats;
}  // namespace speculative
}  // namespace deepinfer::engine

namespace deepinfer::engine {

// Speculative decoding. The decode node (node/worker_runtime.cc, where it builds EngineOptions)
// should fill this from its flags; a prefill-only node has no use for it.
struct SpecOptions {
  bool enabled = false;
  // "ngram": prompt lookup (engine/speculative/ngram_drafter.h). "draft_model": a small checkpoint
  // with the target's vocabulary (engine/speculative/model_drafter.h), loaded by Create from
  // `draft_model_path`; its drafts are sampled at each request's temperature (arg-max at 0) and
  // carry their distribution, so rejection sampling stays lossless.
  std::string drafter = "ngram";
  int min_n = 1;                   // n-gram drafter: shortest suffix matched, >= 1
  int max_n = 4;                   // longest suffix matched, in [min_n, 64]
  int num_speculative_tokens = 4;  // k: drafts proposed per sequence and step, in [1, 64]
  // Draft model: Hugging Face checkpoint directory (required with drafter "draft_model"), the
  // blocks of its own KV cache (EngineOptions::block_size tokens each; 0: as many as the target's
  // cache, EngineOptions::num_blocks, so every sequence the target holds fits in the draft cache
  // too; the least recently used sequence's draft KV is evicted when full and recomputed on its
  // next draft) and its forward-pass threads (<= 0: all).
  std::string draft_model_path;
  int draft_num_blocks = 0;
  int draft_threads = 0;
  // Draft model: at most this many not-yet-cached context tokens are fed to the draft model per
  // sequence and step (a new request's prompt catches up over several steps, drafting once it
  // has, instead of stalling one step for the whole prompt); 0: no limit.
  int draft_catch_up_tokens = 128;
  // Draft model: a sequence whose draft KV lags its context by more than this many tokens skips
  // ahead instead of catching up (speculative::ModelDrafterOptions::catch_up_window): the draft
  // model keeps what it holds and is fed only the context's last this-many tokens, so drafting
  // after a stretch without it (a bucket the selector froze on no drafting, a new request's prompt)
  // costs a bounded catch-up, not a prefill of everything since. Lossless (drafts are verified); 0:
  // every token is fed.
  int draft_catch_up_window = 0;
  // Draft model: the window applies only while at least this many sequences decode (fewer: every
  // token is fed; speculative::ModelDrafterOptions::catch_up_window_min_sequences). >= 1.
  int draft_catch_up_window_min_sequences = 1;
  // Draft model, adaptive: on steps that draft nothing (no drafting mode of the selector, or the
  // plan's L = 0), every decoding sequence whose draft KV lags its context by this many tokens or
  // more is fed (speculative::ModelDrafter::Feed, at most draft_catch_up_tokens each), so the draft
  // model stays within this many tokens of every sequence. A step that drafts after steps that
  // did not then feeds only that little, so switching drafting back on costs one short catch-up,
  // not a prefill of everything since the last draft (a new request's whole prompt, for every
  // running sequence): without it the selector measured a drafting epoch after one without as
  // mostly catch-up, and non-drafting epochs did not pay for the work they left behind. The
  // feeding runs in the step's period, so non-drafting modes' measured rates include it. Not in
  // the epochs of a bucket the selector froze (no drafting mode comes within its freeze_below of
  // not drafting there: speculative::DraftModeSelector), whose rare trials catch up instead. 0: no
  // feeding (the draft model catches up when it next drafts).
  int draft_upkeep_tokens = 16;
  // Adaptive verification (engine/speculative/budget.h): each step verifies the number of drafts
  // that maximises expected tokens per second, from online per-position acceptance estimates (keyed
  // by n-gram match length, or for a draft model calibrated from its confidence: DraftCalibration
  // in budget.h) and a cost table profiled on the model when the engine is created. The step time
  // in the objective is the forward time the table predicts, corrected by an online fit of measured
  // against predicted forward passes (speculative::ForwardCostFit: scale x table + offset +
  // per-request cost, forgetting at 0.99 per step), plus the measured per-step overhead: an
  // exponential average (weight 0.1 per step) of each adaptive step's period (from processing the
  // previous step's outputs, or from its scheduling after an idle engine, through processing its
  // own) minus its measured forward pass (and minus a draft model's measured drafting time),
  // clamped >= 0; so under load, when a step's fixed cost is large, verifying more drafts pays, and
  // when forward passes run slower than profiled, it pays less. Synchronous steps (those that may
  // draft) and overlapped ones (EngineOptions::overlap, no drafts) keep separate averages: drafting
  // is weighed at the first against not drafting at the second (until a synchronous step was
  // measured, the overlapped average stands in for it). A draft model pays for every token it
  // drafts, so before drafting the step chooses one draft length L in [0, k] for its decoding
  // sequences (PlanDraftLength) from the prior acceptance rows, the target's cost, the overhead and
  // the draft model's cost per round (n sequences x 1 token, profiled at creation, scaled by the
  // average ratio of measured to profiled drafting time); a longer L must promise 3% more tokens
  // per second than the best shorter one; L = 0 skips drafting and verification for the step (which
  // then overlaps with the previous one). With L >= 2 each sequence may stop early: before drawing
  // draft token j >= 1 the drafter asks (speculative::DraftRequest::keep_drafting) whether its
  // calibrated survival a_j, from the draft's confidences so far, is at least the plan's tokens per
  // second x (the forward time of one more verified token + its share of a draft round); the
  // drafted tokens are then all verified (lossless: each decision precedes its token's draw). The
  // n-gram drafter (nearly free) drafts k, unless even the most optimistic acceptance rows (the
  // best over match lengths) would verify none: then it is not asked. Probes count steps with
  // decoding sequences; one falls due at the next that can draft. Probing: every
  // `probe_interval`-th adaptive step verifies one draft more per sequence than the plan (a draft
  // model drafts one more for the one sequence whose draft cache lags least, one position past its
  // confidence stop, so after a run of L = 0 one sequence catches up and verifies one token), so
  // that positions the plan stopped verifying keep being observed and estimates can recover; 0
  // turns probing off. While no plan between two probes drafts, the gap doubles (up to 16 x
  // probe_interval), and it returns to probe_interval once a plan drafts again. A measured check
  // overrules the plan's "draft": where the steps it drafted in (probes aside) emitted fewer tokens
  // per second than those it did not, at the same number of decoding sequences (bucketed by powers
  // of two), the step does not draft, until that measurement fades
  // (speculative::DraftingRateCheck); likewise a draft model's planned length L >= 2 becomes 1
  // where steps drafting 2 or more tokens measured slower than steps drafting 1. Still lossless:
  // the draft length, the budget and probes depend only on earlier steps (and the step count). With
  // a flat or missing cost table every draft is verified (and a warning is logged once).
  bool adaptive = false;
  // Adaptive: measure the plan above against fixed draft lengths (1, 2, 4, ... up to k) and no
  // drafting, and run whichever realises the most tokens per second at the current number of
  // decoding sequences (speculative::DraftModeSelector: epochs of >= 16 steps, or 4 of many
  // sequences, and 0.25 s; each losing mode revisited, at a cost of about 0.2% of the run, in a
  // trial whose steps alternate with the incumbent's; draft lengths past a clear loser pruned;
  // buckets where no drafting mode pays frozen, without draft-model upkeep). Off: the plan decides
  // every step.
  bool select_mode = true;
  // With select_mode: the longest fixed draft length measured against the plan (lengths 1, 2,
  // 4, ... up to it, and it); 0: num_speculative_tokens. The plan itself may still draft and
  // verify up to num_speculative_tokens. An n-gram drafter costs nothing per proposed token, so a
  // long cap lets the plan verify long runs where its estimates say they pay (a request copying
  // text: at one decoding sequence 65% of 8-token verifications were accepted whole, issue 12,
  // session 21), while a fixed length that long pays its verification everywhere: at 8
  // concurrent requests a fixed 16 took the 5-8 bucket (its trials rated it 96-100% of the plan)
  // and ran a third of the node's time at 76% of the plan's tokens per second (session 22).
  // On the CPU the lengths also hold the one whose single sequence fills a pass of the
  // projections over the weights (kernels::LinearRowsPerPass - 1, where above 1 and below the
  // longest: 3 on AVX-512 BF16): a fourth token in a pass costs little and a fifth starts the
  // next. At one decoding request a draft model's fixed 3 ran 1.81 tokens/ms where 2 ran 1.69 and
  // the selector, choosing among the plan, 1, 2, 4 and 8, 1.58 (issue 12, session 40). Under the
  // selector's draft catch-up window (16 tokens, node/worker_flags.h) its 3 emitted 2.31-2.33
  // tokens a step where the fixed node's emitted 2.62 (the later positions copy from earlier turns,
  // which the window hides), and two full sweeps measured no clear gain at one request (1.40 and
  // 1.48 of no speculation against sweeps before at 1.37 and 1.49); a node with the window off lost
  // 2-12% at every concurrency. The selector runs 3 where it measures fastest.
  int select_max_length = 0;                        // in [0, num_speculative_tokens]
  speculative::DraftModeSelector::Options select_options;  // the selector's epochs and exploration
  // Adaptive, draft model: how far below the best draft length's predicted rate (relative, in
  // [0, 1)) a longer length may be and still be drafted, for the confidence stop to cut. The plan
  // scores each L as if every sequence drafted all L tokens, so where the prior rows rate L = 1
  // and L = 2 about alike (ties and near-ties go to the shorter) it drafts 1, and with L = 1 no
  // confidence stop runs (it decides positions j >= 1): no second token is drafted, not even
  // where the draft is confident. At one decoding sequence the plan drafted 1 token in 92% of its
  // steps (issue 12, session 31: a node running the plan at about k = 1's rate). With a slack s
  // > 0 the step drafts up to the longest L whose rate is at least (1 - s) x the best L's, and each
  // sequence stops once its calibrated survival is not worth the next token (the threshold from
  // the best L's rate and budget, as before): the stop drafts a position only where it raises
  // the expected rate, so L with the stop does at least as well as without. The measured check on
  // long drafts (steps drafting 2 or more against steps drafting 1) overrules it where on (below).
  // Still lossless: L comes from earlier steps' estimates. 0: the best L.
  // Default 0.25 from at least draft_stop_extend_min_decoding decoding sequences (0 until issue
  // 12, session 36). Measured beside the plan without it (and without the length check) in the
  // same rounds, draft model, decode tokens/s per ms of step period by decoding count: 1.97
  // against 1.75 at 5-8 (2.35 tokens a sequence-step for 2.0 verified; a node running k = 1
  // alone 1.79) and 2.08 against 1.90 at 17-32 (2.33 for 1.88; k = 1 alone 2.01), but 1.24
  // against 1.40 at one sequence, where the stop's lower threshold reaches positions whose
  // calibrated survival is optimistic (3 verified, 1 accepted, in a third of its steps), and
  // 1.30 against 1.42 at 2. From 5 instead (issue 12, session 38, beside 3 in the same 6 rounds):
  // 1.097 / 1.093 of no speculation at 8 / 32 concurrent requests against 1.143 / 1.135.
  double draft_stop_extend = 0.25;
  int draft_stop_extend_min_decoding = 3;  // >= 1: fewer decoding sequences draft the best L
  int profile_runs = 5;     // adaptive: forward passes per profiled shape (median), >= 5
  // Adaptive: the context (tokens already cached) of every sequence in the profiled steps, >= 1;
  // less where the KV cache or the model's positions do not fit it (LlmEngine::ProfileCost). A
  // verified draft token attends over its sequence's context like any other, so the table's price
  // of one token more grows with it: at 32 (until issue 12, session 40) the table priced a token
  // at 8 requests at 0.10 ms where steps in service at ~600 cached tokens paid 0.15, and the plan
  // verified 1.9 drafts a sequence at 5-8 decoding requests, 7% slower than drafting one.
  int profile_context = 512;
  // Adaptive, on a CPU backend whose projections multiply several tokens per pass: the start-up
  // profile also measures the edges where one token more starts a pass
  // (speculative::CostProfileShapes) in its rows of at most this many requests, >= 0; 0 (auto): 8
  // where a pass takes kAutoEdgeRowsPerPass tokens or more (AMX), else 1. With 1 (as until issue
  // 12, session 42) only the one-request row holds them, so at 2-8 decoding sequences the table
  // spreads a pass's cost evenly between its powers of two: with AMX (16 rows a pass, one token
  // past a pass 0.8 ms at 8 requests, where the 15 tokens before it cost 0.9) an n-gram node's plan
  // at 3-4 sequences verified 5.7 drafts a sequence, as many as a fixed length of 8, for 2.7
  // tokens/ms where a node drafting 4 ran 3.2; with 8 it ran 3.0, and 4% faster at 8 concurrent
  // requests (session 42). On 4-row passes (AVX-512 BF16) a pass's jump is close to the profile's
  // noise, and edges at 8 and 32 requests drove the plan with it (session 39).
  int profile_edge_requests = 0;
  static constexpr int kAutoEdgeRowsPerPass = 16;
  int probe_interval = 16;  // adaptive: steps between probes, >= 0
  // Adaptive, draft model: a probe's sequence drafts one position past its confidence stop
  // (speculative::ConfidenceStop). False (as until issue 12, session 37): it drafts the plan's
  // length + 1 without the stop.
  bool probe_past_stop = true;
  // Adaptive: use this table (copied by Create; e.g. profiled once per node, or a fixed one in
  // tests) instead of profiling. Unset: Create profiles the model, running forward passes on it
  // (so no other thread may be running the model then).
  const speculative::CostTable* cost_table = nullptr;
  // Adaptive with a draft model: the draft round cost (StepSeconds(n, n): one pass of n
  // sequences x 1 token) to use instead of profiling the draft model
  // (speculative::ModelDrafter::ProfileRoundCost); copied by Create.
  const speculative::CostTable* draft_cost_table = nullptr;
};

struct EngineOptions {
  int num_blocks = 1024;
  int block_size = 16;
  int max_batch_tokens = 512;  // token budget per step
  int max_running = 64;        // sequences in the running batch
  int max_waiting = 4096;      // queue bound; beyond it Submit returns kResourceExhausted
  bool enable_prefix_cache = true;
  bool chunked_prefill = true;
  // Prepare step N+1 on the scheduler thread while step N runs on the executor thread. Worth it
  // with a CPU for each; on one (a pinned process) the two threads only take turns: a
  // no-speculation decode node measured 6-8% slower with it (issue 12, session 12, A/B in the same
  // rounds), so workers turn it off there (--overlap).
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

struct EngineStats {
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
  // Speculative decoding (0 when off).
  int64_t spec_steps = 0;             // steps that verified at least one draft token
  int64_t spec_drafted_tokens = 0;    // tokens the drafter proposed (capped by k and max_tokens)
  int64_t spec_verified_tokens = 0;   // of those, fed to the model for verification
  int64_t spec_accepted_tokens = 0;   // of those, accepted
  bool spec_adaptive_active = false;  // adaptive budget in use (a usable cost table exists)
  int64_t spec_cost_context = 0;      // the context the cost table was profiled at; 0: given
  // Adaptive steps with decoding sequences: their predicted time (forward scale x cost table +
  // overhead + predicted drafting, with the estimates before the step), their measured time
  // (period through output processing; SpecOptions::adaptive), and the current per-step overhead
  // estimate of synchronous steps in the objective (average of the period - the measured forward
  // pass - measured draft-model drafting, clamped >= 0).
  int64_t spec_timed_steps = 0;
  double spec_predicted_step_seconds = 0.0;
  double spec_measured_step_seconds = 0.0;
  double spec_overhead_seconds = 0.0;
  // Drafting time: measured (the drafter's calls) and, for a draft model, predicted.
  double spec_draft_seconds = 0.0;
  double spec_draft_predicted_seconds = 0.0;
  double spec_draft_cost_scale = 1.0;  // draft model: measured / profiled drafting, averaged
  // Measured target forward time ~= scale x profiled + offset + per_request x requests
  // (speculative::ForwardCostFit).
  double spec_forward_scale = 1.0;
  double spec_forward_offset_seconds = 0.0;
  double spec_forward_per_request_seconds = 0.0;
  int64_t spec_no_draft_steps = 0;  // draft model, adaptive: steps that chose L = 0
  // Draft model: sequences whose draft KV was evicted to make room (SpecOptions::draft_num_blocks)
  int64_t spec_draft_evictions = 0;
  // Draft model: context tokens whose draft KV a new request adopted from a finished one's
  int64_t spec_draft_reused_tokens = 0;
  // Draft model: context tokens never fed to it, skipped by SpecOptions::draft_catch_up_window
  int64_t spec_draft_skipped_tokens = 0;
  // Draft model, adaptive: context tokens fed to the draft model on steps that drafted nothing
  // (SpecOptions::draft_upkeep_tokens), and the time spent feeding them.
  int64_t spec_draft_upkeep_tokens = 0;
  double spec_draft_upkeep_seconds = 0.0;
  // Adaptive with select_mode and a draft model: steps in which the draft model caught up on a
  // whole prompt, left out of the selector's measurements (a per-request cost of every mode).
  int64_t spec_prompt_catch_up_steps = 0;
  int64_t spec_probe_steps = 0;  // adaptive steps that probed (probe_interval)
  // Adaptive: steps the plan would have drafted in but did not, because drafting steps measured
  // fewer tokens/s than non-drafting ones at that many decoding sequences (DraftingRateCheck).
  int64_t spec_rate_vetoed_steps = 0;
  // Adaptive with select_mode (speculative::DraftModeSelector): steps run by the plan, at a fixed
  // draft length and without drafting; epochs; epochs given to a mode that was not the best
  // measured; the current epoch's mode (-1: the plan, else its fixed draft length, 0: none).
  int64_t spec_select_plan_steps = 0;
  int64_t spec_select_fixed_steps = 0;
  int64_t spec_select_off_steps = 0;
  // Steps of the selector's modes that also computed prompt tokens (a local prefill's chunk):
  // left out of its measurements.
  int64_t spec_select_prompt_steps = 0;
  int64_t spec_select_epochs = 0;
  int64_t spec_select_explorations = 0;
  int64_t spec_select_mode = -1;
  // The longest fixed draft length a selector step ran (0: none), and the most draft tokens one
  // sequence verified in one step (any mode).
  int64_t spec_select_longest_fixed = 0;
  int64_t spec_longest_verified = 0;
  // The fixed draft lengths the selector measures against the plan, ascending (empty: no
  // selector; SpecOptions::select_max_length).
  std::vector<int> spec_select_lengths;
  // Overlap (EngineOptions::overlap): steps handed to the executor thread while the scheduler
  // prepared the next one, and (speculation) steps that first waited for the step in flight
  // because they were allowed to draft.
  int64_t overlapped_steps = 0;
  int64_t spec_synced_steps = 0;
  // Adaptive with overlap: the per-step overhead of overlapped steps (no drafts), averaged as
  // spec_overhead_seconds but over the time between consecutive steps' completions; the plan
  // compares drafting (synchronous, spec_overhead_seconds) against not drafting at this cost.
  double spec_overlap_overhead_seconds = 0.0;
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

  // Speculative decoding: whether the next step may draft (then the step in flight is processed
  // before it is scheduled) and whether it probes. Decided from earlier steps only.
  struct DraftGate {
    bool may_draft = false;
    bool probe = false;
    // The mode selector's choice (selector_): its mode index (-1 without one), whether the step
    // is measured, and for a fixed-length mode that length (-1: the plan decides).
    int mode = -1;
    bool mode_measured = false;
    int fixed_length = -1;
    // Whether a step that drafts nothing feeds the draft model (UpkeepDrafter): not in a bucket
    // the selector froze (speculative::DraftModeSelector::Choice::upkeep), and whether that feeding
    // also catches up sequences far behind (Choice::catch_up).
    bool upkeep = true;
    bool upkeep_catch_up = true;
  };

  void SchedulerLoop();
  // Scheduler thread, mu_ held: the queue and block figures of stats_ (running, waiting, awaiting
  // KV, held, pending prefill, blocks) from the scheduler's lists, and the block manager's new KV
  // events into kv_events_. After every loop iteration and every RunOnScheduler command.
  void PublishQueueStats();
  void ExecutorLoop();
  // Plans the next step. With speculation, `gate.may_draft` requires that no step is in flight.
  std::unique_ptr<Step> Schedule(const DraftGate& gate);
  DraftGate PlanDrafting();
  // The per-step overhead (seconds, >= 0) of a synchronous step, for the adaptive plans.
  double SyncOverheadSeconds() const;
  // The planner's view of a synchronous (drafting) step: the counts given, the fitted forward
  // cost (forward_fit_) and the synchronous overhead.
  speculative::StepShape SyncStepShape(int sampling_requests, int step_tokens,
                                       int step_requests) const;
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
  void Process(Step& step);
  void Finish(Sequence* seq, FinishReason reason, absl::Status status);
  void HandleAborts();
  void Preempt(Sequence* seq);
  void CommitBlocks(Sequence* seq);
  // Sliding-window models: gives back blocks no future step will read.
  void ReleaseOutOfWindow(Sequence* seq);
  void ExecuteStep(Step& step);
  // Speculative decoding: the drafts each decoding sequence in `decodes` verifies this step
  // (adaptive or all), within `spare` extra tokens of the step's budget. `step_tokens` and
  // `step_requests` estimate the step's shape before drafts, for the cost table.
  // Records the step's predicted drafting time in `step`.
  // `fixed_length` >= 1: draft that many tokens per sequence (capped by max_tokens and the
  // budget) and verify all, as without adaptive verification; -1: the adaptive plan.
  // Draft model, adaptive, a step that drafts nothing: feeds the draft model the decoding
  // sequences whose draft KV lags by SpecOptions::draft_upkeep_tokens or more; with `catch_up`
  // false only those within the steady bound (not CatchesUpOnPrompt).
  void UpkeepDrafter(const std::vector<Sequence*>& decodes, bool catch_up, Step* step);
  // Draft model: whether a sequence whose draft KV lags its context by `lag` tokens is catching
  // up on a whole prompt (Step::spec_prompt_catch_up), beyond what steady drafting or the upkeep
  // leaves behind (2 x draft_upkeep_tokens + k + 1).
  bool CatchesUpOnPrompt(int64_t lag) const;
  // Of such a lag, the tokens beyond that bound (0 when within it).
  int64_t CatchUpExcess(int64_t lag) const;
  void Draft(const std::vector<Sequence*>& decodes, int64_t spare, int step_tokens,
             int step_requests, bool probe, int fixed_length, Step* step);
  // Records a sampled or verified token in the sequence's sampler state.
  void RecordOutputToken(Sequence* seq, int32_t token);
  // Profiles the model's step cost for the adaptive budget (called by Create).
  absl::Status ProfileCost();
  // Tokens the backend's projections multiply per pass over the weights (kernels::
  // LinearRowsPerPass on the CPU; 0 for another backend, whose passes are not the CPU's).
  int RowsPerPass() const;
  // One forward pass on EngineOptions::backend, or on the CPU model over the host cache.
  absl::Status RunForward(const std::vector<SequenceInput>& batch, std::vector<float>* logits);

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

  // Speculative decoding (scheduler thread only).
  std::unique_ptr<speculative::Drafter> drafter_;
  speculative::ModelDrafter* model_drafter_ = nullptr;  // drafter_ when it is a draft model
  std::unique_ptr<speculative::NgramSurvivalStats> survival_;
  std::unique_ptr<speculative::DraftCalibration> calibration_;  // draft model: instead of survival_
  std::unique_ptr<speculative::CostTable> cost_;                // null: verify every draft
  int64_t cost_context_ = 0;  // the context ProfileCost profiled at; 0: a given table
  std::unique_ptr<speculative::CostTable>
      draft_cost_;  // draft model round cost; null: drafting free
  // The step period outside the target's forward pass and the draft model's drafting, averaged
  // (synchronous steps).
  double overhead_ema_ = 0.0;
  bool have_overhead_ = false;
  // Measured forward time against the cost table's prediction and the request count: the
  // planner's StepShape::cost_scale and an offset added to its extra_seconds.
  speculative::ForwardCostFit forward_fit_;
  // Adaptive: measured tokens/s of drafting and non-drafting steps by batch size; vetoes the
  // plan's drafting where it measured slower (PlanDrafting).
  speculative::DraftingRateCheck rate_check_;
  // Adaptive with SpecOptions::select_mode: chooses between the plan, fixed lengths and no
  // drafting by measured tokens per second (scheduler thread only).
  std::optional<speculative::DraftModeSelector> selector_;
  int64_t logged_trial_epoch_ = -1;  // the selector's last trial already logged
  double overlap_overhead_ema_ = 0.0;  // the same for overlapped steps (no drafts)
  bool have_overlap_overhead_ = false;
  // When the last step's outputs were processed (scheduler thread); the period of an overlapped
  // step starts there. Unset after the engine idled.
  std::chrono::steady_clock::time_point last_processed_at_;
  bool have_last_processed_ = false;
  int steps_since_probe_ = 0;
  // Steps between probes now (probe_interval, doubled while no plan drafted in between), and
  // whether a plan drafted since the last probe.
  static constexpr int kMaxProbeBackoff = 16;
  int probe_gap_ = 0;
  bool planned_draft_since_probe_ = false;
  double draft_scale_ = 1.0;  // measured / profiled drafting time of the draft model, averaged
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_LLM_ENGINE_H_
