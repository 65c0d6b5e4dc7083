// What every prefill and decode node shares (the role's gRPC service is separate:
// prefill_node/prefill_service.h, decode_node/decode_service.h):
//
//  * bring-up: model weights + assets (tokenizer, chat template, EOS ids), a kv_transfer agent,
//    the engine with its KV pools allocated by the agent (AgentConfig::AllocateMemory, so peers
//    write straight into them), the pool layout and agent metadata peers need;
//  * the gRPC server: the role's services + WorkerAdmin (GetStats) + grpc.health.v1, NOT_SERVING
//    until the engine runs and the node registered, and again while draining;
//  * the router link (node/router_link.h): Register (retried with backoff until it succeeds),
//    ReportLoad every heartbeat interval the router asked for with the engine's queue, KV blocks
//    and tokens per second (re-Register when the router answers known=false), PublishKvEvents
//    with the engine's KV events (a full snapshot after resync), Deregister on drain;
//  * the wedge watch: a thread that turns health NOT_SERVING while the engine has work but
//    finishes no step (WorkerOptions::wedged_after);
//  * request accounting for the drain: the role's service wraps each RPC in a RequestScope;
//    Drain() refuses new ones (UNAVAILABLE "draining"), waits for the running ones, then stops;
//  * Prometheus metrics (when WorkerOptions::metrics_listen is set): /metrics and /healthz over
//    HTTP, refreshed from Stats() at every scrape: deepinfer_kv_cache_usage_ratio (used / total
//    KV blocks), deepinfer_queue_depth (waiting sequences), deepinfer_running_sequences,
//    deepinfer_prefix_cache_hit_ratio (hit / looked-up prompt tokens since start),
//    deepinfer_prefix_cache_queries_total / deepinfer_prefix_cache_hits_total (tokens),
//    deepinfer_kv_transfer_bytes_total, deepinfer_kv_transfer_failures_total and
//    deepinfer_requests_total{outcome=ok|error|cancelled} (the role service's RPCs), and with
//    speculative decoding deepinfer_spec_draft_tokens_total (drafted),
//    deepinfer_spec_verified_tokens_total (of those, verified by the model) and
//    deepinfer_spec_accepted_tokens_total (of those, accepted) and
//    deepinfer_spec_draft_evictions_total (draft-model KV evicted for room) and, adaptive,
//    deepinfer_spec_mode_steps_total{mode=plan|fixed|off} (the measured selector's modes);
//  * the port file: once the server is bound and answering RPCs (health may still say
//    NOT_SERVING until the first Register succeeds), the bound port is written to --port_file
//    (write + rename), which is how the launcher and tests learn ports when listening on port 0.
//    Readiness is health SERVING, not the port file.
//
// Lifecycle: Create (loads everything, binds nothing) -> Start(services) -> ... -> Drain(timeout)
// (idempotent; also run by the destructor) . RunUntilSignal() = Start's caller waiting for
// SIGTERM/SIGINT, then Drain.
//
// Thread-safety: after Start, every method is thread-safe. Not copyable or movable.
#ifndef DEEPINFER_NODE_WORKER_RUNTIME_H_
#define DEEPINFER_NODE_WORKER_RUNTIME_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc_server.h"
#include "engine/forward_backend.h"
#include "engine/llm_engine.h"
#include "engine/model.h"
#include "engine/model_assets.h"
#include "kv_transfer/transfer_agent.h"
#include "node/router_link.h"
#include "node/worker_link.h"
#include "proto/deepinfer/internal/v1/kv_transfer.pb.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::node {

