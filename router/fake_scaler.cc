#include "router/fake_scaler.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer::router {

void FakeScaler::AddPool(Pool pool, int replicas) {
  absl::MutexLock lock(&mu_);
  pools_[static_cast<int>(pool)] = PoolEntry{replicas, absl::OkStatus(), 0};
}

void FakeScaler::FailNext(Pool pool, absl::Status status, int count) {
  absl::MutexLock lock(&mu_);
  std::optional<PoolEntry>& entry = pools_[static_cast<int>(pool)];
  if (!entry.has_value()) entry = PoolEntry{};
  entry->fail_status = std::move(status);
  entry->fail_count = count;
}

absl::StatusOr<FakeScaler::PoolEntry*> FakeScaler::Use(Pool pool) {
  std::optional<PoolEntry>& entry = pools_[static_cast<int>(pool)];
  if (!entry.has_value()) {
    return absl::NotFoundError(
        absl::StrCat("fake scaler: pool ", PoolName(pool), ": no scaled object configured"));
  }
  if (entry->fail_count > 0) {
    --entry->fail_count;
    return entry->fail_status;
  }
  return &*entry;
}

absl::StatusOr<int> FakeScaler::GetReplicas(Pool pool) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<PoolEntry*> entry = Use(pool);
  if (!entry.ok()) return entry.status();
  return (*entry)->replicas;
}

absl::Status FakeScaler::SetReplicas(Pool pool, int replicas) {
  absl::MutexLock lock(&mu_);
  if (replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("fake scaler: pool ", PoolName(pool),
                                                   ": replicas: expected >= 0, got ", replicas));
  }
  absl::StatusOr<PoolEntry*> entry = Use(pool);
  if (!entry.ok()) return entry.status();
  (*entry)->replicas = replicas;
  set_calls_.push_back({pool, replicas});
  return absl::OkStatus();
}

std::vector<FakeScaler::SetCall> FakeScaler::set_calls() const {
  absl::MutexLock lock(&mu_);
  return set_calls_;
}

}  // namespace deepinfer::router
