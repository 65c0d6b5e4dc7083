#include "node/worker_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "node/spec_config.h"

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
ABSL_FLAG(std::string, draft_model, "",
          "With --speculative=draft_model: the draft checkpoint's directory (Hugging Face "
          "layout, same vocabulary as --model).");
ABSL_FLAG(int, draft_kv_blocks, 0,
          "With --speculative=draft_model: blocks of the draft model's own KV cache (--block_size "
          "tokens each, >= 0); 0: as many as --kv_blocks, so every sequence the target holds "
          "keeps its draft KV (fewer evict the least recently drafted sequences, whose prompts "
          "are then recomputed by the draft model).");
ABSL_FLAG(bool, spec_adaptive, false,
          "With --speculative: verify per step the number of drafts that maximises expected "
          "tokens per second, from a cost table profiled on the model at start-up.");
ABSL_FLAG(std::string, spec_config, "",
          "With --speculative: a JSON file of the speculative research knobs (the adaptive "
          "planner, the mode selector, the draft model's catch-up), e.g. "
          "{\"select_max_length\": 8}; keys left out take their defaults (docs/spec-config.md); "
          "empty = all defaults.");


namespace deepinfer::node {
namespace {

absl::Status Positive(absl::string_view flag, int value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected > 0, got ", value));
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
  o.speculative.adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  o.speculative.draft_model_path = absl::GetFlag(FLAGS_draft_model);
  o.speculative.draft_threads = o.threads;
  o.speculative.draft_num_blocks = absl::GetFlag(FLAGS_draft_kv_blocks);
  DI_RETURN_IF_ERROR(LoadSpecConfig(absl::GetFlag(FLAGS_spec_config), &o.speculative));
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
