#include "node/worker_runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/flags.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "common/process_lifecycle.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "kv_transfer/agent_factory.h"
#include "node/router_link.h"
#include "node/worker_identity.h"
#include "node/worker_link.h"
#include "proto/worker_role.h"
#include "spdlog/spdlog.h"

namespace deepinfer::node {
namespace {

using internal::v1::WorkerRole;

// How often the wedge watch wakes.
constexpr absl::Duration kTick = absl::Milliseconds(50);

// CPUs this process may run on (its affinity mask); 0 when unknown.
int AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return CPU_COUNT(&set);
}

absl::Status Positive(absl::string_view flag, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected > 0, got ", value));
}

// Engine events -> proto events: runs of STORED events that chain (each one's parent is the
// previous one's hash) become one event with several hashes; runs of REMOVED events likewise.
void AppendKvEvents(const std::vector<engine::KvEvent>& events,
                    google::protobuf::RepeatedPtrField<internal::v1::KvEvent>* out) {
  using internal::v1::KvEvent;
  KvEvent* current = nullptr;
  uint64_t last_hash = 0;
  for (const engine::KvEvent& e : events) {
    const KvEvent::Kind kind =
        e.kind == engine::KvEvent::Kind::kStored ? KvEvent::KIND_STORED : KvEvent::KIND_REMOVED;
    const bool extends = current != nullptr && current->kind() == kind &&
                         (kind == KvEvent::KIND_REMOVED || e.parent_hash == last_hash);
    if (!extends) {
      current = out->Add();
      current->set_kind(kind);
      current->set_tier(0);
      if (kind == KvEvent::KIND_STORED) current->set_parent_hash(e.parent_hash);
    }
    current->add_block_hashes(e.block_hash);
    last_hash = e.block_hash;
  }
}

}  // namespace

