// A whole deepinfer cluster on one machine: the router, prefill nodes, decode nodes and vision
// encoder nodes as child processes, for the local launcher (//deploy/local:launcher), the demo and cross-process tests.
//
// Start() launches the router first (listening on `router_listen`, port 0 by default), reads the
// port it wrote to its --port_file, then launches every worker with --router pointing there,
// waits for all port files and finally for grpc.health.v1 Check == SERVING on every process
// (workers turn SERVING only once registered with the router). Each process writes its stdout
// and stderr to <log_dir>/<name>.log; names are "router", "prefill-0", "decode-0", ... and double
// as worker ids. If a process exits during start-up, Start fails with its name, how it ended
// and the tail of its log, and stops everything it had started.
//
// Worker indexes are positions in workers(): RemoveWorker shifts the later ones down.
//
// Thread-safety: all methods are thread-safe. Start children from a long-lived thread (see
// common/subprocess.h: a child is killed when the thread that started it exits). Not copyable
// or movable; the destructor calls Stop.
#ifndef DEEPINFER_DEPLOY_LOCAL_LOCAL_CLUSTER_H_
#define DEEPINFER_DEPLOY_LOCAL_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "deploy/local/cluster_control.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace deepinfer::deploy {

struct LocalClusterConfig {
  // Directory holding router/router, prefill_node/prefill_node, decode_node/decode_node (and
  // vision_encoder/vision_encoder when num_encoders > 0): the
  // runfiles root (".") in Bazel tests, <launcher>.runfiles/__main__ under `bazel run`.
  std::string bin_dir = ".";
  // Hugging Face model directory passed as --model to every process. Required.
  std::string model_dir;
  int num_prefill = 1;
  // At least 1.
  int num_decode = 1;
  // Vision encoder nodes (//vision_encoder), for LLaVA-style models; 0 = none.
  int num_encoders = 0;
  // Decode nodes also prefill locally (--can_prefill); with it num_prefill may be 0.
  bool decode_can_prefill = false;
  // Per worker; 0 leaves the binary's default (the flag is not passed).
  int kv_blocks = 0;
  int block_size = 0;
  int threads_per_worker = 0;
  // Where <name>.log and <name>.port go; created if missing. Required.
  std::string log_dir;
  // The router's --listen. Port 0 picks a free one (tests); the launcher uses 127.0.0.1:50051.
  std::string router_listen = "127.0.0.1:0";
  std::string log_level = "info";
  // Appended to each role's command line (e.g. "--heartbeat_interval=200ms"). A router on a
  // loopback router_listen also gets --allow_anonymous unless router_flags name
  // --tenants_file or --[no]allow_anonymous (router/tenants.h).
  std::vector<std::string> router_flags;
  std::vector<std::string> prefill_flags;
  std::vector<std::string> decode_flags;
  std::vector<std::string> encoder_flags;
  // CPU placement (SubprocessOptions::cpus) from each process's start: decode nodes on
  // decode_cpus, every other process (router, prefill nodes, encoders) on other_cpus; empty:
  // inherited. As decode nodes run on machines of their own in a deployment: a decode node's
  // start-up profile of its forward passes (the adaptive speculation's cost table) then times
  // its own cores, not the cluster's other processes starting beside it.
  std::vector<int> decode_cpus;
  std::vector<int> other_cpus;
  // Extra environment for every process. UCX_TLS=sm,self is added unless set here or in the
  // caller's environment (processes on one host move KV over shared memory).
  std::vector<std::pair<std::string, std::string>> env;
  // Longest wait for one process (router, or a worker batch) to become SERVING.
  absl::Duration startup_timeout = absl::Seconds(120);
};

// The command lines Start uses, exposed for tests and for printing. `port_file` is where the
// process writes its port.
std::vector<std::string> RouterCommandLine(const LocalClusterConfig& config,
                                           const std::string& port_file);
std::vector<std::string> WorkerCommandLine(const LocalClusterConfig& config, ClusterRole role,
                                           const std::string& worker_id,
                                           const std::string& router_address,
                                           const std::string& port_file);
