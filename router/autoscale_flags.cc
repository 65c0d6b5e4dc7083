#include "router/autoscale_flags.h"

#include <map>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "router/k8s_scaler.h"
#include "router/plan_publisher.h"

ABSL_FLAG(bool, autoscale, false,
          "Run the planner: size the prefill / decode (/ encoder) pools from their load and apply "
          "the plan through --scaler.");
ABSL_FLAG(std::string, scaler, "k8s",
          "k8s: scale Deployments through the Kubernetes API (in-cluster config); external: only "
          "publish the plan (RouterAdmin.GetPlan) for an outside supervisor.");
ABSL_FLAG(std::string, k8s_namespace, "",
          "--scaler=k8s: the Deployments' namespace; default: the pod's own.");
ABSL_FLAG(std::string, prefill_deployment, "deepinfer-prefill",
          "--scaler=k8s: the prefill pool's Deployment.");
ABSL_FLAG(std::string, decode_deployment, "deepinfer-decode",
          "--scaler=k8s: the decode pool's Deployment.");
ABSL_FLAG(std::string, encoder_deployment, "deepinfer-encoder",
          "--scaler=k8s: the encoder pool's Deployment (used only while encoder workers exist).");
ABSL_FLAG(absl::Duration, autoscale_interval, absl::Seconds(10),
          "How often the pools are sampled and their desired counts re-evaluated.");
ABSL_FLAG(int, prefill_min_replicas, 1, "Planner: fewest prefill replicas.");
ABSL_FLAG(int, prefill_max_replicas, 4, "Planner: most prefill replicas.");
ABSL_FLAG(double, prefill_initial_replica_capacity, 4000,
          "Planner: input tokens/s one prefill replica computes, until measured.");
ABSL_FLAG(int, decode_min_replicas, 1, "Planner: fewest decode replicas.");
ABSL_FLAG(int, decode_max_replicas, 4, "Planner: most decode replicas.");
ABSL_FLAG(double, decode_initial_replica_capacity, 64,
          "Planner: concurrent sequences one decode replica runs, until measured.");
ABSL_FLAG(int, encoder_min_replicas, 1, "Planner: fewest encoder replicas.");
ABSL_FLAG(int, encoder_max_replicas, 2, "Planner: most encoder replicas.");
ABSL_FLAG(double, encoder_initial_replica_capacity, 10,
          "Planner: images/s one encoder replica encodes, until measured.");
ABSL_FLAG(double, target_utilization, 0.8,
          "Planner: fraction of a replica's capacity to plan for; (0, 1].");
ABSL_FLAG(double, hysteresis, 0.1, "Planner: hysteresis band, a fraction of the count; [0, 1).");
ABSL_FLAG(absl::Duration, smoothing, absl::Seconds(30),
          "Planner: time constant of the load's moving average (0: last sample only).");
ABSL_FLAG(absl::Duration, scale_up_cooldown, absl::Seconds(30),
          "Planner: least time between a change and the next change up.");
ABSL_FLAG(absl::Duration, scale_down_cooldown, absl::Minutes(5),
          "Planner: least time between a change and the next change down.");
ABSL_FLAG(absl::Duration, backlog_drain_time, absl::Seconds(30),
          "Planner: queued work should be done within this on top of arrivals.");

