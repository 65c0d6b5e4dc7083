// Receiver-side helper for layer-wise streaming: tells when every part of a request has landed.
//
// The sender posts each layer (or chunk) with Notification{request_id, seq = part, total = N}.
// The receiver feeds every drained notification to Add(); Add reports the request complete once
// parts 0..N-1 have all arrived (in any order). Senders that do not know N up front send total = 0
// and the receiver states it with Expect().
//
// Thread-safety: not thread-safe; owned by one receiving loop.
#ifndef DEEPINFER_KV_TRANSFER_NOTIFICATION_TRACKER_H_
#define DEEPINFER_KV_TRANSFER_NOTIFICATION_TRACKER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer {

class NotificationTracker {
 public:
  struct Completed {
    uint64_t request_id = 0;
    std::vector<Notification> parts;  // ordered by seq
  };

  // Declares that `request_id` has `total` parts (> 0). kInvalidArgument if parts already seen
  // say otherwise.
  absl::Status Expect(uint64_t request_id, uint32_t total);

  // Records one part. Returns true and fills `*done` (then forgets the request) when the request is
  // complete. kInvalidArgument for a duplicate part, seq >= total, or a total that disagrees with
  // earlier parts.
  absl::StatusOr<bool> Add(Notification notification, Completed* done);

  // Drops what is known about `request_id` (e.g. the request was cancelled).
  void Forget(uint64_t request_id) { pending_.erase(request_id); }
  size_t pending_requests() const { return pending_.size(); }

 private:
  struct Pending {
    uint32_t total = 0;  // 0 until known
    std::vector<Notification> parts;
  };
  absl::Status CheckTotal(uint64_t request_id, const Pending& p, uint32_t total) const;

  absl::flat_hash_map<uint64_t, Pending> pending_;
};

}  // namespace deepinfer::kv_transfer

#endif  // DEEPINFER_KV_TRANSFER_NOTIFICATION_TRACKER_H_