// The worker's Prometheus registry and its HTTP server; values mirror Stats() at each scrape.
class WorkerRuntime::Metrics {
 public:
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const WorkerRuntime* runtime,
                                                        const std::string& listen_address) {
    std::unique_ptr<Metrics> m(new Metrics(runtime));
    MetricsRegistry& r = m->registry_;
    DI_ASSIGN_OR_RETURN(m->kv_usage_, r.AddGauge("deepinfer_kv_cache_usage_ratio",
                                                 "Fraction of KV blocks in use (used / total)."));
    DI_ASSIGN_OR_RETURN(m->queue_depth_,
                        r.AddGauge("deepinfer_queue_depth", "Sequences waiting to start."));
    DI_ASSIGN_OR_RETURN(
        m->running_, r.AddGauge("deepinfer_running_sequences", "Sequences in the running batch."));
    DI_ASSIGN_OR_RETURN(
        m->hit_ratio_,
        r.AddGauge("deepinfer_prefix_cache_hit_ratio",
                   "Prompt tokens served from the prefix cache / prompt tokens looked up."));
    DI_ASSIGN_OR_RETURN(m->queries_, r.AddCounter("deepinfer_prefix_cache_queries_total",
                                                  "Prompt tokens looked up in the prefix cache."));
    DI_ASSIGN_OR_RETURN(m->hits_, r.AddCounter("deepinfer_prefix_cache_hits_total",
                                               "Prompt tokens served from the prefix cache."));
    DI_ASSIGN_OR_RETURN(m->transfer_bytes_,
                        r.AddCounter("deepinfer_kv_transfer_bytes_total",
                                     "KV bytes this worker's transfer agent wrote to peers."));
    DI_ASSIGN_OR_RETURN(m->transfer_failures_, r.AddCounter("deepinfer_kv_transfer_failures_total",
                                                            "KV transfer posts that failed."));
    DI_ASSIGN_OR_RETURN(
        CounterFamily * requests,
        r.AddCounterFamily(
            "deepinfer_requests_total",
            "Requests of the role's service (Prefill / Decode.Generate), by outcome.",
            {"outcome"}));
    DI_ASSIGN_OR_RETURN(m->requests_ok_, requests->WithLabels({"ok"}));
    DI_ASSIGN_OR_RETURN(m->requests_error_, requests->WithLabels({"error"}));
    DI_ASSIGN_OR_RETURN(m->requests_cancelled_, requests->WithLabels({"cancelled"}));
    DI_ASSIGN_OR_RETURN(m->spec_draft_,
                        r.AddCounter("deepinfer_spec_draft_tokens_total",
                                     "Draft tokens the speculative drafter proposed."));
    DI_ASSIGN_OR_RETURN(m->spec_verified_,
                        r.AddCounter("deepinfer_spec_verified_tokens_total",
                                     "Draft tokens fed to the model for verification."));
    DI_ASSIGN_OR_RETURN(m->spec_accepted_, r.AddCounter("deepinfer_spec_accepted_tokens_total",
                                                        "Verified draft tokens accepted."));
    DI_ASSIGN_OR_RETURN(
        m->spec_draft_evictions_,
        r.AddCounter("deepinfer_spec_draft_evictions_total",
                     "Sequences whose draft-model KV was evicted for room (--draft_kv_blocks)."));
    DI_ASSIGN_OR_RETURN(
        m->spec_draft_upkeep_,
        r.AddCounter("deepinfer_spec_draft_upkeep_tokens_total",
                     "Context tokens fed to the draft model on adaptive steps that drafted "
                     "nothing, keeping it close to every decoding sequence."));
    DI_ASSIGN_OR_RETURN(
        auto* modes,
        r.AddCounterFamily("deepinfer_spec_mode_steps_total",
                           "Adaptive decode steps by the drafting mode the measured selector ran "
                           "(spec_config select): the per-step plan, a fixed draft length, none.",
                           {"mode"}));
    DI_ASSIGN_OR_RETURN(m->spec_mode_plan_, modes->WithLabels({"plan"}));
    DI_ASSIGN_OR_RETURN(m->spec_mode_fixed_, modes->WithLabels({"fixed"}));
    DI_ASSIGN_OR_RETURN(m->spec_mode_off_, modes->WithLabels({"off"}));
    MetricsHttpServerOptions options;
    options.listen_address = listen_address;
    Metrics* self = m.get();
    options.before_scrape = [self] { self->Refresh(); };
    options.healthy = [runtime] { return !runtime->draining(); };
    DI_ASSIGN_OR_RETURN(m->server_, MetricsHttpServer::Create(&m->registry_, options));
    DI_RETURN_IF_ERROR(m->server_->Start());
    return m;
  }

  int port() const { return server_->port(); }
  void Stop() { server_->Stop(); }

 private:
  explicit Metrics(const WorkerRuntime* runtime) : runtime_(runtime) {}

  // Counters mirror cumulative stats: add what grew since the last scrape.
  static void Mirror(Counter* counter, uint64_t value) { MirrorCounter(counter, value); }

  void Refresh() {
    const internal::v1::WorkerStats s = runtime_->Stats();
    absl::MutexLock lock(&mu_);
    kv_usage_->Set(s.total_kv_blocks() > 0 ? static_cast<double>(s.used_kv_blocks()) /
                                                 static_cast<double>(s.total_kv_blocks())
                                           : 0.0);
    queue_depth_->Set(s.waiting_sequences());
    running_->Set(s.running_sequences());
    hit_ratio_->Set(s.prefix_query_tokens() > 0 ? static_cast<double>(s.prefix_hit_tokens()) /
                                                      static_cast<double>(s.prefix_query_tokens())
                                                : 0.0);
    Mirror(queries_, s.prefix_query_tokens());
    Mirror(hits_, s.prefix_hit_tokens());
    Mirror(transfer_bytes_, s.transfer_bytes_written());
    Mirror(transfer_failures_, s.transfer_posts_failed());
    Mirror(requests_ok_, s.requests_ok());
    Mirror(requests_error_, s.requests_failed());
    Mirror(requests_cancelled_, s.requests_cancelled());
    Mirror(spec_draft_, s.spec_draft_tokens());
    Mirror(spec_verified_, s.spec_verified_tokens());
    Mirror(spec_accepted_, s.spec_accepted_tokens());
    Mirror(spec_draft_evictions_, s.spec_draft_evictions());
    Mirror(spec_draft_upkeep_, s.spec_draft_upkeep_tokens());
    Mirror(spec_mode_plan_, s.spec_select_plan_steps());
    Mirror(spec_mode_fixed_, s.spec_select_fixed_steps());
    Mirror(spec_mode_off_, s.spec_select_off_steps());
  }

  const WorkerRuntime* const runtime_;
  MetricsRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
  absl::Mutex mu_;  // serialises Refresh (the counters' read-then-add)
  Gauge* kv_usage_ = nullptr;
  Gauge* queue_depth_ = nullptr;
  Gauge* running_ = nullptr;
  Gauge* hit_ratio_ = nullptr;
  Counter* queries_ = nullptr;
  Counter* hits_ = nullptr;
  Counter* transfer_bytes_ = nullptr;
  Counter* transfer_failures_ = nullptr;
  Counter* requests_ok_ = nullptr;
  Counter* requests_error_ = nullptr;
  Counter* requests_cancelled_ = nullptr;
  Counter* spec_draft_ = nullptr;
  Counter* spec_verified_ = nullptr;
  Counter* spec_accepted_ = nullptr;
  Counter* spec_draft_evictions_ = nullptr;
  Counter* spec_draft_upkeep_ = nullptr;
  Counter* spec_mode_plan_ = nullptr;
  Counter* spec_mode_fixed_ = nullptr;
  Counter* spec_mode_off_ = nullptr;
};

