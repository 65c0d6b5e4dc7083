#include "kv_transfer/notification_tracker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer::kv_transfer {

absl::Status NotificationTracker::CheckTotal(uint64_t request_id, const Pending& p,
                                             uint32_t total) const {
  if (p.total != 0 && total != 0 && p.total != total) {
    return absl::InvalidArgumentError(absl::StrCat("request ", request_id, ": expected ",
                                                   p.total, " parts, found total ", total));
  }
  for (const Notification& n : p.parts) {
    if (total != 0 && n.seq >= total) {
      return absl::InvalidArgumentError(absl::StrCat("request ", request_id, ": expected parts < ",
                                                     total, ", found part ", n.seq));
    }
  }
  return absl::OkStatus();
}

absl::Status NotificationTracker::Expect(uint64_t request_id, uint32_t total) {
  if (total == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expect: request ", request_id, " expected total > 0, found 0"));
  }
  Pending& p = pending_[request_id];
  if (absl::Status s = CheckTotal(request_id, p, total); !s.ok()) return s;
  p.total = total;
  return absl::OkStatus();
}

absl::StatusOr<bool> NotificationTracker::Add(Notification n, Completed* done) {
  const uint64_t id = n.request_id;
  Pending& p = pending_[id];
  if (absl::Status s = CheckTotal(id, p, n.total); !s.ok()) return s;
  const uint32_t total = p.total != 0 ? p.total : n.total;
  if (total != 0 && n.seq >= total) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": expected part < ", total, ", found part ", n.seq));
  }
  for (const Notification& seen : p.parts) {
    if (seen.seq == n.seq) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": part ", n.seq, " arrived twice"));
    }
  }
  p.total = total;
  p.parts.push_back(std::move(n));
  if (p.total == 0 || p.parts.size() < p.total) return false;
  done->request_id = id;
  done->parts = std::move(p.parts);
  std::sort(done->parts.begin(), done->parts.end(),
            [](const Notification& a, const Notification& b) { return a.seq < b.seq; });
  pending_.erase(id);
  return true;
}

}  // namespace deepinfer::kv_transfer
