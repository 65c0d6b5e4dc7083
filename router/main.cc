// //router:router — the cluster's public endpoint.
//
//   router --model engine/testdata/models/llama --listen 127.0.0.1:0 --port_file /tmp/r.port
//
// Serves deepinfer.v1.Inference (Chat, Generate, Abort, ListModels; through
// router/inference_front.h, which names invalid UTF-8 instead of failing the parse) for one
// model, the deepinfer.internal.v1.WorkerRegistry that prefill and decode nodes register with,
// deepinfer.internal.v1.RouterAdmin (GetPlan: the autoscaler's plan with --autoscale; flags in
// router/autoscale_flags.h) and grpc.health.v1.Health (SERVING once started). Only the model's
// assets are read (config, tokenizer, chat template, generation_config.json), never its weights.
//
// SIGTERM / SIGINT: health goes NOT_SERVING, new Chat/Generate calls are refused with
// UNAVAILABLE, the calls in flight get up to --drain_timeout to finish, then the server stops.
// Invalid flags exit with status 2 and a message naming the flag.
//
// Placement: --placement=cache_aware (prefix overlap + load, the default) or least_loaded, with
// the cost weights --placement_w_*; --colocated_prefill_tokens, --max_exposed_transfer_fraction
// and --load_aware_local_prefill (or --placement_slo_ttft_ms with --placement_slo_itl_ms) decide
// when a can_prefill decode node prefills itself;
// --metrics_listen=host:port serves Prometheus /metrics.
//
// --http_listen=host:port serves the OpenAI-compatible HTTP API (router/openai_api.h; off by
// default: a deployment opts into a second public port), with /metrics and /healthz on the same
// port. --metrics_listen stays for deployments that scrape a separate port (and the workers keep
// common/metrics_http_server for theirs).
//
// Callers (router/tenants.h, docs/http-api.md "Tenants and API keys"): --tenants_file=FILE maps
// API keys (stored as SHA-256 hex) to tenants with their limits; it is reloaded when it changes
// (polled every --tenants_poll_interval) and on SIGHUP, and a file that does not parse keeps the
// previous table. --allow_anonymous serves calls without a key (the local launcher sets it on
// loopback). With neither, the router refuses to start.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/grpc_server.h"
#include "common/http_server.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "common/process_lifecycle.h"
#include "common/tls_files.h"
#include "engine/model_assets.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/channel_arguments.h"
#include "router/autoscale_flags.h"
#include "router/autoscaler.h"
#include "router/inference_front.h"
#include "router/inference_service.h"
#include "router/openai_api.h"
#include "router/placement.h"
#include "router/router_admin_service.h"
#include "router/router_metrics.h"
#include "router/tenants.h"
#include "router/worker_registry.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve on (Inference, WorkerRegistry, Health); port 0 picks a free port.");
ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain (leaf first) serving TLS on --listen and --http_listen; with "
          "--tls_key_file. Empty: plaintext. Re-read when it changes (--tls_reload_interval).");
ABSL_FLAG(std::string, tls_key_file, "",
          "PEM private key of --tls_cert_file (unencrypted); both or neither.");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "How often the TLS files are checked for a change; new connections then get the new "
          "certificate (whole seconds, >= 1s).");
ABSL_FLAG(std::string, port_file, "",
          "When set, the bound port is written to this file (atomically) once serving.");
ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory; only its assets are read (config.json, tokenizer.json, "
          "tokenizer_config.json, chat template, generation_config.json), no weights.");
ABSL_FLAG(std::string, model_id, "",
          "Model id clients and workers use; default: the --model directory's base name.");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "How often workers send load reports (told to them at registration).");
ABSL_FLAG(int, missed_heartbeats, 3,
          "A worker silent for this many heartbeat intervals is dropped.");
ABSL_FLAG(int, colocated_prefill_tokens, 0,
          "Prompts with at most this many uncached tokens are prefilled on the decode node itself "
          "(when it can prefill); 0 = never, except when no prefill worker is live.");