absl::Status ValidateSpeculativeOptions(const engine::SpecOptions& spec) {
  if (!spec.enabled) return absl::OkStatus();
  if (spec.drafter != "ngram" && spec.drafter != "draft_model") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative: expected off, ngram or draft_model, got \"", spec.drafter, "\""));
  }
  if (spec.drafter == "draft_model" && spec.draft_model_path.empty()) {
    return absl::InvalidArgumentError(
        "--draft_model: required with --speculative=draft_model (the draft checkpoint's "
        "directory)");
  }
  if (spec.draft_num_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft_kv_blocks: expected >= 0 (0: as many as --kv_blocks), got ",
                     spec.draft_num_blocks));
  }
  if (spec.num_speculative_tokens < 1 || spec.num_speculative_tokens > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_speculative_tokens: expected [1, 64], got ", spec.num_speculative_tokens));
  }
  if (spec.select_max_length < 0 || spec.select_max_length > spec.num_speculative_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_config: select_max_length: expected [0, --num_speculative_tokens = ",
                     spec.num_speculative_tokens, "], got ", spec.select_max_length));
  }
  if (spec.min_n < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_config: ngram_min: expected >= 1, got ", spec.min_n));
  }
  if (spec.max_n < spec.min_n || spec.max_n > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec_config: ngram_max: expected [ngram_min = ", spec.min_n, ", 64], got ", spec.max_n));
  }
  return absl::OkStatus();
}

bool OverlapEnabled(absl::string_view overlap, int allowed_cpus) {
  return overlap == "on" || (overlap == "auto" && allowed_cpus != 1);
}

internal::v1::SpeculativeConfig ToSpeculativeConfig(const engine::SpecOptions& spec) {
  internal::v1::SpeculativeConfig c;
  if (!spec.enabled) {
    c.set_method("off");
    return c;
  }
  c.set_method(spec.drafter);
  c.set_num_speculative_tokens(static_cast<uint32_t>(spec.num_speculative_tokens));
  c.set_min_n(static_cast<uint32_t>(spec.min_n));
  c.set_max_n(static_cast<uint32_t>(spec.max_n));
  c.set_adaptive(spec.adaptive);
  if (spec.drafter == "draft_model") {
    // The checkpoint's directory name (e.g. ".../qwen2-0.5b/" -> "qwen2-0.5b").
    absl::string_view path = spec.draft_model_path;
    while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
    const size_t slash = path.rfind('/');
    c.set_draft_model_id(
        std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1)));
  }
  return c;
}

WorkerRuntime::WorkerRuntime(WorkerOptions options) : options_(std::move(options)) {}

