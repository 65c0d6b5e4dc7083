#include "vision_encoder/encoder_node.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/metrics.h"
#include "common/metrics_http_server.h"
#include "common/process_lifecycle.h"
#include "common/status_macros.h"
#include "node/worker_identity.h"
#include "node/worker_link.h"
#include "spdlog/spdlog.h"

namespace deepinfer::vision_encoder {
namespace {

using internal::v1::WORKER_ROLE_ENCODER;

}  // namespace

// The node's Prometheus registry and its HTTP server; values mirror Stats() at each scrape.
class EncoderNode::Metrics {
 public:
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const EncoderNode* node,
                                                        const std::string& listen_address) {
    std::unique_ptr<Metrics> m(new Metrics(node));
    MetricsRegistry& r = m->registry_;
    DI_ASSIGN_OR_RETURN(m->queue_depth_,
                        r.AddGauge("deepinfer_queue_depth", "Encode calls in progress."));
    DI_ASSIGN_OR_RETURN(
        CounterFamily * requests,
        r.AddCounterFamily("deepinfer_requests_total", "Encode calls, by outcome.", {"outcome"}));
    DI_ASSIGN_OR_RETURN(m->requests_ok_, requests->WithLabels({"ok"}));
    DI_ASSIGN_OR_RETURN(m->requests_error_, requests->WithLabels({"error"}));
    DI_ASSIGN_OR_RETURN(m->requests_cancelled_, requests->WithLabels({"cancelled"}));
    DI_ASSIGN_OR_RETURN(m->encoded_, r.AddCounter("deepinfer_images_encoded_total",
                                                  "Images that ran the vision tower."));
    DI_ASSIGN_OR_RETURN(m->hits_, r.AddCounter("deepinfer_embedding_cache_hits_total",
                                               "Images served from the embedding cache."));
    DI_ASSIGN_OR_RETURN(m->misses_, r.AddCounter("deepinfer_embedding_cache_misses_total",
                                                 "Images not in the embedding cache."));
    DI_ASSIGN_OR_RETURN(m->bytes_, r.AddGauge("deepinfer_embedding_cache_bytes",
                                              "Bytes of embeddings the cache holds."));
    DI_ASSIGN_OR_RETURN(m->entries_, r.AddGauge("deepinfer_embedding_cache_entries",
                                                "Images the embedding cache holds."));
    MetricsHttpServerOptions options;
    options.listen_address = listen_address;
    Metrics* self = m.get();
    options.before_scrape = [self] { self->Refresh(); };
    options.healthy = [node] { return !node->Stats().draining(); };
    DI_ASSIGN_OR_RETURN(m->server_, MetricsHttpServer::Create(&m->registry_, options));
    DI_RETURN_IF_ERROR(m->server_->Start());
    return m;
  }

  int port() const { return server_->port(); }
  void Stop() { server_->Stop(); }

 private:
  explicit Metrics(const EncoderNode* node) : node_(node) {}

  static void Mirror(Counter* counter, uint64_t value) { node::MirrorCounter(counter, value); }

  void Refresh() {
    const internal::v1::WorkerStats s = node_->Stats();
    absl::MutexLock lock(&mu_);
    queue_depth_->Set(s.active_requests());
    Mirror(requests_ok_, s.requests_ok());
    Mirror(requests_error_, s.requests_failed());
    Mirror(requests_cancelled_, s.requests_cancelled());
    Mirror(encoded_, s.images_encoded());
    Mirror(hits_, s.embedding_cache_hits());
    Mirror(misses_, s.embedding_cache_misses());
    bytes_->Set(static_cast<double>(s.embedding_cache_bytes()));
    entries_->Set(static_cast<double>(s.embedding_cache_entries()));
  }

  const EncoderNode* const node_;
  MetricsRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
  absl::Mutex mu_;  // serialises Refresh (the counters' read-then-add)
  Gauge* queue_depth_ = nullptr;
  Counter* requests_ok_ = nullptr;
  Counter* requests_error_ = nullptr;
  Counter* requests_cancelled_ = nullptr;
  Counter* encoded_ = nullptr;
  Counter* hits_ = nullptr;
  Counter* misses_ = nullptr;
  Gauge* bytes_ = nullptr;
  Gauge* entries_ = nullptr;
};

