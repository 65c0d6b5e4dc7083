// A vision encoder node: the Encoder service (vision_encoder/encoder_service.h) over one loaded
// vision tower, its embedding cache, WorkerAdmin.GetStats and grpc.health.v1, and the router link
// (node/router_link.h: Register as WORKER_ROLE_ENCODER with backoff, ReportLoad every heartbeat
// the router asked for with queue depth = Encode calls in progress and images served per second,
// re-Register when the router answers known=false, Deregister on drain).
//
// With `metrics_listen` set, Prometheus /metrics and /healthz are served over HTTP, refreshed from
// Stats() at every scrape: deepinfer_queue_depth (Encode calls in progress),
// deepinfer_requests_total{outcome=ok|error|cancelled}, deepinfer_images_encoded_total (images
// that ran the tower), deepinfer_embedding_cache_hits_total / _misses_total (images),
// deepinfer_embedding_cache_bytes and deepinfer_embedding_cache_entries.
//
// Health is NOT_SERVING until the first Register succeeds (at once when standalone) and while
// draining. The bound port is written to `port_file` once the server answers RPCs.
//
// Lifecycle: Create (loads the model, binds nothing) -> Start -> ... -> Drain (idempotent; the
// destructor drains with no grace). Thread-safety: after Start every method is thread-safe.
#ifndef DEEPINFER_VISION_ENCODER_ENCODER_NODE_H_
#define DEEPINFER_VISION_ENCODER_ENCODER_NODE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_server.h"
#include "engine/vision/vision_encoder.h"
#include "node/router_link.h"
#include "node/worker_link.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "vision_encoder/embedding_cache.h"
#include "vision_encoder/encoder_service.h"

namespace deepinfer::vision_encoder {

struct EncoderNodeOptions {
  // Unique in the cluster; empty -> "encoder-<hostname>-<pid>".
  std::string worker_id;
  std::string listen_address = "127.0.0.1:0";
  // Host registered instead of the bound one (e.g. the pod IP).
  std::string advertise_host;
  // Router "host:port"; empty = standalone.
  std::string router_address;
  // LLaVA-style Hugging Face directory; model_id defaults to its last path component and must
  // equal the language model's id that prefill/decode workers register.
  std::string model_path;
  std::string model_id;
  int threads = 0;
  // Embedding cache capacity (bytes of float32 embeddings); 0 disables the cache.
  int64_t cache_bytes = int64_t{256} << 20;
  engine::vision::ImageLimits limits;
  int max_images_per_request = 16;
  std::string port_file;
  // "host:port" serving Prometheus /metrics (port 0 = any, see metrics_port()); "" = off.
  std::string metrics_listen;
  absl::Duration drain_timeout = absl::Seconds(30);
};

class EncoderNode {
 public:
  // kInvalidArgument naming the option (model_path empty, threads < 0, cache_bytes < 0, limits
  // not positive); load errors as VisionEncoder::Load gives them.
  static absl::StatusOr<std::unique_ptr<EncoderNode>> Create(EncoderNodeOptions options);

  EncoderNode(const EncoderNode&) = delete;
  EncoderNode& operator=(const EncoderNode&) = delete;
  ~EncoderNode();

  absl::Status Start();
  std::string address() const;
  int port() const;
  // The metrics server's bound port after Start; 0 when metrics_listen is empty.
  int metrics_port() const;
  const EncoderNodeOptions& options() const { return options_; }
  internal::v1::WorkerStats Stats() const;

  // Health NOT_SERVING, Deregister, wait up to `timeout` for in-flight calls, shut down.
  void Drain(absl::Duration timeout);
  // Until SIGTERM/SIGINT, then Drain(drain_timeout).
  void RunUntilSignal();

 private:
  class Metrics;
  explicit EncoderNode(EncoderNodeOptions options);
  // The router link for options_.router_address (set), reporting this node's load.
  absl::StatusOr<std::unique_ptr<node::RouterLink>> NewRouterLink();
  // What this node registers with the router (valid once the server is bound).
  internal::v1::WorkerInfo RegistrationInfo() const;

  EncoderNodeOptions options_;
  uint64_t incarnation_ = 0;
  std::unique_ptr<engine::vision::VisionEncoder> encoder_;
  std::unique_ptr<EmbeddingCache> cache_;
  std::unique_ptr<EncoderService> service_;
  std::unique_ptr<node::WorkerAdminService> admin_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<Metrics> metrics_;
  // Set in Start when router_address is; stopped (deregistering) in Drain.
  std::unique_ptr<node::RouterLink> link_;

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex drain_mu_;
};

}  // namespace deepinfer::vision_encoder

#endif  // DEEPINFER_VISION_ENCODER_ENCODER_NODE_H_
