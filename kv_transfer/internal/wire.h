// Wire formats private to kv_transfer: the peer metadata blob and the notification message.
//
// Both are little-endian, length-prefixed, start with a magic and a version, and are decoded with
// full bounds checks: a truncated or foreign blob gives kInvalidArgument, a blob of another
// version gives kFailedPrecondition.
#ifndef DEEPINFER_KV_TRANSFER_INTERNAL_WIRE_H_
#define DEEPINFER_KV_TRANSFER_INTERNAL_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer::internal {

inline constexpr uint32_t kMetadataVersion = 1;
inline constexpr uint32_t kNotificationVersion = 1;

struct RegionMetadata {
  RegionId id = 0;
  uint64_t base = 0;  // address in the owner's address space
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  std::string remote_key;  // backend-specific (packed UCX rkey)
};

struct PeerMetadata {
  std::string name;
  uint64_t incarnation = 0;
  Backend backend = Backend::kUcx;
  std::string address;  // backend-specific (UCX worker address)
  std::vector<RegionMetadata> regions;
};

std::string EncodeMetadata(const PeerMetadata& metadata);
absl::StatusOr<PeerMetadata> DecodeMetadata(absl::string_view blob);

// Appends the encoded notification (with the sender's identity) to `out` after clearing it.
void EncodeNotification(const Notification& notification, absl::string_view sender,
                        uint64_t sender_incarnation, std::string* out);
absl::StatusOr<Notification> DecodeNotification(absl::string_view bytes);

}  // namespace deepinfer::kv_transfer::internal

#endif  // DEEPINFER_KV_TRANSFER_INTERNAL_WIRE_H_