EncoderNode::EncoderNode(EncoderNodeOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<EncoderNode>> EncoderNode::Create(EncoderNodeOptions options) {
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError("--model: expected a LLaVA-style model directory");
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads: expected >= 0, got ", options.threads));
  }
  if (options.cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--embedding_cache: expected >= 0 bytes, got ", options.cache_bytes));
  }
  if (options.limits.max_bytes <= 0 || options.limits.max_pixels <= 0) {
    return absl::InvalidArgumentError("--max_image_bytes/--max_image_pixels: expected > 0");
  }
  if (options.max_images_per_request < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_images_per_request: expected >= 1, got ", options.max_images_per_request));
  }
  if (options.model_id.empty()) options.model_id = node::LastPathComponent(options.model_path);
  if (options.worker_id.empty()) options.worker_id = node::DefaultWorkerId(WORKER_ROLE_ENCODER);
  std::unique_ptr<EncoderNode> n(new EncoderNode(std::move(options)));
  n->incarnation_ = node::NewIncarnation();
  engine::vision::VisionEncoderOptions vo;
  vo.num_threads = n->options_.threads;
  vo.limits = n->options_.limits;
  DI_ASSIGN_OR_RETURN(n->encoder_,
                      engine::vision::VisionEncoder::Load(n->options_.model_path, vo));
  n->cache_ = std::make_unique<EmbeddingCache>(n->options_.cache_bytes);
  EncoderService::Options so;
  so.worker_id = n->options_.worker_id;
  so.max_images = n->options_.max_images_per_request;
  so.max_image_bytes = n->options_.limits.max_bytes;
  n->service_ = std::make_unique<EncoderService>(n->encoder_.get(), n->cache_.get(), so);
  EncoderNode* self = n.get();
  n->admin_ = std::make_unique<node::WorkerAdminService>([self] { return self->Stats(); });
  spdlog::info("encoder {}: model {} ({} image tokens x {} per image), cache {} bytes",
               n->options_.worker_id, n->options_.model_id, n->encoder_->num_image_tokens(),
               n->encoder_->output_hidden_size(), n->options_.cache_bytes);
  return n;
}

EncoderNode::~EncoderNode() { Drain(absl::ZeroDuration()); }

absl::Status EncoderNode::Start() {
  GrpcServerOptions so;
  so.listen_address = options_.listen_address;
  so.services = {service_.get(), admin_.get()};
  so.health_service_names = {std::string(internal::v1::Encoder::service_full_name())};
  DI_ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server, GrpcServer::Start(std::move(so)));
  {
    absl::MutexLock lock(&mu_);
    server_ = std::move(server);
    if (options_.router_address.empty()) {
      registered_ = true;
      server_->SetServing(true);
    }
  }
  if (!options_.metrics_listen.empty()) {
    DI_ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                        Metrics::Start(this, options_.metrics_listen));
    absl::MutexLock lock(&mu_);
    metrics_ = std::move(metrics);
  }
  if (!options_.port_file.empty()) {
    DI_RETURN_IF_ERROR(WritePortFile(options_.port_file, port()));
  }
  if (!options_.router_address.empty()) {
    DI_ASSIGN_OR_RETURN(link_, NewRouterLink());
    DI_RETURN_IF_ERROR(link_->Start());
  }
  spdlog::info("encoder {}: serving on {}", options_.worker_id, address());
  return absl::OkStatus();
}

std::string EncoderNode::address() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? "" : server_->address();
}

int EncoderNode::port() const {
  absl::MutexLock lock(&mu_);
  return server_ == nullptr ? 0 : server_->port();
}

int EncoderNode::metrics_port() const {
  absl::MutexLock lock(&mu_);
  return metrics_ == nullptr ? 0 : metrics_->port();
}

