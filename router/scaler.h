// A Scaler applies replica counts to the worker pools: the planner (router/planner.h) decides how
// many replicas each pool should have, a Scaler makes it so. Implementations: K8sScaler
// (router/k8s_scaler.h, the Kubernetes scale subresource of one Deployment per pool) and
// FakeScaler (router/fake_scaler.h, in memory, for tests); a local process supervisor is
// another.
//
// Errors (every message names the pool and the scaled object):
//   kNotFound          the pool has no scaled object configured, or the object does not exist;
//   kInvalidArgument   a negative replica count;
//   kPermissionDenied  the scaler's identity may not read or change the object;
//   kAborted           a conflicting concurrent change (retry with fresh state);
//   kUnavailable       the control plane is unreachable or failing (retry later);
//   kDeadlineExceeded  the control plane did not answer in time.
//
// Thread-safety: implementations' methods are thread-safe.
#ifndef DEEPINFER_ROUTER_SCALER_H_
#define DEEPINFER_ROUTER_SCALER_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "router/planner.h"

namespace deepinfer::router {

class Scaler {
 public:
  virtual ~Scaler() = default;

  // The replica count the pool is currently asked to run (Kubernetes: the Deployment's
  // spec.replicas), which may differ from the replicas live right now (the worker registry
  // knows those).
  virtual absl::StatusOr<int> GetReplicas(Pool pool) = 0;

  // Asks the pool to run `replicas` (>= 0) replicas. Returns once the request is recorded, not
  // once the replicas run.
  virtual absl::Status SetReplicas(Pool pool, int replicas) = 0;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_SCALER_H_
