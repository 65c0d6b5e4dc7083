// Options of speculative decoding (EngineOptions::speculative).
#ifndef DEEPINFER_ENGINE_SPECULATIVE_OPTIONS_H_
#define DEEPINFER_ENGINE_SPECULATIVE_OPTIONS_H_

#include <string>

#include "engine/speculative/budget.h"
#include "engine/speculative/mode_selector.h"

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

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_SPECULATIVE_OPTIONS_H_