WorkerRuntime::~WorkerRuntime() { Drain(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<WorkerRuntime>> WorkerRuntime::Create(WorkerOptions options) {
  if (options.role != internal::v1::WORKER_ROLE_PREFILL &&
      options.role != internal::v1::WORKER_ROLE_DECODE) {
    return absl::InvalidArgumentError(
        absl::StrCat("role: expected WORKER_ROLE_PREFILL or WORKER_ROLE_DECODE, got ",
                     WorkerRoleName(options.role)));
  }
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError("--model: required (a Hugging Face model directory)");
  }
  DI_RETURN_IF_ERROR(Positive("kv_blocks", options.kv_blocks));
  DI_RETURN_IF_ERROR(Positive("block_size", options.block_size));
  DI_RETURN_IF_ERROR(Positive("max_batch_tokens", options.max_batch_tokens));
  DI_RETURN_IF_ERROR(Positive("max_running", options.max_running));
  DI_RETURN_IF_ERROR(Positive("max_waiting", options.max_waiting));
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: expected >= 0 (0 = all cores), got ", options.threads));
  }
  DI_RETURN_IF_ERROR(
      ParseHostPort("listen", options.listen_address, /*allow_port_zero=*/true).status());
  if (!options.router_address.empty()) {
    DI_RETURN_IF_ERROR(
        ParseHostPort("router", options.router_address, /*allow_port_zero=*/false).status());
  }
  if (!options.metrics_listen.empty()) {
    DI_RETURN_IF_ERROR(
        ParseHostPort("metrics_listen", options.metrics_listen, /*allow_port_zero=*/true).status());
  }
  if (options.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--drain_timeout: expected >= 0, got ",
                                                   absl::FormatDuration(options.drain_timeout)));
  }
  if (options.wedged_after <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("wedged_after: expected > 0, got ",
                                                   absl::FormatDuration(options.wedged_after)));
  }
  if (options.overlap != "auto" && options.overlap != "on" && options.overlap != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--overlap: expected auto, on or off, got \"", options.overlap, "\""));
  }
  DI_RETURN_IF_ERROR(ValidateSpeculativeOptions(options.speculative));
  if (options.speculative.cost_table != nullptr) {
    return absl::InvalidArgumentError(
        "speculative.cost_table: expected null (a decode node profiles its own)");
  }
  if (options.worker_id.empty()) options.worker_id = DefaultWorkerId(options.role);
  if (options.worker_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_id: expected 1..128 bytes, got ", options.worker_id.size()));
  }
  if (options.device != "cpu" && options.device != "cuda" && options.device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: expected cpu, cuda or auto, got \"", options.device, "\""));
  }
  if (options.model_id.empty()) options.model_id = LastPathComponent(options.model_path);

  auto rt = std::unique_ptr<WorkerRuntime>(new WorkerRuntime(std::move(options)));
  const WorkerOptions& o = rt->options_;
  rt->incarnation_ = NewIncarnation();

  DI_ASSIGN_OR_RETURN(rt->model_,
                      engine::Model::Load(o.model_path, engine::ModelOptions{o.threads}));
  DI_ASSIGN_OR_RETURN(rt->assets_, engine::ModelAssets::Load(o.model_path));

  kv_transfer::AgentConfig agent_config;
  agent_config.name = o.worker_id;
  agent_config.incarnation = rt->incarnation_;
  agent_config.backend = o.kv_backend;
  DI_ASSIGN_OR_RETURN(rt->agent_, kv_transfer::CreateTransferAgent(std::move(agent_config)));
  DI_RETURN_IF_ERROR(rt->agent_->Start());

  engine::EngineOptions eo;
  eo.num_blocks = o.kv_blocks;
  eo.block_size = o.block_size;
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.max_running = o.max_running;
  eo.max_waiting = o.max_waiting;
  eo.enable_prefix_cache = o.enable_prefix_cache;
  eo.hash_seed = o.hash_seed;
  const int cpus = AllowedCpus();
  eo.overlap = OverlapEnabled(o.overlap, cpus);
  spdlog::info("overlapped scheduling {} (--overlap={}, {} CPUs allowed)", eo.overlap ? "on" : "off",
               o.overlap, cpus);
  eo.eos_token_ids = rt->assets_->eos_token_ids();
  eo.tokenizer = &rt->assets_->tokenizer();
  eo.chat_template = rt->assets_->chat_template();
  eo.template_context = rt->assets_->template_context();
  // Only a decode engine speculates (see WorkerOptions::speculative).
  if (o.role == internal::v1::WORKER_ROLE_DECODE) eo.speculative = o.speculative;
  WorkerRuntime* self = rt.get();
  eo.kv_memory = [self](size_t pool_bytes) -> absl::StatusOr<std::pair<void*, void*>> {
    DI_ASSIGN_OR_RETURN(kv_transfer::AllocatedRegion k,
                        self->agent_->AllocateMemory(pool_bytes, kv_transfer::MemoryKind::kHost));
    DI_ASSIGN_OR_RETURN(kv_transfer::AllocatedRegion v,
                        self->agent_->AllocateMemory(pool_bytes, kv_transfer::MemoryKind::kHost));
    self->pool_layout_.set_k_region(k.region);
    self->pool_layout_.set_v_region(v.region);
    return std::make_pair(k.base, v.base);
  };
  if (o.device != "cpu") {
    // Graphs for one-token decode steps of up to the running batch (at most 256 sequences) over
    // contexts up to the model's length (or what the KV pools hold, if less).
    const int64_t positions = rt->model_->config().max_position_embeddings;
    const int64_t pooled = static_cast<int64_t>(o.kv_blocks) * o.block_size;
    const int max_context = static_cast<int>(positions > 0 ? std::min(positions, pooled) : pooled);
    absl::StatusOr<std::unique_ptr<engine::CudaBackend>> cuda = engine::CudaBackend::Create(
        *rt->model_, o.kv_blocks, o.block_size, std::min(o.max_running, 256), max_context);
    if (cuda.ok()) {
      rt->backend_ = *std::move(cuda);
      rt->device_ = "cuda";
      eo.backend = rt->backend_.get();
    } else if (o.device == "cuda") {
      return absl::Status(cuda.status().code(),
                          absl::StrCat("--device=cuda: ", cuda.status().message()));
    } else {
      spdlog::warn("--device=auto: running on the CPU: {}", cuda.status().ToString());
    }
  }
  DI_ASSIGN_OR_RETURN(rt->engine_, engine::LlmEngine::Create(rt->model_.get(), eo));

  rt->pool_layout_.set_num_layers(static_cast<uint32_t>(rt->model_->config().num_layers));
  rt->pool_layout_.set_num_blocks(static_cast<uint32_t>(o.kv_blocks));
  rt->pool_layout_.set_block_bytes(rt->engine_->kv_cache()->block_bytes());

  DI_ASSIGN_OR_RETURN(std::string blob, rt->agent_->ExportMetadata());
  rt->kv_metadata_.set_version(1);
  rt->kv_metadata_.set_agent_name(o.worker_id);
  rt->kv_metadata_.set_incarnation(rt->incarnation_);
  rt->kv_metadata_.set_backend(std::string(kv_transfer::BackendName(o.kv_backend)));
  rt->kv_metadata_.set_blob(std::move(blob));

  DI_RETURN_IF_ERROR(rt->engine_->Start());
  spdlog::info(
      "worker {} ({}) loaded {}: {} layers, {} KV blocks of {} tokens ({} bytes/block), "
      "incarnation {}, kv backend {}, device {}",
      o.worker_id, std::string(WorkerRoleName(o.role)), o.model_id, rt->pool_layout_.num_layers(),
      o.kv_blocks, o.block_size, rt->pool_layout_.block_bytes(), rt->incarnation_,
      std::string(kv_transfer::BackendName(o.kv_backend)), rt->device_);
  return rt;
}