ABSL_FLAG(double, max_exposed_transfer_fraction, 0,
          "A can_prefill decode node prefills a prompt itself when the measured KV transfer left "
          "exposed after a remote prefill would exceed this fraction of that prefill's compute "
          "(finite, >= 0; 0 = off: only --colocated_prefill_tokens decides).");
ABSL_FLAG(bool, load_aware_local_prefill, false,
          "A can_prefill decode node prefills a prompt itself (above --colocated_prefill_tokens "
          "too) when its queued prompt tokens plus this prompt plus the stall this prefill adds "
          "to each of its running decodes are predicted to take less time than the least-loaded "
          "prefill node's queue plus this prompt plus the exposed KV transfer (measured rates "
          "from finished requests; token counts until measured).");
ABSL_FLAG(double, placement_slo_ttft_ms, 0,
          "With --placement_slo_itl_ms: SLO-aware local prefill (instead of "
          "--load_aware_local_prefill). A can_prefill decode node prefills a prompt itself "
          "(above --colocated_prefill_tokens too) when the remote path is predicted to miss this "
          "TTFT target or to be slower, and its predicted local TTFT over this target plus its "
          "running decodes' measured token gap over the ITL target is at most 1 (0 = off).");
ABSL_FLAG(double, placement_slo_itl_ms, 0,
          "The ITL target of SLO-aware local prefill (see --placement_slo_ttft_ms; both > 0 or "
          "both 0).");
ABSL_FLAG(std::string, placement, "cache_aware",
          "Placement policy: cache_aware (prefix-cache overlap and load) or least_loaded.");
ABSL_FLAG(double, placement_w_uncached_tokens, 1.0,
          "cache_aware prefill cost per prompt token the worker would compute (>= 0).");
ABSL_FLAG(double, placement_w_queued_tokens, 1.0,
          "cache_aware prefill cost per prompt token queued on the worker (>= 0).");
ABSL_FLAG(double, placement_w_kv_used, 4096.0,
          "cache_aware decode cost of a full KV cache, in prefill-token units (>= 0).");
ABSL_FLAG(double, placement_w_running_sequences, 64.0,
          "cache_aware decode cost per running sequence, in prefill-token units (>= 0).");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus /metrics and /healthz (e.g. 0.0.0.0:9090); empty = off.");
ABSL_FLAG(std::string, max_image_bytes, "20MiB",
          "Largest decoded image in a Chat request (e.g. 20MiB).");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(10),
          "Deadline of a request whose client sets none.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long calls in flight get to finish before the server stops.");
ABSL_FLAG(std::string, http_listen, "",
          "host:port serving the OpenAI-compatible HTTP API (/v1/chat/completions, "
          "/v1/completions, /v1/models) plus /metrics and /healthz; port 0 picks a free port; "
          "empty = off.");
ABSL_FLAG(std::string, http_port_file, "",
          "When set, the HTTP API's bound port is written to this file once serving.");
ABSL_FLAG(int, http_threads, 2, "io threads of the HTTP API (every connection shares them).");
ABSL_FLAG(std::string, http_max_body_bytes, "32MiB",
          "Largest HTTP request body; larger ones get 413 before they are read.");
ABSL_FLAG(absl::Duration, http_read_timeout, absl::Seconds(30),
          "An HTTP request must arrive whole within this time (else 408; slowloris).");
ABSL_FLAG(std::string, max_chat_text_bytes, "4MiB",
          "Most chat text bytes in one request (all messages; the completion prompt over HTTP), "
          "refused with INVALID_ARGUMENT before it is rendered or tokenized.");
ABSL_FLAG(std::string, tenants_file, "",
          "JSON file of tenants and their API keys' SHA-256 (router/tenants.h); reloaded when it "
          "changes and on SIGHUP. Empty: no keys (then --allow_anonymous must be set).");