struct WorkerOptions {
  internal::v1::WorkerRole role = internal::v1::WORKER_ROLE_UNSPECIFIED;
  // Unique in the cluster; empty -> "<role>-<hostname>-<pid>".
  std::string worker_id;
  // Where to serve ("host:port", port 0 = any). The address registered with the router is the
  // bound one, with `advertise_host` replacing the host when set (e.g. the pod IP).
  std::string listen_address = "127.0.0.1:0";
  std::string advertise_host;
  // Router's "host:port"; empty = standalone (no registration; tests of one node).
  std::string router_address;
  // Hugging Face model directory; `model_id` defaults to its last path component.
  std::string model_path;
  std::string model_id;
  // KV cache: blocks of `block_size` tokens.
  int kv_blocks = 4096;
  int block_size = 16;
  // Engine scheduling.
  int max_batch_tokens = 512;
  int max_running = 64;
  int max_waiting = 4096;
  bool enable_prefix_cache = true;
  uint64_t hash_seed = 0;
  // Forward threads; 0 = all cores.
  int threads = 0;
  // Overlapped scheduling (--overlap): "on", "off" or "auto" (on when the process's CPU affinity
  // allows at least two CPUs: on one, preparing the next step while the current one runs only
  // time-slices the core between the two threads).
  std::string overlap = "auto";
  // Where forward passes run (--device): "cpu" (the CPU model), "cuda" (GPU 0: weights and KV
  // pools on the device, engine/cuda/cuda_backend.h; start-up fails with the reason when the
  // device or the model's shapes are not usable) or "auto" (cuda when that works, else cpu, the
  // reason logged). The KV pools registered for transfer stay in host memory either way.
  std::string device = "cpu";
  // "ucx" (between processes) or "loopback" (one process: tests).
  kv_transfer::Backend kv_backend = kv_transfer::Backend::kUcx;
  // Decode nodes that may also prefill locally (colocated mode).
  bool can_prefill = false;
  // Speculative decoding (--speculative, --num_speculative_tokens, --draft_model,
  // --draft_kv_blocks, --spec_adaptive, and the --spec_config file: node/spec_config.h).
  // Registered with the router on every role (the router refuses a worker whose config differs
  // from its model's other workers), but only a decode node's engine speculates: a prefill node
  // computes prompts and one token. `cost_table` must stay null
  // (adaptive: the decode engine profiles the model in Create).
  engine::SpecOptions speculative;
  // Write the bound port here once serving ("" = don't).
  std::string port_file;
  // "host:port" serving Prometheus /metrics (port 0 = any, see metrics_port()); "" = off.
  std::string metrics_listen;
  // Most time Drain() waits for in-flight RPCs before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Health reports NOT_SERVING when the engine has work but has not finished a step for this long.
  absl::Duration wedged_after = absl::Seconds(60);
};

// kInvalidArgument naming the flag for SpecOptions a worker cannot run: drafter other than
// "ngram" or "draft_model", "draft_model" without --draft_model, --num_speculative_tokens outside
// [1, 64], --draft_kv_blocks < 0, select_max_length outside [0, --num_speculative_tokens],
// ngram_min < 1, ngram_max outside [ngram_min, 64] (spec_config keys). OK
// when speculation is off (the other fields are then ignored).
absl::Status ValidateSpeculativeOptions(const engine::SpecOptions& spec);

// Whether the engine overlaps scheduling with the step in flight for --overlap=`overlap` ("on",
// "off", "auto": on unless the process may run on exactly one CPU) when its affinity allows
// `allowed_cpus` CPUs (0: unknown, taken as several).
bool OverlapEnabled(absl::string_view overlap, int allowed_cpus);

// What a worker registers (WorkerInfo.speculative) for `spec`: method "off" and nothing else
// when disabled; with a draft model, draft_model_id is the last component of its directory.
internal::v1::SpeculativeConfig ToSpeculativeConfig(const engine::SpecOptions& spec);

// Role-specific counters a service adds to WorkerStats (requests_ok/failed/cancelled and
// anything else it knows), called with the stats already filled from engine and agent.
using StatsContributor = std::function<void(internal::v1::WorkerStats*)>;

class WorkerRuntime {
 public:
  // Loads the model and assets, creates the agent (started) and the engine (started) with its
  // pools allocated through the agent. kInvalidArgument naming the option for bad options;
  // load errors as Model::Load / ModelAssets::Load give them.
  static absl::StatusOr<std::unique_ptr<WorkerRuntime>> Create(WorkerOptions options);

  WorkerRuntime(const WorkerRuntime&) = delete;
  WorkerRuntime& operator=(const WorkerRuntime&) = delete;
  ~WorkerRuntime();  // Drain(absl::ZeroDuration()) if not drained