absl::Status WorkerRuntime::Start(std::vector<grpc::Service*> services,
                                  std::vector<std::string> health_service_names,
                                  StatsContributor contribute_stats) {
  if (server_ != nullptr) return absl::FailedPreconditionError("WorkerRuntime: already started");
  if (draining_.load()) return absl::FailedPreconditionError("WorkerRuntime: drained");
  contribute_stats_ = std::move(contribute_stats);
  admin_ = std::make_unique<WorkerAdminService>([this] { return Stats(); });
  GrpcServerOptions so;
  so.listen_address = options_.listen_address;
  so.services = std::move(services);
  so.services.push_back(admin_.get());
  so.health_service_names = std::move(health_service_names);
  so.health_service_names.push_back(internal::v1::WorkerAdmin::service_full_name());
  DI_ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server, GrpcServer::Start(std::move(so)));
  {
    absl::MutexLock lock(&mu_);
    server_ = std::move(server);
    if (options_.router_address.empty()) registered_ = true;  // standalone: nothing to wait for
  }
  UpdateHealth();
  if (!options_.metrics_listen.empty()) {
    DI_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                        Metrics::Start(this, options_.metrics_listen));
    absl::MutexLock lock(&mu_);
    metrics_ = std::move(metrics);
    spdlog::info("worker {} serving metrics on port {}", options_.worker_id, metrics_->port());
  }
  if (!options_.port_file.empty()) {
    DI_RETURN_IF_ERROR(WritePortFile(options_.port_file, server_->port()));
  }
  if (!options_.router_address.empty()) {
    DI_ASSIGN_OR_RETURN(link_, NewRouterLink());
  }
  spdlog::info("worker {} serving on {}{}", options_.worker_id, server_->address(),
               options_.router_address.empty()
                   ? " (standalone)"
                   : absl::StrCat(", registering with router ", options_.router_address));
  watch_thread_ = std::thread([this] { WatchLoop(); });
  if (link_ != nullptr) DI_RETURN_IF_ERROR(link_->Start());
  return absl::OkStatus();
}