ABSL_FLAG(bool, allow_anonymous, false,
          "Serve calls that send no API key, without limits (for a local, trusted setup).");
ABSL_FLAG(absl::Duration, tenants_poll_interval, absl::Seconds(2),
          "How often --tenants_file is checked for changes.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error, critical or off.");

namespace deepinfer::router {
namespace {

absl::Status FlagError(absl::string_view flag, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
}

// Exit status 2 for bad flags, 1 for everything else.
int Fail(const absl::Status& status) {
  std::fprintf(stderr, "router: %s\n", status.ToString().c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// The placement options of the --placement_* flags, --colocated_prefill_tokens (`colocated`,
// checked >= 0) and the measured conditional-disaggregation rules; kInvalidArgument naming the
// flag for a bad value.
absl::StatusOr<PlacementOptions> PlacementOptionsFromFlags(int colocated, uint64_t rng_seed) {
  PlacementOptions placement;
  // The flag counts "at most N" uncached tokens; the policy's threshold is "fewer than".
  placement.local_prefill_threshold_tokens = colocated > 0 ? colocated + 1 : 0;
  placement.w_uncached_tokens = absl::GetFlag(FLAGS_placement_w_uncached_tokens);
  placement.w_queued_tokens = absl::GetFlag(FLAGS_placement_w_queued_tokens);
  placement.w_kv_used = absl::GetFlag(FLAGS_placement_w_kv_used);
  placement.w_running_sequences = absl::GetFlag(FLAGS_placement_w_running_sequences);
  placement.rng_seed = rng_seed;
  placement.max_exposed_transfer_fraction = absl::GetFlag(FLAGS_max_exposed_transfer_fraction);
  placement.load_aware_local_prefill = absl::GetFlag(FLAGS_load_aware_local_prefill);
  placement.slo_ttft_us = 1e3 * absl::GetFlag(FLAGS_placement_slo_ttft_ms);
  placement.slo_itl_us = 1e3 * absl::GetFlag(FLAGS_placement_slo_itl_ms);
  if (absl::Status s = ValidatePlacementOptions(placement); !s.ok()) {
    if (absl::StartsWith(s.message(), "slo_")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--placement_slo_ttft_ms/--placement_slo_itl_ms (in ms; the policy's are us): ",
          s.message()));
    }
    // The transfer-cost option's flag has its own name; the weights' flags are placement_*.
    const bool own = absl::StartsWith(s.message(), "max_exposed_transfer_fraction");
    return absl::InvalidArgumentError(absl::StrCat(own ? "--" : "--placement_", s.message()));
  }
  return placement;
}

// The OpenAI-compatible HTTP API and its server.
struct HttpApi {
  std::unique_ptr<OpenAiApi> api;
  std::unique_ptr<HttpServer> server;
};

// Starts the HTTP API on `http_listen`, relaying into the router's own gRPC `server` (through its
// loopback internal listener when TLS is on). `refresh_metrics` and `metrics_registry` serve
// /metrics; both, and every pointer, outlive the returned servers.
absl::StatusOr<HttpApi> StartHttpApi(const std::string& http_listen, GrpcServer* server,
                                     const HostPort& listen, const std::string& model_id,
                                     const engine::ModelAssets* assets, InferenceService* inference,
                                     Tenants* tenants, MetricsRegistry* metrics_registry,
                                     std::function<void()> refresh_metrics,
                                     const std::optional<TlsFiles>& tls, absl::Duration tls_reload,
                                     size_t max_chat_text_bytes, size_t http_max_body_bytes) {
  // The API reaches the Inference service through the router's own listener, so that HTTP
  // requests take exactly the gRPC path (validation, placement, relay, cancellation).
  // With TLS on, through the loopback plaintext listener
  // (GrpcServerOptions::internal_listen_address).
  absl::StatusOr<HostPort> grpc_listen = ParseHostPort("listen", listen.ToString(), true);
  std::string target = server->address();
  if (!server->internal_address().empty()) {
    target = server->internal_address();
  } else if (grpc_listen.ok() && (grpc_listen->host == "0.0.0.0" || grpc_listen->host.empty())) {
    target = absl::StrCat("127.0.0.1:", server->port());
  } else if (grpc_listen.ok() && grpc_listen->host == "::") {
    target = absl::StrCat("[::1]:", server->port());
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  OpenAiApiOptions api_options;
  api_options.model_id = model_id;
  api_options.max_prompt_bytes = max_chat_text_bytes;
  const engine::ModelAssets* model_assets = assets;
  api_options.tokenize = [model_assets](absl::string_view text) {
    return model_assets->tokenizer().Encode(text, /*add_special_tokens=*/true);
  };
  api_options.token_text = [model_assets](uint32_t id) {
    absl::StatusOr<std::string> text =
        model_assets->tokenizer().Decode({static_cast<int32_t>(id)}, false);
    return text.ok() ? *text : std::string();
  };
  InferenceService* service = inference;
  api_options.list_models = [service] {
    v1::ListModelsRequest request;
    v1::ListModelsResponse response;
    (void)service->ListModels(nullptr, &request, &response);
    return response;
  };
  api_options.metrics = [refresh_metrics, metrics_registry] {
    refresh_metrics();
    return metrics_registry->Serialize();
  };
  api_options.healthy = [service] { return !service->draining(); };
  Tenants* tenant_table = tenants;
  api_options.authorize = [tenant_table, model_id](const HttpRequest& request) -> absl::Status {
    std::optional<absl::string_view> authorization;
    const std::string header = request.Header("Authorization");
    if (!header.empty()) authorization = header;
    absl::StatusOr<std::shared_ptr<const Tenant>> tenant =
        tenant_table->Authenticate(authorization);
    if (!tenant.ok()) return tenant.status();
    return tenant_table->CheckModel(**tenant, model_id);
  };
  absl::StatusOr<std::unique_ptr<OpenAiApi>> api =
      OpenAiApi::Create(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args),
                        std::move(api_options));
  if (!api.ok()) return api.status();
  HttpApi out;
  out.api = std::move(*api);
  HttpServerOptions http_options;
  http_options.listen_address = http_listen;
  http_options.threads = absl::GetFlag(FLAGS_http_threads);
  http_options.max_body_bytes = http_max_body_bytes;
  http_options.read_timeout = absl::GetFlag(FLAGS_http_read_timeout);
  if (tls.has_value()) {
    http_options.tls_cert_file = tls->cert_file;
    http_options.tls_key_file = tls->key_file;
    http_options.tls_reload_interval = tls_reload;
  }
  OpenAiApi* handler = out.api.get();
  absl::StatusOr<std::unique_ptr<HttpServer>> started = HttpServer::Start(
      http_options, [handler](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        handler->Handle(std::move(request), std::move(responder));
      });
  if (!started.ok()) return started.status();
  out.server = std::move(*started);
  if (const std::string file = absl::GetFlag(FLAGS_http_port_file); !file.empty()) {
    if (absl::Status s = WritePortFile(file, out.server->port()); !s.ok()) {
      out.server->Stop();
      return s;
    }
  }
  spdlog::info("serving the OpenAI-compatible HTTP API on {} (port {})", http_listen,
               out.server->port());
  return out;
}

// What the router's flags say, checked: kInvalidArgument naming the flag for a bad value (TLS
// files are loaded and matched here, so a bad pair fails at start-up, not at a handshake).
struct RouterFlags {
  std::string model_dir;
  std::string model_id;  // --model_id, or the model directory's name
  HostPort listen;
  uint64_t max_image_bytes = 0;
  uint64_t max_chat_text_bytes = 0;
  uint64_t http_max_body_bytes = 0;
  std::string http_listen;  // empty: no HTTP API
  std::optional<TlsFiles> tls;
  absl::Duration tls_reload;
  absl::Duration heartbeat;
  int missed = 0;
  int colocated = 0;
  absl::Duration request_timeout;
  absl::Duration drain_timeout;
};

absl::StatusOr<RouterFlags> RouterFlagsFromFlags() {
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) return FlagError("model", "expected a model directory; got \"\"");
  absl::StatusOr<HostPort> listen =
      ParseHostPort("listen", absl::GetFlag(FLAGS_listen), /*allow_port_zero=*/true);
  if (!listen.ok()) return listen.status();
  absl::StatusOr<uint64_t> max_image_bytes =
      ParseByteSize("max_image_bytes", absl::GetFlag(FLAGS_max_image_bytes));
  if (!max_image_bytes.ok()) return max_image_bytes.status();
  absl::StatusOr<uint64_t> max_chat_text_bytes =
      ParseByteSize("max_chat_text_bytes", absl::GetFlag(FLAGS_max_chat_text_bytes));
  if (!max_chat_text_bytes.ok()) return max_chat_text_bytes.status();
  absl::StatusOr<uint64_t> http_max_body_bytes =
      ParseByteSize("http_max_body_bytes", absl::GetFlag(FLAGS_http_max_body_bytes));
  if (!http_max_body_bytes.ok()) return http_max_body_bytes.status();
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  if (!http_listen.empty()) {
    absl::StatusOr<HostPort> parsed = ParseHostPort("http_listen", http_listen, true);
    if (!parsed.ok()) return parsed.status();
  }
  if (absl::GetFlag(FLAGS_http_threads) < 1) {
    return FlagError("http_threads",
                     absl::StrCat("expected >= 1; got ", absl::GetFlag(FLAGS_http_threads)));
  }
  if (absl::GetFlag(FLAGS_http_read_timeout) <= absl::ZeroDuration()) {
    return FlagError("http_read_timeout", "expected > 0");
  }
  // TLS: checked whole at start-up (a missing file or a key that is not the certificate's is a
  // named error now, not a failed handshake later).
  std::optional<TlsFiles> tls;
  if (!absl::GetFlag(FLAGS_tls_cert_file).empty() || !absl::GetFlag(FLAGS_tls_key_file).empty()) {
    absl::StatusOr<TlsFiles> loaded =
        LoadTlsFiles(absl::GetFlag(FLAGS_tls_cert_file), absl::GetFlag(FLAGS_tls_key_file));
    if (!loaded.ok()) return loaded.status();
    tls = std::move(*loaded);
  }
  const absl::Duration tls_reload = absl::GetFlag(FLAGS_tls_reload_interval);
  if (tls_reload < absl::Seconds(1)) {
    return FlagError("tls_reload_interval", "expected >= 1s");
  }
  const absl::Duration heartbeat = absl::GetFlag(FLAGS_heartbeat_interval);
  if (heartbeat <= absl::ZeroDuration()) {
    return FlagError("heartbeat_interval",
                     absl::StrCat("expected > 0; got ", absl::FormatDuration(heartbeat)));
  }
  const int missed = absl::GetFlag(FLAGS_missed_heartbeats);
  if (missed < 1) {
    return FlagError("missed_heartbeats", absl::StrCat("expected >= 1; got ", missed));
  }
  const int colocated = absl::GetFlag(FLAGS_colocated_prefill_tokens);
  if (colocated < 0) {
    return FlagError("colocated_prefill_tokens", absl::StrCat("expected >= 0; got ", colocated));
  }
  const absl::Duration request_timeout = absl::GetFlag(FLAGS_request_timeout);
  if (request_timeout <= absl::ZeroDuration()) {
    return FlagError("request_timeout",
                     absl::StrCat("expected > 0; got ", absl::FormatDuration(request_timeout)));
  }
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  if (drain_timeout < absl::ZeroDuration()) {
    return FlagError("drain_timeout",
                     absl::StrCat("expected >= 0; got ", absl::FormatDuration(drain_timeout)));
  }
  std::string model_id = absl::GetFlag(FLAGS_model_id);
  if (model_id.empty()) {
    std::filesystem::path path(model_dir);
    if (!path.has_filename()) path = path.parent_path();  // "dir/" -> "dir"
    model_id = path.filename().string();
  }
  if (model_id.empty()) {
    return FlagError("model_id", absl::StrCat("expected an id (none derives from --model \"",
                                              model_dir, "\"); got \"\""));
  }
  RouterFlags f;
  f.model_dir = model_dir;
  f.model_id = model_id;
  f.listen = *listen;
  f.max_image_bytes = *max_image_bytes;
  f.max_chat_text_bytes = *max_chat_text_bytes;
  f.http_max_body_bytes = *http_max_body_bytes;
  f.http_listen = http_listen;
  f.tls = std::move(tls);
  f.tls_reload = tls_reload;
  f.heartbeat = heartbeat;
  f.missed = missed;
  f.colocated = colocated;
  f.request_timeout = request_timeout;
  f.drain_timeout = drain_timeout;
  return f;
}

int Main() {
  if (absl::Status s = InitLogging("router", absl::GetFlag(FLAGS_log_level)); !s.ok()) {
    return Fail(s);
  }
  absl::StatusOr<RouterFlags> flags = RouterFlagsFromFlags();
  if (!flags.ok()) return Fail(flags.status());
  const std::string& model_dir = flags->model_dir;
  const std::string& model_id = flags->model_id;
  const HostPort& listen = flags->listen;
  const std::string& http_listen = flags->http_listen;
  const std::optional<TlsFiles>& tls = flags->tls;
  const absl::Duration tls_reload = flags->tls_reload;
  const int colocated = flags->colocated;
  const absl::Duration request_timeout = flags->request_timeout;
  const absl::Duration drain_timeout = flags->drain_timeout;

  absl::StatusOr<std::unique_ptr<engine::ModelAssets>> assets =
      engine::ModelAssets::Load(model_dir);
  if (!assets.ok()) return Fail(assets.status());

  WorkerRegistry::Options registry_options;
  registry_options.heartbeat_interval = flags->heartbeat;
  registry_options.missed_heartbeats_allowed = flags->missed;
  registry_options.rng_seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  absl::StatusOr<std::unique_ptr<WorkerRegistry>> registry =
      WorkerRegistry::Create(registry_options);
  if (!registry.ok()) return Fail(registry.status());

  MetricsRegistry metrics_registry;
  absl::StatusOr<std::unique_ptr<RouterMetrics>> metrics = RouterMetrics::Create(&metrics_registry);
  if (!metrics.ok()) return Fail(metrics.status());

  if (absl::GetFlag(FLAGS_tenants_poll_interval) <= absl::ZeroDuration()) {
    return Fail(FlagError("tenants_poll_interval", "expected > 0"));
  }
  TenantsOptions tenants_options;
  tenants_options.file = absl::GetFlag(FLAGS_tenants_file);
  tenants_options.allow_anonymous = absl::GetFlag(FLAGS_allow_anonymous);
  tenants_options.metrics = &metrics_registry;
  absl::StatusOr<std::unique_ptr<Tenants>> tenants = Tenants::Create(tenants_options);
  if (!tenants.ok()) return Fail(tenants.status());
  if (tenants_options.allow_anonymous) {
    const bool loopback =
        listen.host == "127.0.0.1" || listen.host == "::1" || listen.host == "localhost";
    if (!loopback) {
      spdlog::warn(
          "--allow_anonymous on {}: anyone who reaches this address may call without "
          "a key",
          listen.ToString());
    }
  }
  Tenants::InstallReloadOnSighup();
  (*tenants)->Watch(absl::GetFlag(FLAGS_tenants_poll_interval));

  InferenceServiceOptions service_options;
  service_options.model_id = model_id;
  service_options.tenants = tenants->get();
  service_options.placement_policy = absl::GetFlag(FLAGS_placement);
  absl::StatusOr<PlacementOptions> placement =
      PlacementOptionsFromFlags(colocated, registry_options.rng_seed);
  if (!placement.ok()) return Fail(placement.status());
  service_options.placement = *placement;
  if (absl::Status s = CreatePlacementPolicy(service_options.placement_policy,
                                             service_options.placement, "placement")
                           .status();
      !s.ok()) {
    return Fail(s);
  }
  service_options.metrics = metrics->get();
  service_options.max_image_bytes = static_cast<size_t>(flags->max_image_bytes);
  service_options.max_chat_text_bytes = static_cast<size_t>(flags->max_chat_text_bytes);
  service_options.default_timeout = request_timeout;
  absl::StatusOr<std::unique_ptr<InferenceService>> inference =
      InferenceService::Create(registry->get(), assets->get(), service_options);
  if (!inference.ok()) return Fail(inference.status());
  WorkerRegistryService registry_service(registry->get());
  absl::StatusOr<AutoscaleSetup> autoscale = AutoscaleFromFlags(registry->get());
  if (!autoscale.ok()) return Fail(autoscale.status());
  RouterAdminService admin_service(autoscale->autoscaler.get(), autoscale->scaler_name);

  (*registry)->Start();
  GrpcServerOptions server_options;
  server_options.listen_address = listen.ToString();
  if (tls.has_value()) {
    // gRPC's file watcher re-reads both files every interval and hands new handshakes the new
    // pair; connections already open keep theirs.
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls->key_file, tls->cert_file,
        static_cast<unsigned int>(absl::ToInt64Seconds(absl::Ceil(tls_reload, absl::Seconds(1)))));
    grpc::experimental::TlsServerCredentialsOptions tls_options(provider);
    tls_options.watch_identity_key_cert_pairs();
    server_options.credentials = grpc::experimental::TlsServerCredentials(tls_options);
    // The HTTP API's relay into this server (below) goes over a second, plaintext listener
    // bound to loopback with an OS-chosen port, never the public one: the relay then needs no
    // copy of a trust root that a reload may replace, and no certificate name to match.
    // Loopback callers still need an API key there, as on the public listener.
    if (!http_listen.empty()) server_options.internal_listen_address = "127.0.0.1:0";
  }
  // Inference through the front that names invalid UTF-8 (router/inference_front.h).
  InferenceFront inference_front(inference->get());
  server_options.services = {&inference_front, &registry_service, &admin_service};
  server_options.health_service_names = {v1::Inference::service_full_name(),
                                         internal::v1::WorkerRegistry::service_full_name(),
                                         internal::v1::RouterAdmin::service_full_name()};
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(server_options);
  if (!server.ok()) {
    (*registry)->Stop();
    return Fail(server.status());
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status s = WritePortFile(port_file, (*server)->port()); !s.ok()) {
      (*server)->Shutdown(absl::ZeroDuration());
      (*registry)->Stop();
      return Fail(s);
    }
  }
  // The planner's output for HPA/KEDA and dashboards (set on each scrape with --autoscale).
  absl::StatusOr<GaugeFamily*> desired_replicas = metrics_registry.AddGaugeFamily(
      "deepinfer_desired_replicas", "Replicas the planner wants per pool.", {"pool"});
  absl::StatusOr<GaugeFamily*> actual_replicas = metrics_registry.AddGaugeFamily(
      "deepinfer_actual_replicas", "Live (heartbeating) workers per pool.", {"pool"});
  if (!desired_replicas.ok() || !actual_replicas.ok()) {
    return Fail(desired_replicas.ok() ? actual_replicas.status() : desired_replicas.status());
  }
  auto refresh_metrics = [&] {
    (*metrics)->RefreshPools(**registry, model_id);
    if (autoscale->autoscaler == nullptr) return;
    for (const AutoscalePoolStatus& pool : autoscale->autoscaler->Status()) {
      const std::vector<std::string> labels = {std::string(PoolName(pool.pool))};
      if (auto g = (*desired_replicas)->WithLabels(labels); g.ok() && pool.planned) {
        (*g)->Set(pool.desired);
      }
      if (auto g = (*actual_replicas)->WithLabels(labels); g.ok()) {
        (*g)->Set(pool.live_replicas);
      }
    }
  };
  std::unique_ptr<MetricsHttpServer> metrics_server;
  if (const std::string address = absl::GetFlag(FLAGS_metrics_listen); !address.empty()) {
    MetricsHttpServerOptions metrics_options;
    metrics_options.listen_address = address;
    metrics_options.before_scrape = refresh_metrics;
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> created =
        MetricsHttpServer::Create(&metrics_registry, metrics_options);
    absl::Status started = created.ok() ? (*created)->Start() : created.status();
    if (!started.ok()) {
      (*server)->Shutdown(absl::ZeroDuration());
      (*registry)->Stop();
      return Fail(started);
    }
    metrics_server = std::move(*created);
    spdlog::info("serving metrics on {} (port {})", address, metrics_server->port());
  }
  HttpApi http_api;
  if (!http_listen.empty()) {
    absl::StatusOr<HttpApi> started =
        StartHttpApi(http_listen, server->get(), listen, model_id, assets->get(), inference->get(),
                     tenants->get(), &metrics_registry, refresh_metrics, tls, tls_reload,
                     static_cast<size_t>(flags->max_chat_text_bytes),
                     static_cast<size_t>(flags->http_max_body_bytes));
    if (!started.ok()) {
      (*server)->Shutdown(absl::ZeroDuration());
      (*registry)->Stop();
      return Fail(started.status());
    }
    http_api = std::move(*started);
  }
  (*server)->SetServing(true);
  if (autoscale->autoscaler != nullptr) {
    autoscale->autoscaler->Start();
    spdlog::info("autoscaling with --scaler={}", autoscale->scaler_name);
  }
  spdlog::info("serving model {} ({}, vocab {}, context {}) on {}", model_id,
               (*assets)->architecture(), (*assets)->config().vocab_size,
               (*assets)->config().max_position_embeddings, (*server)->address());

