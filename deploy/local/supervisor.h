// The local supervisor: the process-level scaler of a local cluster whose router runs with
// `--autoscale --scaler=external`. Every interval it reads the router's plan
// (RouterAdmin.GetPlan, proto/deepinfer/internal/v1/router_admin.proto) and starts or drains
// workers (ClusterControl, deploy/local/cluster_control.h) so that each pool runs the planned
// count:
//
//   target  = the pool's desired_replicas clamped to the supervisor's own [min, max] for the
//             pool; pools the plan does not cover yet (planned = false) are left alone;
//   running = the pool's workers that are running (exited ones do not count);
//   running < target: AddWorker until they match (each waits until the worker serves);
//   running > target: RemoveWorker on the surplus, chosen least busy first (WorkerAdmin.GetStats:
//             active requests + running, waiting, awaiting-KV and held sequences; a worker whose
//             stats cannot be read counts as busiest), ties to the newest; each is drained with
//             SIGTERM and gets Options::drain_grace before SIGKILL.
// Pools are handled prefill first, then decode. A failed GetPlan or cluster call is logged and
// counted, and the next pass tries again.
//
// Children belong to the thread that started them (common/subprocess.h: a child is killed when
// that thread exits). Workers the supervisor adds are started on its thread, so stop the cluster
// before the supervisor when they should drain rather than be killed.
//
// Thread-safety: every method is thread-safe; Step() calls are serialised.
#ifndef DEEPINFER_DEPLOY_LOCAL_SUPERVISOR_H_
#define DEEPINFER_DEPLOY_LOCAL_SUPERVISOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "deploy/local/cluster_control.h"
#include "proto/deepinfer/internal/v1/router_admin.grpc.pb.h"
#include "proto/deepinfer/internal/v1/router_admin.pb.h"

namespace deepinfer::deploy {

// Where the plan comes from.
class PlanSource {
 public:
  virtual ~PlanSource() = default;
  virtual absl::StatusOr<internal::v1::GetPlanResponse> GetPlan() = 0;
};

// RouterAdmin.GetPlan on a router, each call with deadline `timeout`.
class RouterPlanSource : public PlanSource {
 public:
  RouterPlanSource(const std::string& router_address, absl::Duration timeout);
  absl::StatusOr<internal::v1::GetPlanResponse> GetPlan() override;

 private:
  const std::unique_ptr<internal::v1::RouterAdmin::Stub> stub_;
  const absl::Duration timeout_;
};

struct SupervisorOptions {
  struct Bounds {
    int min_replicas = 1;
    int max_replicas = 4;
  };
  // The supervisor's own limits per pool; min >= 0 (decode >= 1), max >= min.
  Bounds prefill;
  Bounds decode;
  // How often Start()'s thread runs Step(); > 0.
  absl::Duration interval = absl::Seconds(1);
  // How long a removed worker may drain before SIGKILL; >= 0.
  absl::Duration drain_grace = absl::Seconds(30);
  // Deadline of each WorkerAdmin.GetStats when choosing whom to remove; > 0.
  absl::Duration stats_timeout = absl::Seconds(2);
};

// What one Step did.
struct SupervisorStep {
  std::vector<std::string> added;    // worker names
  std::vector<std::string> removed;  // worker names
};

class Supervisor {
 public:
  // `plans` and `cluster` are not owned and must outlive the supervisor. kInvalidArgument
  // naming the field for invalid options or null pointers.
  static absl::StatusOr<std::unique_ptr<Supervisor>> Create(PlanSource* plans,
                                                            ClusterControl* cluster,
                                                            SupervisorOptions options);

  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor();

  // Runs Step() every interval on a background thread, the first at once (once; later calls do
  // nothing). Stop() ends it after the step in progress (idempotent).
  void Start();
  void Stop();

  // One pass (file comment). Errors: GetPlan's status; otherwise the first failed cluster call
  // (the pass still handles the remaining pools). What was done before an error is in `done`
  // when non-null.
  absl::Status Step(SupervisorStep* done = nullptr);

  // Passes, workers added / removed, and failed passes since creation; the last failure.
  int64_t steps() const;
  int64_t added() const;
  int64_t removed() const;
  int64_t errors() const;
  std::string last_error() const;

 private:
  Supervisor(PlanSource* plans, ClusterControl* cluster, SupervisorOptions options)
      : plans_(plans), cluster_(cluster), options_(options) {}
  absl::Status Follow(ClusterRole role, const internal::v1::PoolPlan& plan, SupervisorStep& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  void Loop();

  PlanSource* const plans_;
  ClusterControl* const cluster_;
  const SupervisorOptions options_;

  absl::Mutex step_mu_;  // serialises Step
  mutable absl::Mutex mu_;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t added_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t removed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);

  absl::Mutex loop_mu_;
  bool stop_ ABSL_GUARDED_BY(loop_mu_) = false;
  absl::Mutex start_mu_;  // serialises Start/Stop
  std::thread thread_ ABSL_GUARDED_BY(start_mu_);
};

}  // namespace deepinfer::deploy

#endif  // DEEPINFER_DEPLOY_LOCAL_SUPERVISOR_H_
