// ClusterControl: what a process supervisor needs from a running cluster (list the workers, add
// one, drain one away, read one's stats). LocalCluster (deploy/local/local_cluster.h) implements
// it with real processes; tests of the supervisor (deploy/local/supervisor.h) use a fake.
//
// Worker indexes are positions in workers(), oldest first: AddWorker appends, RemoveWorker
// shifts the later ones down.
//
// Thread-safety: implementations' methods are thread-safe.
#ifndef DEEPINFER_DEPLOY_LOCAL_CLUSTER_CONTROL_H_
#define DEEPINFER_DEPLOY_LOCAL_CLUSTER_CONTROL_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer::deploy {

enum class ClusterRole { kRouter, kPrefill, kDecode, kEncoder };

// "router", "prefill", "decode", "encoder".
const char* ClusterRoleName(ClusterRole role);

// One process of the cluster, as workers() and router() report it.
struct ClusterProcessInfo {
  std::string name;  // "router", "prefill-0", ...; also the worker id of workers.
  ClusterRole role = ClusterRole::kRouter;
  std::string address;  // "127.0.0.1:port" it serves on.
  pid_t pid = 0;
  bool running = false;
  std::string log_path;
  std::optional<ExitStatus> exit_status;  // Once it has exited.
};

class ClusterControl {
 public:
  virtual ~ClusterControl() = default;

  // Every worker, oldest first.
  virtual std::vector<ClusterProcessInfo> workers() const = 0;
  // Starts one more worker of `role` (kPrefill or kDecode), waits until it serves and returns
  // its index.
  virtual absl::StatusOr<int> AddWorker(ClusterRole role) = 0;
  // Drains worker `index` (SIGTERM, up to `grace`, then SIGKILL) and removes it from workers().
  virtual absl::StatusOr<ExitStatus> RemoveWorker(int index, absl::Duration grace) = 0;
  // WorkerAdmin.GetStats of worker `index`, with deadline `timeout`.
  virtual absl::StatusOr<internal::v1::WorkerStats> GetStats(int index, absl::Duration timeout) = 0;
};

}  // namespace deepinfer::deploy

#endif  // DEEPINFER_DEPLOY_LOCAL_CLUSTER_CONTROL_H_