  const int signal = WaitForShutdownSignal();
  if (autoscale->autoscaler != nullptr) autoscale->autoscaler->Stop();
  spdlog::info("shutting down (signal {}): draining for up to {}", signal,
               absl::FormatDuration(drain_timeout));
  (*server)->SetServing(false);
  (*inference)->BeginDrain();
  if (!(*inference)->WaitIdle(drain_timeout)) {
    spdlog::warn("drain timeout: cancelling {} calls still in flight", (*inference)->in_flight());
  }
  (*server)->Shutdown(absl::Seconds(1));
  if (http_api.api != nullptr && !http_api.api->WaitIdle(absl::Seconds(2))) {
    spdlog::warn("{} HTTP calls still in flight at shutdown", http_api.api->in_flight());
  }
  if (http_api.server != nullptr) http_api.server->Stop();
  if (metrics_server != nullptr) metrics_server->Stop();
  (*registry)->Stop();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace deepinfer::router

int main(int argc, char** argv) {
  // Before any thread starts, so that every thread inherits the blocked signals.
  deepinfer::InstallShutdownSignalHandlers();
  absl::SetProgramUsageMessage(
      "The deepinfer router: router --model DIR [--listen host:port] [--port_file FILE]");
  // --help lists the router's flags (the ones defined in router/): Abseil's default matches only
  // flags defined in a file named like the binary's main source.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "router/");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  return deepinfer::router::Main();
}
