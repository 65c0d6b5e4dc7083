// The deepinfer.internal.v1.RouterAdmin gRPC service (proto/deepinfer/internal/v1/
// router_admin.proto): GetPlan reports the autoscaler's per-pool plan (router/autoscaler.h).
//
// Thread-safety: thread-safe; the autoscaler (not owned) must outlive the service.
#ifndef DEEPINFER_ROUTER_ROUTER_ADMIN_SERVICE_H_
#define DEEPINFER_ROUTER_ROUTER_ADMIN_SERVICE_H_

#include <string>
#include <vector>

#include "proto/deepinfer/internal/v1/router_admin.grpc.pb.h"
#include "proto/deepinfer/internal/v1/router_admin.pb.h"
#include "router/autoscaler.h"

namespace deepinfer::router {

// The GetPlan answer for `pools` (Autoscaler::Status()), after `ticks` passes, with scaler name
// `scaler`.
internal::v1::GetPlanResponse PlanToProto(const std::vector<AutoscalePoolStatus>& pools,
                                          int64_t ticks, const std::string& scaler);

class RouterAdminService final : public internal::v1::RouterAdmin::Service {
 public:
  // `autoscaler` null: the router runs without --autoscale and GetPlan says FAILED_PRECONDITION.
  RouterAdminService(const Autoscaler* autoscaler, std::string scaler)
      : autoscaler_(autoscaler), scaler_(std::move(scaler)) {}

  grpc::Status GetPlan(grpc::ServerContext* context, const internal::v1::GetPlanRequest* request,
                       internal::v1::GetPlanResponse* response) override;

 private:
  const Autoscaler* const autoscaler_;
  const std::string scaler_;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_ROUTER_ADMIN_SERVICE_H_
