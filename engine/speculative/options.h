// Options of speculative decoding (EngineOptions::speculative). Validated by
// SpeculativeController::Create (kInvalidArgument naming the field as "speculative.<field>").
// The measurements behind the tuned defaults are in docs/speculative-decoding.md.
#ifndef DEEPINFER_ENGINE_SPECULATIVE_OPTIONS_H_
#define DEEPINFER_ENGINE_SPECULATIVE_OPTIONS_H_

#include <string>

#include "engine/speculative/budget.h"
#include "engine/speculative/mode_selector.h"

namespace deepinfer::engine {

// The decode node fills this from its flags (node/worker_runtime.cc); a prefill-only node has no
// use for it. Plain data; copied into the engine by Create.
struct SpecOptions {
  bool enabled = false;
  // "ngram": prompt lookup (ngram_drafter.h). "draft_model": a small checkpoint with the target's
  // vocabulary (model_drafter.h), loaded from `draft_model_path`; its drafts are sampled at each
  // request's temperature (arg-max at 0) and carry their distribution, so rejection sampling stays
  // lossless.
  std::string drafter = "ngram";
  int min_n = 1;                   // n-gram drafter: shortest suffix matched, >= 1
  int max_n = 4;                   // longest suffix matched, in [min_n, 64]
  int num_speculative_tokens = 4;  // k: drafts proposed per sequence and step, in [1, 64]

  // ---- Draft model ----
  // Hugging Face checkpoint directory (required with drafter "draft_model").
  std::string draft_model_path;
  // Blocks of its own KV cache (EngineOptions::block_size tokens each), >= 0; 0: the target's
  // num_blocks, so every sequence the target holds fits. When full, the least recently used
  // sequence's draft KV is evicted and recomputed on its next draft.
  int draft_num_blocks = 0;
  int draft_threads = 0;  // its forward-pass threads; <= 0: all
  // At most this many not-yet-cached context tokens are fed per sequence and step (a new prompt
  // catches up over several steps instead of stalling one); 0: no limit. 128: a catch-up never
  // stalls a decode step by more than a short prefill.
  int draft_catch_up_tokens = 128;
  // A sequence whose draft KV lags its context by more than this many tokens skips ahead: only the
  // context's last this-many tokens are fed (ModelDrafterOptions::catch_up_window), so drafting
  // after a stretch without it costs a bounded catch-up. Lossless; 0: every token is fed. Applies
  // only while at least draft_catch_up_window_min_sequences (>= 1) sequences decode.
  int draft_catch_up_window = 0;
  int draft_catch_up_window_min_sequences = 1;
  // Adaptive: on steps that draft nothing, every decoding sequence whose draft KV lags by this many
  // tokens or more is fed (at most draft_catch_up_tokens each; not in a bucket the selector froze),
  // so switching drafting back on costs one short catch-up; the feeding is part of the step's
  // measured period. 0: no feeding. 16: the selector otherwise measured drafting epochs after
  // non-drafting ones as mostly catch-up.
  int draft_upkeep_tokens = 16;

  // ---- Adaptive verification (budget.h, SpeculativeController) ----
  // Each step verifies the number of drafts that maximises expected tokens per second, from online
  // per-position acceptance estimates (n-gram: by match length; draft model: calibrated from its
  // confidence) and a cost table profiled at creation (or `cost_table`), corrected online by a fit
  // of measured against predicted forward passes and by the measured per-step overhead
  // (synchronous and overlapped steps apart). A draft model first chooses one draft length L in
  // [0, k] for the step (a longer L must promise 3% more tokens per second); with L >= 2 each
  // sequence may stop early by its calibrated confidence. L = 0 skips drafting (the step then
  // overlaps with the previous one). Every `probe_interval`-th step verifies one draft more than
  // the plan (the gap doubles, up to 16x, while no plan drafts). A measured check overrules the
  // plan's "draft" where drafting steps realised fewer tokens per second at that batch size.
  // Lossless: every decision uses only earlier steps. With a flat or missing cost table every
  // draft is verified (a warning is logged).
  bool adaptive = false;
  // Adaptive: the mode selector (DraftModeSelector) runs the plan, fixed lengths (1, 2, 4, ... up
  // to select_max_length, plus the length that fills one pass of the CPU's projections) or no
  // drafting, whichever realises the most tokens per second at the current batch size. On by
  // default: it recovers what the plan's cost models leave out, at about 0.2% of the run.
  bool select_mode = true;
  // The longest fixed length the selector measures, in [0, num_speculative_tokens]; 0: k. The
  // plan itself may still verify up to k: a cheap n-gram drafter can verify long runs where they
  // pay, where a fixed length that long pays its verification everywhere.
  int select_max_length = 0;
  speculative::DraftModeSelector::Options select_options;  // epochs and exploration
  // Draft model: the step drafts up to the longest L whose predicted rate is at least (1 -
  // draft_stop_extend) x the best L's, in [0, 1), for the confidence stop to cut, from
  // draft_stop_extend_min_decoding (>= 1) decoding sequences on; 0: the best L. 0.25 from 3:
  // the extension pays where several sequences share a step (docs/speculative-decoding.md).
  double draft_stop_extend = 0.25;
  int draft_stop_extend_min_decoding = 3;
  int profile_runs = 5;  // forward passes per profiled shape (median), >= 5
  // The cached context of every sequence in the profiled steps, >= 1 (less where the KV cache or
  // the model's positions do not fit it). 512: a verified token's price grows with the context,
  // and service contexts are hundreds of tokens.
  int profile_context = 512;
  // On a CPU backend whose projections multiply several tokens per pass, the profile also measures
  // the edges where one token more starts a pass in its rows of at most this many requests, >= 0;
  // 0 (auto): 8 where a pass takes kAutoEdgeRowsPerPass tokens or more (AMX), else 1.
  int profile_edge_requests = 0;
  static constexpr int kAutoEdgeRowsPerPass = 16;
  int probe_interval = 16;  // steps between probes, >= 0; 0: no probes
  // Draft model: a probe's sequence drafts one position past its confidence stop; false: the
  // plan's length + 1 without the stop.
  bool probe_past_stop = true;
  // Use this table (copied by Create) instead of profiling. Unset: Create profiles the model,
  // running forward passes on it (so no other thread may be running the model then).
  const speculative::CostTable* cost_table = nullptr;
  // Draft model: the round cost (StepSeconds(n, n): one pass of n sequences x 1 token) to use
  // instead of profiling it (ModelDrafter::ProfileRoundCost); copied by Create.
  const speculative::CostTable* draft_cost_table = nullptr;
};

}  // namespace deepinfer::engine

#endif  // DEEPINFER_ENGINE_SPECULATIVE_OPTIONS_H_