// Every process's environment additions: config.env plus the UCX_TLS default.
std::vector<std::pair<std::string, std::string>> ClusterEnvironment(
    const LocalClusterConfig& config);

class LocalCluster : public ClusterControl {
 public:
  // Validates `config` (kInvalidArgument naming the field), checks the three binaries exist
  // (kNotFound naming the path), starts everything and waits until all processes are SERVING.
  // kUnavailable when a process exits during start-up; kDeadlineExceeded when one is not
  // SERVING within startup_timeout. Both name the process and quote the tail of its log.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(LocalClusterConfig config);

  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;
  ~LocalCluster();

  const LocalClusterConfig& config() const { return config_; }
  // "127.0.0.1:port": the public Inference endpoint.
  const std::string& router_address() const { return router_address_; }
  ClusterProcessInfo router() const;
  std::vector<ClusterProcessInfo> workers() const override;
  // Index in workers() of the worker named `name`; kNotFound otherwise.
  absl::StatusOr<int> FindWorker(const std::string& name) const;

  // Sends `sig` to worker `index` (fault injection: SIGKILL, SIGSTOP, SIGTERM for a drain).
  // kOutOfRange for a bad index; kFailedPrecondition once it has exited.
  absl::Status Signal(int index, int sig);
  // Waits up to `timeout` for worker `index` to exit; kDeadlineExceeded if it does not.
  absl::StatusOr<ExitStatus> WaitExit(int index, absl::Duration timeout);

  // Starts one more worker of `role` (kPrefill, kDecode or kEncoder) with the next free id, waits until it
  // is SERVING and returns its index. Errors as in Start; a failed worker is not kept.
  absl::StatusOr<int> AddWorker(ClusterRole role) override;
  // SIGTERM (drain), up to `grace`, then SIGKILL; removes it from workers(). Returns how it
  // ended.
  absl::StatusOr<ExitStatus> RemoveWorker(int index,
                                          absl::Duration grace = absl::Seconds(30)) override;

  // WorkerAdmin.GetStats of worker `index`, with deadline `timeout`.
  absl::StatusOr<internal::v1::WorkerStats> GetStats(
      int index, absl::Duration timeout = absl::Seconds(5)) override;

  // SIGTERM to every worker, waits up to `grace` for them to drain, SIGKILLs the rest; then the
  // same for the router (it stays up while workers deregister). OK when every process exited
  // with code 0; kInternal listing the others. Idempotent.
  absl::Status Stop(absl::Duration grace = absl::Seconds(30));

 private:
  struct Process {
    ClusterProcessInfo Info() const;
    std::string name;
    ClusterRole role;
    std::string address;
    std::string log_path;
    std::string port_file;
    std::unique_ptr<Subprocess> subprocess;
    std::shared_ptr<grpc::Channel> channel;
  };

  explicit LocalCluster(LocalClusterConfig config) : config_(std::move(config)) {}

  // Starts one process (a worker is added to workers_ at once, so Stop covers it).
  absl::StatusOr<std::shared_ptr<Process>> Spawn(ClusterRole role, const std::string& name);
  // Waits for the process's port file and sets its address and channel.
  absl::Status AwaitPort(Process& process);
  // Waits until every process in `processes` is SERVING or one of them exits.
  absl::Status WaitServing(const std::vector<std::shared_ptr<Process>>& processes,
                           absl::Time deadline);
  absl::StatusOr<std::shared_ptr<Process>> WorkerAt(int index) const;
  std::string NextWorkerName(ClusterRole role);

  const LocalClusterConfig config_;
  std::string router_address_;  // Set once in Start.
  std::shared_ptr<Process> router_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Process>> workers_ ABSL_GUARDED_BY(mu_);
  int next_prefill_ ABSL_GUARDED_BY(mu_) = 0;
  int next_decode_ ABSL_GUARDED_BY(mu_) = 0;
  int next_encoder_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace deepinfer::deploy

#endif  // DEEPINFER_DEPLOY_LOCAL_LOCAL_CLUSTER_H_
