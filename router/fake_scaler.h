// FakeScaler: an in-memory Scaler (router/scaler.h) for tests of whatever drives a Scaler.
// Pools are added with their initial count; SetReplicas changes the count and records the call;
// FailNext injects errors (the next N calls for a pool return a given status and change
// nothing), so callers' error handling can be tested.
//
// Thread-safety: every method is thread-safe.
#ifndef DEEPINFER_ROUTER_FAKE_SCALER_H_
#define DEEPINFER_ROUTER_FAKE_SCALER_H_

#include <array>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/planner.h"
#include "router/scaler.h"

namespace deepinfer::router {

class FakeScaler : public Scaler {
 public:
  struct SetCall {
    Pool pool;
    int replicas;
    bool operator==(const SetCall& other) const {
      return pool == other.pool && replicas == other.replicas;
    }
  };

  FakeScaler() = default;
  FakeScaler(const FakeScaler&) = delete;
  FakeScaler& operator=(const FakeScaler&) = delete;

  // Configures `pool` with `replicas` (>= 0) replicas; replaces an earlier configuration.
  void AddPool(Pool pool, int replicas);

  // The next `count` GetReplicas/SetReplicas calls for `pool` return `status` (not OK) and
  // change nothing.
  void FailNext(Pool pool, absl::Status status, int count = 1);

  // Scaler. kNotFound for a pool not added, kInvalidArgument for replicas < 0, injected errors.
  absl::StatusOr<int> GetReplicas(Pool pool) override;
  absl::Status SetReplicas(Pool pool, int replicas) override;

  // Successful SetReplicas calls, in order.
  std::vector<SetCall> set_calls() const;

 private:
  struct PoolEntry {
    int replicas = 0;
    absl::Status fail_status;
    int fail_count = 0;
  };

  // The pool's entry, or kNotFound; consumes one injected failure.
  absl::StatusOr<PoolEntry*> Use(Pool pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::array<std::optional<PoolEntry>, 3> pools_ ABSL_GUARDED_BY(mu_);
  std::vector<SetCall> set_calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_FAKE_SCALER_H_