std::string WorkerRuntime::address() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? "" : server_->address();
}

int WorkerRuntime::port() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? 0 : server_->port();
}

int WorkerRuntime::metrics_port() const {
  absl::MutexLock lock(&mu_);
  return metrics_ == nullptr ? 0 : metrics_->port();
}

void WorkerRuntime::UpdateHealth() {
  absl::MutexLock lock(&mu_);
  if (server_ == nullptr) return;
  server_->SetServing(!draining_.load() && registered_ && !wedged_);
}

internal::v1::WorkerInfo WorkerRuntime::RegistrationInfo() const {
  internal::v1::WorkerInfo w;
  w.set_worker_id(options_.worker_id);
  w.set_role(options_.role);
  std::string address = server_->address();
  if (!options_.advertise_host.empty()) {
    HostPort hp;
    hp.host = options_.advertise_host;
    hp.port = static_cast<uint16_t>(server_->port());
    address = hp.ToString();
  }
  w.set_address(address);
  w.set_model(options_.model_id);
  w.set_incarnation(incarnation_);
  w.set_block_size(static_cast<uint32_t>(options_.block_size));
  w.set_kv_capacity_blocks(static_cast<uint64_t>(options_.kv_blocks));
  w.set_max_context_tokens(
      static_cast<uint32_t>(std::max<int64_t>(0, model_->config().max_position_embeddings)));
  w.set_can_prefill(options_.role == internal::v1::WORKER_ROLE_DECODE && options_.can_prefill);
  *w.mutable_kv_metadata() = kv_metadata_;
  w.set_block_hash_seed(options_.hash_seed);
  *w.mutable_speculative() = ToSpeculativeConfig(options_.speculative);
  return w;
}

absl::StatusOr<std::unique_ptr<RouterLink>> WorkerRuntime::NewRouterLink() {
  RouterLink::Options lo;
  lo.router_address = options_.router_address;
  lo.worker = RegistrationInfo();
  lo.log_name = "worker";
  lo.log_registration_details = true;
  lo.log_deregistration = true;
  // Throughput from engine counters between two reports.
  lo.load = [this, last_step_tokens = engine_->GetStats().step_tokens](
                absl::Duration since_last, internal::v1::LoadReport* report) mutable {
    const engine::EngineStats es = engine_->GetStats();
    report->set_queue_depth(static_cast<uint32_t>(es.waiting));
    report->set_queued_input_tokens(
        static_cast<uint64_t>(std::max<int64_t>(0, es.pending_prefill_tokens)));
    report->set_running_sequences(static_cast<uint32_t>(es.running));
    report->set_free_kv_blocks(
        static_cast<uint64_t>(es.blocks.free_blocks + es.blocks.cached_blocks));
    report->set_total_kv_blocks(static_cast<uint64_t>(es.blocks.num_blocks));
    const double seconds = absl::ToDoubleSeconds(since_last);
    const double tps =
        seconds > 0 ? static_cast<double>(es.step_tokens - last_step_tokens) / seconds : 0.0;
    // The engine counts all computed tokens together; attribute them to the node's role.
    if (options_.role == internal::v1::WORKER_ROLE_PREFILL) {
      report->set_prefill_tokens_per_second(tps);
    } else {
      report->set_decode_tokens_per_second(tps);
    }
    last_step_tokens = es.step_tokens;
  };
  // The engine has no snapshot API: after a resync request (or dropped events) the link sends
  // KIND_ALL_CLEARED followed only by new events, so the router's view of this node's cache is a
  // subset of the truth until blocks are stored again (costs hit rate, never correctness).
  lo.kv_events = [this, kv_events_dropped = int64_t{0}](
                     google::protobuf::RepeatedPtrField<internal::v1::KvEvent>* events) mutable {
    const int64_t dropped = engine_->GetStats().kv_events_dropped;
    AppendKvEvents(engine_->DrainKvEvents(), events);
    if (dropped == kv_events_dropped) return false;
    kv_events_dropped = dropped;
    return true;
  };
  lo.on_registered = [this] {
    {
      absl::MutexLock lock(&mu_);
      registered_ = true;
    }
    UpdateHealth();
  };
  return RouterLink::Create(std::move(lo));
}