internal::v1::WorkerInfo EncoderNode::RegistrationInfo() const {
  internal::v1::WorkerInfo w;
  w.set_worker_id(options_.worker_id);
  w.set_role(WORKER_ROLE_ENCODER);
  std::string address = this->address();
  if (!options_.advertise_host.empty()) {
    HostPort hp;
    hp.host = options_.advertise_host;
    hp.port = static_cast<uint16_t>(port());
    address = hp.ToString();
  }
  w.set_address(address);
  w.set_model(options_.model_id);
  w.set_incarnation(incarnation_);
  return w;
}

absl::StatusOr<std::unique_ptr<node::RouterLink>> EncoderNode::NewRouterLink() {
  node::RouterLink::Options lo;
  lo.router_address = options_.router_address;
  lo.worker = RegistrationInfo();
  lo.log_name = "encoder";
  lo.log_registration_details = false;
  lo.log_deregistration = false;
  lo.load = [this, last_served = service_->counters().images_served](
                absl::Duration since_last, internal::v1::LoadReport* report) mutable {
    const EncoderService::Counters c = service_->counters();
    report->set_queue_depth(static_cast<uint32_t>(std::max<int64_t>(0, c.active_requests)));
    const double seconds = absl::ToDoubleSeconds(since_last);
    report->set_images_per_second(
        seconds > 0 ? static_cast<double>(c.images_served - last_served) / seconds : 0.0);
    last_served = c.images_served;
  };
  lo.on_registered = [this] {
    absl::MutexLock lock(&mu_);
    registered_ = true;
    if (server_ != nullptr && !draining_) server_->SetServing(true);
  };
  return node::RouterLink::Create(std::move(lo));
}

internal::v1::WorkerStats EncoderNode::Stats() const {
  internal::v1::WorkerStats s;
  s.set_worker_id(options_.worker_id);
  s.set_role(WORKER_ROLE_ENCODER);
  s.set_incarnation(incarnation_);
  {
    absl::MutexLock lock(&mu_);
    s.set_draining(draining_);
  }
  const EncoderService::Counters c = service_->counters();
  s.set_active_requests(static_cast<uint32_t>(std::max<int64_t>(0, c.active_requests)));
  s.set_requests_ok(static_cast<uint64_t>(c.requests_ok));
  s.set_requests_failed(static_cast<uint64_t>(c.requests_failed));
  s.set_requests_cancelled(static_cast<uint64_t>(c.requests_cancelled));
  s.set_images_encoded(static_cast<uint64_t>(c.images_encoded));
  const EmbeddingCache::Stats cs = cache_->stats();
  s.set_embedding_cache_hits(static_cast<uint64_t>(cs.hits));
  s.set_embedding_cache_misses(static_cast<uint64_t>(cs.misses));
  s.set_embedding_cache_entries(static_cast<uint64_t>(cs.entries));
  s.set_embedding_cache_bytes(static_cast<uint64_t>(cs.bytes));
  return s;
}

void EncoderNode::Drain(absl::Duration timeout) {
  absl::MutexLock drain_lock(&drain_mu_);
  GrpcServer* server = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (drained_) return;
    draining_ = true;
    server = server_.get();
  }
  if (server != nullptr) server->SetServing(false);
  // The router link deregisters on its way out.
  if (link_ != nullptr) link_->Stop();
  if (server != nullptr) {
    spdlog::info("encoder {}: draining (up to {})", options_.worker_id,
                 absl::FormatDuration(timeout));
    server->Shutdown(timeout);
  }
  Metrics* metrics = nullptr;
  {
    absl::MutexLock lock(&mu_);
    metrics = metrics_.get();
  }
  if (metrics != nullptr) metrics->Stop();
  absl::MutexLock lock(&mu_);
  drained_ = true;
}

void EncoderNode::RunUntilSignal() {
  const int sig = WaitForShutdownSignal();
  spdlog::info("encoder {}: {}", options_.worker_id,
               sig == 0 ? std::string("shutdown requested") : absl::StrCat("signal ", sig));
  Drain(options_.drain_timeout);
}

}  // namespace deepinfer::vision_encoder