  const WorkerOptions& options() const { return options_; }
  const std::string& worker_id() const { return options_.worker_id; }
  uint64_t incarnation() const { return incarnation_; }
  engine::Model* model() const { return model_.get(); }
  const engine::ModelAssets& assets() const { return *assets_; }
  engine::LlmEngine* engine() const { return engine_.get(); }
  // Where forward passes run: "cpu" or "cuda" (--device=auto resolved).
  const std::string& device() const { return device_; }
  kv_transfer::TransferAgent* agent() const { return agent_.get(); }
  // This node's KV pools (regions as its agent metadata lists them).
  const internal::v1::KvPoolLayout& pool_layout() const { return pool_layout_; }
  // This node's agent metadata (ExportMetadata taken after the pools were allocated).
  const internal::v1::KvPeerMetadata& kv_metadata() const { return kv_metadata_; }

  // Starts serving `services` (not owned; they must outlive the runtime) plus WorkerAdmin and
  // health, registers with the router (in the background; health turns SERVING after the first
  // successful Register, or at once when standalone), and writes the port file.
  absl::Status Start(std::vector<grpc::Service*> services,
                     std::vector<std::string> health_service_names,
                     StatsContributor contribute_stats = nullptr);

  // The bound "host:port" (valid after Start).
  std::string address() const;
  int port() const;
  // The metrics server's bound port after Start; 0 when metrics_listen is empty.
  int metrics_port() const;

  // Brackets one RPC of the role's service. ok() is false while draining (answer UNAVAILABLE
  // with status()); the destructor ends the request.
  class RequestScope {
   public:
    explicit RequestScope(WorkerRuntime* runtime);
    ~RequestScope();
    RequestScope(const RequestScope&) = delete;
    RequestScope& operator=(const RequestScope&) = delete;
    bool ok() const { return ok_; }
    absl::Status status() const;

   private:
    WorkerRuntime* const runtime_;
    bool ok_ = false;
  };

  bool draining() const { return draining_.load(); }

  // Health NOT_SERVING, Deregister from the router, refuse new requests, wait up to `timeout`
  // for in-flight ones, then shut the server down (cancelling what is left), stop the engine and
  // the agent. Idempotent; thread-safe.
  void Drain(absl::Duration timeout);

  // Blocks until SIGTERM or SIGINT (or Drain from another thread), then Drain(drain_timeout).
  void RunUntilSignal();

  // The stats WorkerAdmin.GetStats returns.
  internal::v1::WorkerStats Stats() const;

 private:
  class Metrics;
  explicit WorkerRuntime(WorkerOptions options);

  // The wedge watch's thread: every tick, whether the engine is wedged (drives health in every
  // mode).
  void WatchLoop();
  // Health = serving unless draining, not yet registered, or wedged.
  void UpdateHealth();
  // The router link for options_.router_address (set), reporting this node's load and KV events.
  absl::StatusOr<std::unique_ptr<RouterLink>> NewRouterLink();
  // What this node registers with the router (valid once the server is bound).
  internal::v1::WorkerInfo RegistrationInfo() const;

  WorkerOptions options_;
  uint64_t incarnation_ = 0;
  std::unique_ptr<engine::Model> model_;
  // --device cuda/auto: the engine's forward backend (declared before engine_: outlives it).
  std::unique_ptr<engine::ForwardBackend> backend_;
  std::string device_ = "cpu";  // where forward passes run: "cpu" or "cuda"
  std::unique_ptr<engine::ModelAssets> assets_;
  std::unique_ptr<kv_transfer::TransferAgent> agent_;
  std::unique_ptr<engine::LlmEngine> engine_;
  internal::v1::KvPoolLayout pool_layout_;
  internal::v1::KvPeerMetadata kv_metadata_;
  std::unique_ptr<WorkerAdminService> admin_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<Metrics> metrics_;  // set in Start when metrics_listen is
  StatsContributor contribute_stats_;

  std::atomic<bool> draining_{false};
  // RunUntilSignal is blocked in WaitForShutdownSignal (Drain then wakes it).
  std::atomic<bool> waiting_for_signal_{false};
  // Serialises Drain calls (held for the whole drain).
  absl::Mutex drain_mu_;
  mutable absl::Mutex mu_;
  int active_requests_ ABSL_GUARDED_BY(mu_) = 0;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_watch_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool wedged_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watch_thread_;
  // Set in Start when router_address is; stopped (deregistering) in Drain, before the watch.
  std::unique_ptr<RouterLink> link_;
};

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_WORKER_RUNTIME_H_
