// A settable clock for tests (STYLE.md 9): components take `std::function<absl::Time()>` and
// tests pass AsFunction(), then Advance() time explicitly.
//
// Thread-safety: all methods are thread-safe. The function from AsFunction() refers to this
// object, which must outlive it.
#ifndef DEEPINFER_COMMON_FAKE_CLOCK_H_
#define DEEPINFER_COMMON_FAKE_CLOCK_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace deepinfer {

class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  std::function<absl::Time()> AsFunction() {
    return [this] { return Now(); };
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'700'000'000);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_FAKE_CLOCK_H_
