// The router's autoscaling flags (--autoscale, --scaler, the Kubernetes targets and the
// planner's PoolConfig knobs) and what they build: a Scaler and an Autoscaler over the router's
// WorkerRegistry. Kept out of router/main.cc so the binary only wires the result.
//
//   --autoscale --scaler=k8s       K8sScaler, in-cluster config; --k8s_namespace (default: the
//                                  pod's), --prefill_deployment / --decode_deployment /
//                                  --encoder_deployment name the scaled Deployments.
//   --autoscale --scaler=external  PlanPublisher: the router computes and publishes the plan
//                                  (RouterAdmin.GetPlan), an outside supervisor applies it.
// Planner knobs (router/planner.h PoolConfig): per pool --<pool>_min_replicas,
// --<pool>_max_replicas, --<pool>_initial_replica_capacity; shared --target_utilization,
// --hysteresis, --smoothing, --scale_up_cooldown, --scale_down_cooldown, --backlog_drain_time,
// and --autoscale_interval (PoolConfig::interval and the autoscaler's pass interval).
#ifndef DEEPINFER_ROUTER_AUTOSCALE_FLAGS_H_
#define DEEPINFER_ROUTER_AUTOSCALE_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "router/autoscaler.h"
#include "router/scaler.h"
#include "router/worker_registry.h"

namespace deepinfer::router {

struct AutoscaleSetup {
  // "k8s" or "external"; empty with everything null when --autoscale is off.
  std::string scaler_name;
  std::unique_ptr<Scaler> scaler;
  // Not started; built over `scaler`, so destroy it first.
  std::unique_ptr<Autoscaler> autoscaler;
};

// Builds the setup from the flags. kInvalidArgument naming the flag ("--scaler: expected k8s or
// external; got \"x\"", "--prefill_max_replicas: ..."); the K8sScaler's own errors
// (kFailedPrecondition outside a cluster).
absl::StatusOr<AutoscaleSetup> AutoscaleFromFlags(const WorkerRegistry* registry);

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_AUTOSCALE_FLAGS_H_