void WorkerRuntime::WatchLoop() {
  int64_t last_steps = -1;
  absl::Time steps_changed = absl::Now();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_watch_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), kTick);
      if (stop_watch_) break;
    }
    const absl::Time now = absl::Now();
    const engine::EngineStats es = engine_->GetStats();

    // Wedged: work is queued or running, yet no step has completed for wedged_after.
    bool wedged = false;
    if (es.steps != last_steps || (es.running == 0 && es.waiting == 0)) {
      last_steps = es.steps;
      steps_changed = now;
    } else if (now - steps_changed > options_.wedged_after) {
      wedged = true;
    }
    bool health_changed = false;
    {
      absl::MutexLock lock(&mu_);
      if (wedged != wedged_) {
        wedged_ = wedged;
        health_changed = true;
        if (wedged) {
          spdlog::error("worker {}: engine wedged ({} running, {} waiting, no step for {})",
                        options_.worker_id, es.running, es.waiting,
                        absl::FormatDuration(now - steps_changed));
        } else {
          spdlog::info("worker {}: engine progressing again", options_.worker_id);
        }
      }
    }
    if (health_changed) UpdateHealth();
  }
}

WorkerRuntime::RequestScope::RequestScope(WorkerRuntime* runtime) : runtime_(runtime) {
  absl::MutexLock lock(&runtime_->mu_);
  if (runtime_->draining_.load()) return;
  ++runtime_->active_requests_;
  ok_ = true;
}

WorkerRuntime::RequestScope::~RequestScope() {
  if (!ok_) return;
  absl::MutexLock lock(&runtime_->mu_);
  --runtime_->active_requests_;
}

absl::Status WorkerRuntime::RequestScope::status() const {
  if (ok_) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("draining: worker ", runtime_->worker_id(), " accepts no new requests"));
}

void WorkerRuntime::Drain(absl::Duration timeout) {
  absl::MutexLock drain_lock(&drain_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (drained_) return;
    draining_.store(true);
    stop_watch_ = true;
  }
  UpdateHealth();
  const bool started = watch_thread_.joinable();
  if (started) {
    spdlog::info("worker {}: draining (up to {} for in-flight requests)", options_.worker_id,
                 absl::FormatDuration(timeout));
  }
  // The router link deregisters on its way out; then the wedge watch ends.
  if (link_ != nullptr) link_->Stop();
  if (watch_thread_.joinable()) watch_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_requests_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&idle), timeout)) {
      spdlog::warn("worker {}: {} requests still running after {}; cancelling them",
                   options_.worker_id, active_requests_, absl::FormatDuration(timeout));
    }
  }
  GrpcServer* server = nullptr;
  {
    absl::MutexLock lock(&mu_);
    server = server_.get();
  }
  if (server != nullptr) server->Shutdown(absl::Milliseconds(500));
  Metrics* metrics = nullptr;
  {
    absl::MutexLock lock(&mu_);
    metrics = metrics_.get();
  }
  if (metrics != nullptr) metrics->Stop();
  if (engine_ != nullptr) {
    engine_->Stop();
    // One line of what the engine did, for benchmarks and post-mortems.
    const internal::v1::WorkerStats st = Stats();
    spdlog::info(
        "worker {}: engine ran {} steps ({} overlapped); speculative: {} synced, {} without "
        "drafts, {} probes, {} drafted / {} verified / {} accepted tokens, {} draft-cache "
        "evictions, {} draft tokens reused, {} fed while not drafting; modes: {} plan / {} "
        "fixed-length / {} no-draft steps ({} with prompt tokens, unmeasured), {} exploring epochs",
        options_.worker_id, st.engine_steps(), st.overlapped_steps(), st.spec_synced_steps(),
        st.spec_no_draft_steps(), st.spec_probe_steps(), st.spec_draft_tokens(),
        st.spec_verified_tokens(), st.spec_accepted_tokens(), st.spec_draft_evictions(),
        st.spec_draft_reused_tokens(), st.spec_draft_upkeep_tokens(), st.spec_select_plan_steps(),
        st.spec_select_fixed_steps(),
        st.spec_select_off_steps(), st.spec_select_prompt_steps(), st.spec_select_explorations());
  }
  if (agent_ != nullptr) agent_->Stop();
  {
    absl::MutexLock lock(&mu_);
    drained_ = true;
  }
  if (started) spdlog::info("worker {}: drained", options_.worker_id);
  if (waiting_for_signal_.load()) RequestShutdown();
}

