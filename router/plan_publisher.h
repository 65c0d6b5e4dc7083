// PlanPublisher: the Scaler (router/scaler.h) of a router run with --scaler=external. It starts
// and stops nothing: it records the replica count asked for each pool, and an outside supervisor
// (deploy/local/supervisor.h) reads the plan through RouterAdmin.GetPlan and applies it.
//
// GetReplicas returns the count last published for the pool, or 0 before the first SetReplicas
// (nothing has been asked yet), so the autoscaler publishes its first plan at once.
//
// Thread-safety: every method is thread-safe.
#ifndef DEEPINFER_ROUTER_PLAN_PUBLISHER_H_
#define DEEPINFER_ROUTER_PLAN_PUBLISHER_H_

#include <array>
#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/planner.h"
#include "router/scaler.h"

namespace deepinfer::router {

class PlanPublisher : public Scaler {
 public:
  struct Published {
    int replicas = 0;
    absl::Time at;
    // 1 for the pool's first publication, +1 for each later one.
    int64_t version = 0;
  };

  PlanPublisher() = default;
  PlanPublisher(const PlanPublisher&) = delete;
  PlanPublisher& operator=(const PlanPublisher&) = delete;

  // Scaler. SetReplicas: kInvalidArgument for replicas < 0.
  absl::StatusOr<int> GetReplicas(Pool pool) override;
  absl::Status SetReplicas(Pool pool, int replicas) override;

  // The pool's last publication; nullopt before the first.
  std::optional<Published> Get(Pool pool) const;

 private:
  mutable absl::Mutex mu_;
  std::array<std::optional<Published>, 3> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_PLAN_PUBLISHER_H_
