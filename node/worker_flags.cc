#include "node/worker_flags.h"

#include <cmath>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "Where to serve gRPC, host:port; port 0 lets the OS choose (see --port_file).");
ABSL_FLAG(std::string, advertise_host, "",
          "Host registered with the router instead of the listen host (e.g. the pod IP); empty "
          "= the bound host.");
ABSL_FLAG(std::string, router, "",
          "Router host:port to register with; empty = standalone (no registration).");
ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (config.json, *.safetensors, tokenizer.json). Required.");
ABSL_FLAG(std::string, model_id, "",
          "Model id registered with the router; empty = the last component of --model.");
ABSL_FLAG(std::string, worker_id, "",
          "Unique worker id in the cluster (1..128 bytes); empty = <role>-<hostname>-<pid>.");
ABSL_FLAG(int, kv_blocks, 4096, "KV-cache blocks (> 0); each holds --block_size tokens.");
ABSL_FLAG(int, block_size, 16,
          "Tokens per KV block (> 0); must match every prefill and decode node of the model.");
ABSL_FLAG(int, max_batch_tokens, 512, "Tokens computed per engine step (> 0).");
ABSL_FLAG(int, max_running, 64, "Sequences in the running batch (> 0).");
ABSL_FLAG(int, max_waiting, 4096,
          "Queued requests (> 0); beyond it requests are refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(bool, prefix_cache, true, "Reuse cached KV blocks of shared prompt prefixes.");
ABSL_FLAG(int, threads, 0, "Forward-pass threads (>= 0); 0 = all cores.");
ABSL_FLAG(std::string, overlap, "auto",
          "Prepare the next engine step while the current one runs (a second thread): on, off, or "
          "auto (on when the process may run on at least two CPUs; pinned to one, the two threads "
          "would only take turns on it).");
ABSL_FLAG(std::string, device, "cpu",
          "Where forward passes run: cpu, cuda (GPU 0; fails at start-up naming why it cannot) "
          "or auto (cuda when it can, else cpu with the reason logged).");
ABSL_FLAG(uint64_t, hash_seed, 0,
          "Seed of the prefix-cache block hashes; must match the cluster's other workers.");
ABSL_FLAG(std::string, kv_transport, "ucx",
          "KV transfer backend: ucx (between processes; set UCX_TLS, e.g. sm,self on one host) "
          "or loopback (one process only: tests).");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus /metrics and /healthz (e.g. 0.0.0.0:9091); empty = off.");
ABSL_FLAG(std::string, port_file, "",
          "Write the bound port here (atomically) once the server is up; empty = don't.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT: longest wait for in-flight requests before cancelling them "
          "(e.g. 30s, 500ms; >= 0).");
ABSL_FLAG(std::string, log_level, "info",
          "Log level: trace, debug, info, warn, error, critical or off.");
ABSL_FLAG(std::string, speculative, "off",
          "Speculative decoding on decode nodes: off, ngram (prompt lookup) or draft_model (a "
          "small checkpoint with the target's vocabulary, --draft_model). Give every "
          "prefill and decode node of a model the same speculative flags: the router refuses "
          "a worker whose config differs.");
ABSL_FLAG(int, num_speculative_tokens, 4,
          "With --speculative: draft tokens proposed per sequence and step, in [1, 64].");
ABSL_FLAG(int, ngram_min, 1, "With --speculative=ngram: shortest suffix matched (>= 1).");
ABSL_FLAG(int, ngram_max, 4,
          "With --speculative=ngram: longest suffix matched, in [--ngram_min, 64].");
ABSL_FLAG(std::string, draft_model, "",
          "With --speculative=draft_model: the draft checkpoint's directory (Hugging Face "
          "layout, same vocabulary as --model).");
ABSL_FLAG(int, draft_kv_blocks, 0,
          "With --speculative=draft_model: blocks of the draft model's own KV cache (--block_size "
          "tokens each, >= 0); 0: as many as --kv_blocks, so every sequence the target holds "
          "keeps its draft KV (fewer evict the least recently drafted sequences, whose prompts "
          "are then recomputed by the draft model).");
ABSL_FLAG(std::string, draft_catch_up_window, "auto",
          "With --speculative=draft_model: a sequence whose draft KV lags its context by more "
          "than this many tokens (a new prompt, or tokens decoded without drafts) skips ahead: "
          "the draft model keeps what it holds and is fed only the last this-many tokens, so a "
          "catch-up costs at most that much (0: every token is fed). Lossless: drafts are "
          "verified. auto: 16 with --spec_adaptive and --spec_select (whose buckets frozen on no "
          "drafting leave the draft model far behind) and with a fixed draft length of at most "
          "2 (whose drafts continue the recent text: a window made each drafting round 2-3 "
          "times cheaper at 32 decoding sequences for 1-5% fewer tokens per step), 0 for longer "
          "fixed drafts (which also copy from the whole conversation: 12-18% fewer tokens per "
          "step with a window).");
ABSL_FLAG(int32_t, draft_catch_up_window_min_sequences, 2,
          "With --draft_catch_up_window above 0: the window applies only while at least this "
          "many sequences decode (>= 1); with fewer, every token is fed (a lone request's prompt "
          "costs the draft model a short prefill, and its drafts see the whole conversation).");
ABSL_FLAG(bool, spec_adaptive, false,
          "With --speculative: verify per step the number of drafts that maximises expected "
          "tokens per second, from a cost table profiled on the model at start-up.");
ABSL_FLAG(int32_t, spec_profile_context, 512,
          "With --spec_adaptive: the tokens each sequence has cached in the start-up cost "
          "profile's steps (>= 1; less where --kv_blocks or the model's positions do not hold "
          "it): a verified draft attends over its context, so set it near the contexts served.");
ABSL_FLAG(int32_t, spec_profile_edge_requests, 0,
          "With --spec_adaptive on a CPU backend: the start-up cost profile also measures where "
          "one token more starts a pass of the projections in its rows of at most this many "
          "requests (its rows are 1, 8 and 32 requests). 0 (auto): 8 where a pass multiplies 16 "
          "tokens or more (AMX), else 1.");
ABSL_FLAG(bool, spec_select, true,
          "With --spec_adaptive: measure that per-step plan against fixed draft lengths (1, 2, "
          "4, ... --num_speculative_tokens, or --spec_select_max_length) and no drafting, and run "
          "whichever realises the most "
          "tokens per second at the current number of decoding requests (each losing mode is "
          "revisited at about 0.2% of the run's cost). --nospec_select: the plan alone.");
ABSL_FLAG(int32_t, spec_select_max_length, 0,
          "With --spec_select: the longest fixed draft length measured against the plan (1, 2, "
          "4, ... up to it); 0: --num_speculative_tokens. The plan may still verify up to "
          "--num_speculative_tokens: e.g. --speculative=ngram --num_speculative_tokens=16 "
          "--spec_select_max_length=8 lets it verify 16 where a request copies text, without "
          "measuring (and risking) a fixed 16 everywhere.");
ABSL_FLAG(double, spec_freeze_below, 0.99,
          "With --spec_select and a draft model: where not drafting measures fastest and every "
          "drafting mode below this fraction of it, stop keeping the draft model's cache up to "
          "date there and re-measure the drafting modes only every --spec_freeze_epochs epochs; "
          "0: never.");
ABSL_FLAG(int32_t, spec_freeze_epochs, 512,
          "With --spec_freeze_below: a frozen bucket re-measures its drafting modes once every "
          "this many of its epochs (each round first catches the draft model up on what it "
          "missed).");
ABSL_FLAG(int32_t, spec_min_gap_epochs, 4,
          "With --spec_select: the fewest epochs of a bucket of decoding-request counts between "
          "two trials of one losing mode, however close it measured (at most 128).");
ABSL_FLAG(int32_t, spec_confirm_gap_epochs, 1,
          "With --spec_select: the epochs of a bucket between two trials of a mode rated faster "
          "than the bucket's current mode but not yet compared often enough to take over; such a "
          "mode goes before every loser that is due (1..--spec_min_gap_epochs).");
ABSL_FLAG(double, spec_cost_decay, 0.9,
          "With --spec_select: the weight of a mode's older trials in its score, in [0, 1): "
          "higher averages more trials (less noise, slower to follow a change).");
ABSL_FLAG(double, spec_switch_margin, 0.01,
          "With --spec_select: how much faster (in log tokens/s, >= 0) a mode must measure than "
          "the current one of its bucket of decoding-request counts to take the bucket over; "
          "higher keeps a bucket with its mode through near-ties (each change of mode pays a "
          "warm-up).");
ABSL_FLAG(bool, spec_interleave, true,
          "With --spec_select: a losing mode is re-measured in a trial that alternates its steps "
          "with the current mode's, so both see the same machine speed and text; "
          "--nospec_interleave: whole epochs of each mode are compared back to back.");
ABSL_FLAG(bool, spec_trial_any_epoch, true,
          "With --spec_select and --spec_interleave: a trial may start at any epoch of its "
          "bucket of decoding-request counts; --nospec_trial_any_epoch: only right after a "
          "finished epoch of the same bucket, so buckets the count only passes through keep what "
          "they inherited from their neighbour.");
ABSL_FLAG(bool, spec_catch_up_charge, true,
          "With --spec_select and a draft model: charge each bucket's drafting modes the time "
          "the draft model spends catching up (on new prompts, or on tokens decoded without "
          "drafts before the count entered the bucket), which their measured rates leave out; "
          "--nospec_catch_up_charge: no charge.");
ABSL_FLAG(double, spec_inherit_weight, 1.0,
          "With --spec_select: how many trials' worth (in (0, 1]) a bucket of decoding-request "
          "counts first seen inherits of its neighbour's measurements, against its own.");
ABSL_FLAG(bool, spec_weigh_cut_trials, true,
          "With --spec_select: a trial cut short by the count of decoding requests leaving its "
          "bucket weighs as the share of a whole trial's steps it ran; "
          "--nospec_weigh_cut_trials: as a whole trial.");
ABSL_FLAG(bool, spec_carry_over_correction, false,
          "With --spec_select: a trial re-weights each side to the mix of start states (after "
          "accepted, rejected or no drafts) its own mode settles into (default: as measured).");
ABSL_FLAG(bool, spec_ngram_history, false,
          "With --spec_adaptive and n-gram drafts: key the acceptance estimates by whether the "
          "request's previous draft was accepted whole as well as by match length (default: by "
          "match length alone).");
ABSL_FLAG(bool, spec_draft_model_history, false,
          "With --spec_adaptive and a draft model: calibrate the draft's confidences apart for "
          "requests whose previous draft was accepted whole and for the others (default: one "
          "calibration).");
ABSL_FLAG(bool, spec_draft_stop_measured_rate, false,
          "With --spec_adaptive and a draft model: each request stops drafting where the next "
          "token's estimated acceptance is worth less than its cost at the tokens/s the plan's "
          "drafting steps realised (at that many decoding requests); default: at the plan's "
          "predicted tokens/s (the realised rate drafted longer and measured worse).");
ABSL_FLAG(double, spec_draft_stop_extend, 0.25,
          "With --spec_adaptive and a draft model: draft up to the longest length whose predicted "
          "tokens/s is within this fraction of the best length's, each request stopping where "
          "the next token's estimated acceptance is not worth its cost (0: the best length), at "
          "--spec_draft_stop_extend_min_decoding or more decoding requests.");
ABSL_FLAG(int32_t, spec_draft_stop_extend_min_decoding, 3,
          "With --spec_draft_stop_extend: the fewest decoding requests at which a step extends "
          "its draft length (fewer draft the best length).");
ABSL_FLAG(bool, spec_draft_length_check, false,
          "With --spec_adaptive and a draft model: cut the planned draft length to 1 token where "
          "the plan's steps that drafted 2 or more tokens per request realised fewer tokens/s "
          "than its steps that drafted 1 (at that many decoding requests).");
ABSL_FLAG(bool, spec_probe_past_stop, true,
          "With --spec_adaptive and a draft model: a probe step's request drafts one token past "
          "where its confidence stop would end its draft; --nospec_probe_past_stop: the planned "
          "length + 1, whatever the confidences.");
ABSL_FLAG(double, spec_trial_stop_below, 0.8,
          "With --spec_select: a trial ends early once the mode on trial realised less than this "
          "fraction of the current mode's tokens/s over at least 4 steps and "
          "--spec_trial_stop_sequence_steps sequence-steps a side; 0: trials always run whole.");
ABSL_FLAG(double, spec_trial_stop_sequence_steps, 32,
          "With --spec_select: the sequence-steps (steps x decoding requests) each side of a trial "
          "must cover before it may end early (few steps of one or two requests say little), for "
          "a mode just below --spec_trial_stop_below; x log(that) / log(its ratio) for others.");
ABSL_FLAG(int32_t, spec_trial_run_steps, 3,
          "With --spec_select: a trial alternates runs of this many steps of the mode on trial "
          "and the current mode, each run's first --spec_trial_run_unmeasured steps (which start "
          "from the other mode's state) left unmeasured (see --spec_trial_run_max_decoding); 1: "
          "single steps, every one measured.");
ABSL_FLAG(std::string, spec_trial_run_unmeasured, "auto",
          "With --spec_select and --spec_trial_run_steps above 1: how many first steps of each "
          "run are left unmeasured (at most the run's length - 1): a forward pass right after "
          "one of another shape costs more, for more than one step; auto: 0 with "
          "--speculative=ngram (a run of text begins where the other mode's ended, often inside "
          "a copied stretch, whose first step is a long draft's best), 1 with a draft model.");
ABSL_FLAG(std::string, spec_trial_run_tokens, "auto",
          "With --spec_select and --spec_trial_run_steps above 1: above 0, a run lasts until its "
          "measured steps have emitted this many tokens per decoding request, instead of "
          "--spec_trial_run_steps steps, so that both sides are measured on as much of the same "
          "text (runs of equal steps rate a long draft on easier text than a short one); 0: runs "
          "of steps; auto: 16.");
ABSL_FLAG(bool, spec_off_epoch_catch_up, true,
          "With --spec_select and a draft model: whether steps of a bucket held by no drafting "
          "feed the draft model everything requests are behind by (a new prompt, what a frozen "
          "bucket skipped); false: only requests within a few tokens, the others catch up when "
          "they next draft.");
ABSL_FLAG(bool, spec_catch_up_gate, false,
          "With --spec_select and a draft model: a request far behind the draft model (a new "
          "prompt, or tokens decoded while its bucket skipped the upkeep) is caught up only where "
          "drafting's measured gain over the tokens it may still emit saves more than the catch-up "
          "costs; else it decodes without drafts. false (default): always caught up (measured: "
          "with the gate, drafting modes' steps looked like no drafting's and no bucket froze).");
ABSL_FLAG(std::string, spec_catch_up_delay_steps, "auto",
          "With --spec_select: while a bucket frozen on no drafting runs without updating the "
          "draft model, a decoding count that moves to a bucket held by a drafting mode hands over "
          "only after this many steps there in a row (a dip of a few steps would otherwise pay "
          "the draft model's catch-up on every request); 0: at once; auto: 8 with a draft model, "
          "0 with --speculative=ngram.");
ABSL_FLAG(int32_t, spec_trial_run_max_decoding, 0,
          "With --spec_select and --spec_trial_run_steps above 1: runs only while at most this "
          "many requests decode, single alternating steps above (which rate a short draft on "
          "harder text than its own); 0 (default): at any count.");

namespace deepinfer::node {
namespace {

// A flag's value must be at least `min`: "--flag: expected >= min, got value".
absl::Status AtLeast(absl::string_view flag, int value, int min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": expected >= ", min, ", got ", value));
}

absl::Status Positive(absl::string_view flag, int value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected > 0, got ", value));
}

// A count flag that also takes "auto": `automatic` for auto, else an integer >= 0 (`zero_means`,
// if not empty, says in the error what 0 does).
absl::Status AutoCount(absl::string_view flag, const std::string& value, int automatic,
                       int* out, absl::string_view zero_means = "") {
  if (value == "auto") {
    *out = automatic;
    return absl::OkStatus();
  }
  if (absl::SimpleAtoi(value, out) && *out >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, ": expected auto or an integer >= 0",
                   zero_means.empty() ? "" : absl::StrCat(" (0: ", zero_means, ")"), ", got \"",
                   value, "\""));
}

}  // namespace

absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags(internal::v1::WorkerRole role) {
  WorkerOptions o;
  o.role = role;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  DI_RETURN_IF_ERROR(ParseHostPort("listen", o.listen_address, /*allow_port_zero=*/true).status());
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  if (o.advertise_host.find_first_of(" /[]") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--advertise_host: expected a host name or IP literal, got \"", o.advertise_host, "\""));
  }
  o.router_address = absl::GetFlag(FLAGS_router);
  if (!o.router_address.empty()) {
    DI_RETURN_IF_ERROR(
        ParseHostPort("router", o.router_address, /*allow_port_zero=*/false).status());
  }
  o.model_path = absl::GetFlag(FLAGS_model);
  if (o.model_path.empty()) {
    return absl::InvalidArgumentError("--model: required (a Hugging Face model directory)");
  }
  o.model_id = absl::GetFlag(FLAGS_model_id);
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (o.worker_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_id: expected 1..128 bytes, got ", o.worker_id.size()));
  }
  o.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  DI_RETURN_IF_ERROR(Positive("kv_blocks", o.kv_blocks));
  o.block_size = absl::GetFlag(FLAGS_block_size);
  DI_RETURN_IF_ERROR(Positive("block_size", o.block_size));
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  DI_RETURN_IF_ERROR(Positive("max_batch_tokens", o.max_batch_tokens));
  o.max_running = absl::GetFlag(FLAGS_max_running);
  DI_RETURN_IF_ERROR(Positive("max_running", o.max_running));
  o.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  DI_RETURN_IF_ERROR(Positive("max_waiting", o.max_waiting));
  o.enable_prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  o.threads = absl::GetFlag(FLAGS_threads);
  if (o.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: expected >= 0 (0 = all cores), got ", o.threads));
  }
  o.overlap = absl::GetFlag(FLAGS_overlap);
  if (o.overlap != "auto" && o.overlap != "on" && o.overlap != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--overlap: expected auto, on or off, got \"", o.overlap, "\""));
  }
  o.device = absl::GetFlag(FLAGS_device);
  if (o.device != "cpu" && o.device != "cuda" && o.device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: expected cpu, cuda or auto, got \"", o.device, "\""));
  }
  o.hash_seed = absl::GetFlag(FLAGS_hash_seed);
  const std::string transport = absl::GetFlag(FLAGS_kv_transport);
  if (transport == "ucx") {
    o.kv_backend = kv_transfer::Backend::kUcx;
  } else if (transport == "loopback") {
    o.kv_backend = kv_transfer::Backend::kLoopback;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_transport: expected ucx or loopback, got \"", transport, "\""));
  }
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!o.metrics_listen.empty()) {
    DI_RETURN_IF_ERROR(
        ParseHostPort("metrics_listen", o.metrics_listen, /*allow_port_zero=*/true).status());
  }
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (o.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--drain_timeout: expected >= 0, got ",
                                                   absl::FormatDuration(o.drain_timeout)));
  }
  const std::string speculative = absl::GetFlag(FLAGS_speculative);
  if (speculative == "ngram" || speculative == "draft_model") {
    o.speculative.enabled = true;
    o.speculative.drafter = speculative;
  } else if (speculative != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative: expected off, ngram or draft_model, got \"", speculative, "\""));
  }
  o.speculative.num_speculative_tokens = absl::GetFlag(FLAGS_num_speculative_tokens);
  o.speculative.min_n = absl::GetFlag(FLAGS_ngram_min);
  o.speculative.max_n = absl::GetFlag(FLAGS_ngram_max);
  o.speculative.adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  o.speculative.profile_context = absl::GetFlag(FLAGS_spec_profile_context);
  if (o.speculative.profile_context < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--spec_profile_context: expected >= 1, got ",
                                                   o.speculative.profile_context));
  }
  o.speculative.profile_edge_requests = absl::GetFlag(FLAGS_spec_profile_edge_requests);
  DI_RETURN_IF_ERROR(
      AtLeast("spec_profile_edge_requests", o.speculative.profile_edge_requests, 0));
  o.speculative.select_mode = absl::GetFlag(FLAGS_spec_select);
  o.speculative.select_max_length = absl::GetFlag(FLAGS_spec_select_max_length);
  o.speculative.select_options.interleave = absl::GetFlag(FLAGS_spec_interleave);
  o.speculative.select_options.trial_any_epoch = absl::GetFlag(FLAGS_spec_trial_any_epoch);
  o.speculative.select_options.catch_up_charge = absl::GetFlag(FLAGS_spec_catch_up_charge);
  o.speculative.select_options.inherit_weight = absl::GetFlag(FLAGS_spec_inherit_weight);
  if (!(o.speculative.select_options.inherit_weight > 0.0) ||
      !(o.speculative.select_options.inherit_weight <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_inherit_weight: expected a value in (0, 1], got ",
                     o.speculative.select_options.inherit_weight));
  }
  o.speculative.select_options.weigh_cut_trials = absl::GetFlag(FLAGS_spec_weigh_cut_trials);
  o.speculative.select_options.freeze_below = absl::GetFlag(FLAGS_spec_freeze_below);
  o.speculative.select_options.min_gap_epochs = absl::GetFlag(FLAGS_spec_min_gap_epochs);
  if (o.speculative.select_options.min_gap_epochs < 1 ||
      o.speculative.select_options.min_gap_epochs > o.speculative.select_options.max_gap_epochs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spec_min_gap_epochs: expected 1..", o.speculative.select_options.max_gap_epochs,
        ", got ", o.speculative.select_options.min_gap_epochs));
  }
  o.speculative.select_options.confirm_gap_epochs = absl::GetFlag(FLAGS_spec_confirm_gap_epochs);
  if (o.speculative.select_options.confirm_gap_epochs < 1 ||
      o.speculative.select_options.confirm_gap_epochs >
          o.speculative.select_options.min_gap_epochs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--spec_confirm_gap_epochs: expected 1..", o.speculative.select_options.min_gap_epochs,
        " (--spec_min_gap_epochs), got ", o.speculative.select_options.confirm_gap_epochs));
  }
  o.speculative.select_options.cost_decay = absl::GetFlag(FLAGS_spec_cost_decay);
  if (!(o.speculative.select_options.cost_decay >= 0.0 &&
        o.speculative.select_options.cost_decay < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--spec_cost_decay: expected [0, 1), got ",
                                                   o.speculative.select_options.cost_decay));
  }
  o.speculative.select_options.switch_margin = absl::GetFlag(FLAGS_spec_switch_margin);
  if (!(o.speculative.select_options.switch_margin >= 0.0 &&
        o.speculative.select_options.switch_margin < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("--spec_switch_margin: expected [0, 1), got ",
                                                   o.speculative.select_options.switch_margin));
  }
  o.speculative.select_options.freeze_epochs = absl::GetFlag(FLAGS_spec_freeze_epochs);
  if (o.speculative.select_options.freeze_epochs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_freeze_epochs: expected >= 1, got ",
                     o.speculative.select_options.freeze_epochs));
  }
  o.speculative.draft_stop_extend = absl::GetFlag(FLAGS_spec_draft_stop_extend);
  o.speculative.probe_past_stop = absl::GetFlag(FLAGS_spec_probe_past_stop);
  o.speculative.draft_stop_extend_min_decoding =
      absl::GetFlag(FLAGS_spec_draft_stop_extend_min_decoding);
  if (o.speculative.draft_stop_extend_min_decoding < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_draft_stop_extend_min_decoding: expected >= 1, got ",
                     o.speculative.draft_stop_extend_min_decoding));
  }
  if (!(o.speculative.draft_stop_extend >= 0.0 && o.speculative.draft_stop_extend < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_draft_stop_extend: expected a fraction in [0, 1), got ",
                     o.speculative.draft_stop_extend));
  }
  o.speculative.select_options.trial_stop_below = absl::GetFlag(FLAGS_spec_trial_stop_below);
  o.speculative.select_options.trial_stop_sequence_steps =
      absl::GetFlag(FLAGS_spec_trial_stop_sequence_steps);
  if (!(o.speculative.select_options.trial_stop_below >= 0.0 &&
        o.speculative.select_options.trial_stop_below <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_trial_stop_below: expected a fraction in [0, 1], got ",
                     o.speculative.select_options.trial_stop_below));
  }
  o.speculative.select_options.trial_run_steps = absl::GetFlag(FLAGS_spec_trial_run_steps);
  if (o.speculative.select_options.trial_run_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_trial_run_steps: expected >= 1, got ",
                     o.speculative.select_options.trial_run_steps));
  }
  if (absl::Status s = AutoCount("spec_trial_run_unmeasured",
                                  absl::GetFlag(FLAGS_spec_trial_run_unmeasured),
                                  o.speculative.drafter == "ngram" ? 0 : 1,
                                  &o.speculative.select_options.trial_run_unmeasured);
      !s.ok()) {
    return s;
  }
  const std::string run_tokens = absl::GetFlag(FLAGS_spec_trial_run_tokens);
  double& trial_run_tokens = o.speculative.select_options.trial_run_tokens;
  if (run_tokens == "auto") {
    trial_run_tokens = kTrialRunTokens;
  } else if (!absl::SimpleAtod(run_tokens, &trial_run_tokens) || !(trial_run_tokens >= 0.0) ||
             !std::isfinite(trial_run_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_trial_run_tokens: expected auto or a finite number >= 0, got \"",
                     run_tokens, "\""));
  }
  o.speculative.select_options.off_epoch_catch_up = absl::GetFlag(FLAGS_spec_off_epoch_catch_up);
  if (absl::Status s = AutoCount(
          "spec_catch_up_delay_steps", absl::GetFlag(FLAGS_spec_catch_up_delay_steps),
          o.speculative.drafter == "ngram" ? 0 : kDraftModelCatchUpDelaySteps,
          &o.speculative.select_options.catch_up_delay_steps);
      !s.ok()) {
    return s;
  }
  o.speculative.select_options.trial_run_max_decoding =
      absl::GetFlag(FLAGS_spec_trial_run_max_decoding);
  if (o.speculative.select_options.trial_run_max_decoding < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_trial_run_max_decoding: expected >= 0, got ",
                     o.speculative.select_options.trial_run_max_decoding));
  }
  if (!(o.speculative.select_options.trial_stop_sequence_steps >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_trial_stop_sequence_steps: expected >= 0, got ",
                     o.speculative.select_options.trial_stop_sequence_steps));
  }
  if (!(o.speculative.select_options.freeze_below >= 0.0 &&
        o.speculative.select_options.freeze_below <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spec_freeze_below: expected a fraction in [0, 1], got ",
                     o.speculative.select_options.freeze_below));
  }
  o.speculative.draft_model_path = absl::GetFlag(FLAGS_draft_model);
  o.speculative.draft_threads = o.threads;
  o.speculative.draft_num_blocks = absl::GetFlag(FLAGS_draft_kv_blocks);
  if (absl::Status s = AutoCount(
          "draft_catch_up_window", absl::GetFlag(FLAGS_draft_catch_up_window),
          (o.speculative.adaptive && o.speculative.select_mode) ||
                  o.speculative.num_speculative_tokens <= kDraftCatchUpWindowMaxFixedLength
              ? kDraftCatchUpWindow
              : 0,
          &o.speculative.draft_catch_up_window, "feed every token");
      !s.ok()) {
    return s;
  }
  o.speculative.draft_catch_up_window_min_sequences =
      absl::GetFlag(FLAGS_draft_catch_up_window_min_sequences);
  DI_RETURN_IF_ERROR(AtLeast("draft_catch_up_window_min_sequences",
                             o.speculative.draft_catch_up_window_min_sequences, 1));
  DI_RETURN_IF_ERROR(ValidateSpeculativeOptions(o.speculative));
  DI_RETURN_IF_ERROR(ParseLogLevel(absl::GetFlag(FLAGS_log_level), "log_level").status());
  return o;
}

void ConfigureWorkerFlagsUsage(std::string binary_dir) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [binary_dir](absl::string_view file) {
    return absl::StrContains(file, binary_dir) || absl::StrContains(file, "node/worker_flags");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
}

}  // namespace deepinfer::node