void WorkerRuntime::RunUntilSignal() {
  waiting_for_signal_.store(true);
  if (!draining_.load()) {
    const int sig = WaitForShutdownSignal();
    spdlog::info("worker {}: {}", options_.worker_id,
                 sig == 0 ? std::string("shutdown requested") : absl::StrCat("signal ", sig));
  }
  waiting_for_signal_.store(false);
  Drain(options_.drain_timeout);
}

internal::v1::WorkerStats WorkerRuntime::Stats() const {
  internal::v1::WorkerStats s;
  s.set_worker_id(options_.worker_id);
  s.set_role(options_.role);
  s.set_incarnation(incarnation_);
  s.set_draining(draining_.load());
  if (engine_ != nullptr) {
    const engine::EngineStats e = engine_->GetStats();
    s.set_running_sequences(static_cast<uint32_t>(e.running));
    s.set_waiting_sequences(static_cast<uint32_t>(e.waiting));
    s.set_awaiting_kv_sequences(static_cast<uint32_t>(e.awaiting_kv));
    s.set_held_sequences(static_cast<uint32_t>(e.held));
    s.set_used_kv_blocks(static_cast<uint64_t>(e.blocks.used_blocks));
    s.set_free_kv_blocks(static_cast<uint64_t>(e.blocks.free_blocks));
    s.set_cached_kv_blocks(static_cast<uint64_t>(e.blocks.cached_blocks));
    s.set_total_kv_blocks(static_cast<uint64_t>(e.blocks.num_blocks));
    s.set_prefix_query_tokens(static_cast<uint64_t>(e.blocks.prefix_queries_tokens));
    s.set_prefix_hit_tokens(static_cast<uint64_t>(e.blocks.prefix_hit_tokens));
    s.set_spec_steps(static_cast<uint64_t>(e.spec_steps));
    s.set_spec_draft_tokens(static_cast<uint64_t>(e.spec_drafted_tokens));
    s.set_spec_verified_tokens(static_cast<uint64_t>(e.spec_verified_tokens));
    s.set_spec_accepted_tokens(static_cast<uint64_t>(e.spec_accepted_tokens));
    s.set_engine_steps(static_cast<uint64_t>(e.steps));
    s.set_overlapped_steps(static_cast<uint64_t>(e.overlapped_steps));
    s.set_spec_synced_steps(static_cast<uint64_t>(e.spec_synced_steps));
    s.set_spec_no_draft_steps(static_cast<uint64_t>(e.spec_no_draft_steps));
    s.set_spec_probe_steps(static_cast<uint64_t>(e.spec_probe_steps));
    s.set_spec_draft_evictions(static_cast<uint64_t>(e.spec_draft_evictions));
    s.set_spec_draft_reused_tokens(static_cast<uint64_t>(e.spec_draft_reused_tokens));
    s.set_spec_select_plan_steps(static_cast<uint64_t>(e.spec_select_plan_steps));
    s.set_spec_select_fixed_steps(static_cast<uint64_t>(e.spec_select_fixed_steps));
    s.set_spec_select_off_steps(static_cast<uint64_t>(e.spec_select_off_steps));
    s.set_spec_select_prompt_steps(static_cast<uint64_t>(e.spec_select_prompt_steps));
    s.set_spec_select_explorations(static_cast<uint64_t>(e.spec_select_explorations));
    s.set_spec_draft_upkeep_tokens(static_cast<uint64_t>(e.spec_draft_upkeep_tokens));
  }
  {
    absl::MutexLock lock(&mu_);
    s.set_active_requests(static_cast<uint32_t>(active_requests_));
  }
  if (agent_ != nullptr) {
    const kv_transfer::AgentCounters c = agent_->counters();
    s.set_in_flight_transfers(static_cast<uint32_t>(c.in_flight_handles));
    s.set_transfer_bytes_written(c.bytes_written);
    s.set_transfer_posts_failed(c.posts_failed);
  }
  if (contribute_stats_) contribute_stats_(&s);
  return s;
}

}  // namespace deepinfer::node