namespace deepinfer::router {
namespace {

PoolConfig Config(int min_replicas, int max_replicas, double initial_capacity) {
  PoolConfig c;
  c.min_replicas = min_replicas;
  c.max_replicas = max_replicas;
  c.initial_replica_capacity = initial_capacity;
  c.target_utilization = absl::GetFlag(FLAGS_target_utilization);
  c.interval = absl::GetFlag(FLAGS_autoscale_interval);
  c.smoothing = absl::GetFlag(FLAGS_smoothing);
  c.hysteresis = absl::GetFlag(FLAGS_hysteresis);
  c.scale_up_cooldown = absl::GetFlag(FLAGS_scale_up_cooldown);
  c.scale_down_cooldown = absl::GetFlag(FLAGS_scale_down_cooldown);
  c.backlog_drain_time = absl::GetFlag(FLAGS_backlog_drain_time);
  return c;
}

// "pools[prefill].max_replicas: ..." -> "--prefill_max_replicas: ...", and the shared knobs
// "pools[decode].hysteresis: ..." -> "--hysteresis: ...".
absl::Status AsFlagError(const absl::Status& status) {
  absl::string_view message = status.message();
  for (absl::string_view pool : {"encoder", "prefill", "decode"}) {
    const std::string prefix = absl::StrCat("pools[", pool, "].");
    if (!absl::ConsumePrefix(&message, prefix)) continue;
    for (absl::string_view own : {"min_replicas", "max_replicas", "initial_replica_capacity"}) {
      if (absl::StartsWith(message, own)) {
        return absl::InvalidArgumentError(absl::StrCat("--", pool, "_", message));
      }
    }
    if (absl::StartsWith(message, "interval")) {
      return absl::InvalidArgumentError(absl::StrCat("--autoscale_", message));
    }
    return absl::InvalidArgumentError(absl::StrCat("--", message));
  }
  if (absl::StartsWith(message, "interval")) {
    return absl::InvalidArgumentError(absl::StrCat("--autoscale_", message));
  }
  return status;
}

}  // namespace

absl::StatusOr<AutoscaleSetup> AutoscaleFromFlags(const WorkerRegistry* registry) {
  AutoscaleSetup setup;
  if (!absl::GetFlag(FLAGS_autoscale)) return setup;
  const std::string scaler = absl::GetFlag(FLAGS_scaler);
  std::map<Pool, PoolConfig> pools = {
      {Pool::kEncoder,
       Config(absl::GetFlag(FLAGS_encoder_min_replicas), absl::GetFlag(FLAGS_encoder_max_replicas),
              absl::GetFlag(FLAGS_encoder_initial_replica_capacity))},
      {Pool::kPrefill,
       Config(absl::GetFlag(FLAGS_prefill_min_replicas), absl::GetFlag(FLAGS_prefill_max_replicas),
              absl::GetFlag(FLAGS_prefill_initial_replica_capacity))},
      {Pool::kDecode,
       Config(absl::GetFlag(FLAGS_decode_min_replicas), absl::GetFlag(FLAGS_decode_max_replicas),
              absl::GetFlag(FLAGS_decode_initial_replica_capacity))},
  };
  if (scaler == "external") {
    setup.scaler = std::make_unique<PlanPublisher>();
  } else if (scaler == "k8s") {
    K8sScalerOptions k8s;
    k8s.k8s_namespace = absl::GetFlag(FLAGS_k8s_namespace);
    k8s.deployments = {{Pool::kEncoder, absl::GetFlag(FLAGS_encoder_deployment)},
                       {Pool::kPrefill, absl::GetFlag(FLAGS_prefill_deployment)},
                       {Pool::kDecode, absl::GetFlag(FLAGS_decode_deployment)}};
    absl::StatusOr<std::unique_ptr<K8sScaler>> created = K8sScaler::Create(std::move(k8s));
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat("--scaler=k8s: ", created.status().message()));
    }
    setup.scaler = *std::move(created);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--scaler: expected k8s or external; got \"", scaler, "\""));
  }
  Autoscaler::Options options;
  options.pools = std::move(pools);
  options.interval = absl::GetFlag(FLAGS_autoscale_interval);
  absl::StatusOr<std::unique_ptr<Autoscaler>> autoscaler =
      Autoscaler::Create(registry, setup.scaler.get(), std::move(options));
  if (!autoscaler.ok()) return AsFlagError(autoscaler.status());
  setup.autoscaler = *std::move(autoscaler);
  setup.scaler_name = scaler;
  return setup;
}

}  // namespace deepinfer::router
