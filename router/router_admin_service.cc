#include "router/router_admin_service.h"

#include <utility>

namespace deepinfer::router {

internal::v1::GetPlanResponse PlanToProto(const std::vector<AutoscalePoolStatus>& pools,
                                          int64_t ticks, const std::string& scaler) {
  internal::v1::GetPlanResponse out;
  out.set_scaler(scaler);
  out.set_ticks(static_cast<uint64_t>(ticks));
  for (const AutoscalePoolStatus& st : pools) {
    internal::v1::PoolPlan* p = out.add_pools();
    p->set_pool(PoolRole(st.pool));
    p->set_planned(st.planned);
    p->set_desired_replicas(static_cast<uint32_t>(st.desired));
    p->set_live_replicas(static_cast<uint32_t>(st.live_replicas));
    p->set_scaler_replicas(st.scaler_replicas.value_or(-1));
    p->set_min_replicas(static_cast<uint32_t>(st.config.min_replicas));
    p->set_max_replicas(static_cast<uint32_t>(st.config.max_replicas));
    internal::v1::PoolSampleInputs* s = p->mutable_last_sample();
    const PoolSample& in = st.last_sample;
    s->set_current_replicas(static_cast<uint32_t>(in.current_replicas));
    s->set_queue_depth(static_cast<uint64_t>(in.queue_depth));
    s->set_queued_input_tokens(static_cast<uint64_t>(in.queued_input_tokens));
    s->set_input_tokens_per_second(in.input_tokens_per_second);
    s->set_running_sequences(static_cast<uint64_t>(in.running_sequences));
    s->set_kv_used_fraction(in.kv_used_fraction);
    s->set_replica_prefill_tokens_per_second(in.replica_prefill_tokens_per_second);
    s->set_replica_decode_sequences(in.replica_decode_sequences);
    if (st.sampled_at != absl::InfinitePast()) {
      s->set_sampled_at_unix_ms(absl::ToUnixMillis(st.sampled_at));
    }
    p->set_need(st.planner.need);
    p->set_replica_capacity(st.planner.replica_capacity);
    p->set_reason(st.planner.reason);
    p->set_scale_ups(static_cast<uint64_t>(st.planner.scale_ups));
    p->set_scale_downs(static_cast<uint64_t>(st.planner.scale_downs));
    p->set_scaler_calls(static_cast<uint64_t>(st.scaler_calls));
    p->set_scaler_errors(static_cast<uint64_t>(st.scaler_errors));
    p->set_last_scaler_error(st.last_scaler_error);
  }
  return out;
}

grpc::Status RouterAdminService::GetPlan(grpc::ServerContext* /*context*/,
                                         const internal::v1::GetPlanRequest* /*request*/,
                                         internal::v1::GetPlanResponse* response) {
  if (autoscaler_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "autoscaling is off: start the router with --autoscale");
  }
  *response = PlanToProto(autoscaler_->Status(), autoscaler_->ticks(), scaler_);
  return grpc::Status::OK;
}

}  // namespace deepinfer::router
