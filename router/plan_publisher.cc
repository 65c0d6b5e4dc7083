#include "router/plan_publisher.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace deepinfer::router {

absl::StatusOr<int> PlanPublisher::GetReplicas(Pool pool) {
  absl::MutexLock lock(&mu_);
  const std::optional<Published>& p = published_[static_cast<int>(pool)];
  return p.has_value() ? p->replicas : 0;
}

absl::Status PlanPublisher::SetReplicas(Pool pool, int replicas) {
  if (replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("plan publisher: pool ", PoolName(pool),
                                                   ": replicas: expected >= 0, got ", replicas));
  }
  absl::MutexLock lock(&mu_);
  std::optional<Published>& p = published_[static_cast<int>(pool)];
  const int64_t version = p.has_value() ? p->version + 1 : 1;
  p = Published{replicas, absl::Now(), version};
  return absl::OkStatus();
}

std::optional<PlanPublisher::Published> PlanPublisher::Get(Pool pool) const {
  absl::MutexLock lock(&mu_);
  return published_[static_cast<int>(pool)];
}

}  // namespace deepinfer::router
