// The byte-moving half of an agent. AgentCore (agent_core.h) keeps all bookkeeping (ids,
// validation, pinning, incarnations, deadlines, counters); a Transport only registers memory,
// connects to peers and moves segments. One Transport per agent.
//
// Locking rule that keeps the two halves deadlock-free: AgentCore never holds its mutex while
// calling RegisterMemory, Connect, UnpackRemoteKey or PostBatch (those may take backend locks that
// completion callbacks hold while calling back into the core). DeregisterMemory, Disconnect and
// AbortLink may be called with the core's mutex held: they only queue work and never call back
// synchronously.
#ifndef DEEPINFER_KV_TRANSFER_INTERNAL_TRANSPORT_H_
#define DEEPINFER_KV_TRANSFER_INTERNAL_TRANSPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer::internal {

// Implemented by AgentCore; called by the transport from any thread, never with transport locks
// held that PostBatch also takes.
class TransportCallbacks {
 public:
  virtual ~TransportCallbacks() = default;
  // Called exactly once for every PostBatch that returned OK, possibly before PostBatch returns.
  virtual void OnPostComplete(void* post_context, absl::Status status) = 0;
  // Called after the post's data is visible at the target, before its notification is sent.
  // False means "do not send it" (the post was cancelled or is past its deadline).
  virtual bool ShouldNotify(void* post_context) = 0;
  virtual void OnNotification(absl::string_view bytes) = 0;
  // The link to the peer failed (endpoint error); `link_cookie` is what Connect was given.
  virtual void OnLinkError(uint64_t link_cookie, absl::Status status) = 0;
};

// One contiguous transfer. `local_memory` is what RegisterMemory returned for the local region,
// `remote_key` what UnpackRemoteKey returned for the remote one.
struct Segment {
  void* local_addr = nullptr;
  void* local_memory = nullptr;
  uint64_t remote_addr = 0;
  void* remote_key = nullptr;
  uint64_t length = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual void SetCallbacks(TransportCallbacks* callbacks) = 0;
  virtual absl::Status SupportsMemoryKind(MemoryKind kind) const = 0;
  virtual absl::Status Start() = 0;
  // Stops progress; in-flight posts complete with kCancelled. Idempotent.
  virtual void Stop() = 0;
  virtual std::string LocalAddress() const = 0;

  // Registers memory; fills `packed_key` with what a peer needs to access it. Returns an opaque
  // token for Segment::local_memory and DeregisterMemory.
  virtual absl::StatusOr<void*> RegisterMemory(void* base, size_t length, MemoryKind kind,
                                               std::string* packed_key) = 0;
  // Like RegisterMemory, but the transport allocates the `length` bytes itself (in the way its
  // peers reach fastest) and stores their address in `*base`. DeregisterMemory frees them; so does
  // destroying the transport.
  virtual absl::StatusOr<void*> AllocateMemory(size_t length, MemoryKind kind, void** base,
                                               std::string* packed_key) = 0;
  virtual void DeregisterMemory(void* memory) = 0;

  // Connects to the peer at `address` (from its metadata). Returns an opaque link.
  virtual absl::StatusOr<void*> Connect(absl::string_view address, uint64_t link_cookie) = 0;
  // Remote keys belong to their link and are released with it.
  virtual absl::StatusOr<void*> UnpackRemoteKey(void* link, absl::string_view packed_key,
                                                uint64_t remote_base, uint64_t remote_length) = 0;
  // Releases the link and its remote keys once nothing uses them (the core guarantees no post is
  // in flight on it).
  virtual void Disconnect(void* link) = 0;
  // Tears the link down now: in-flight posts on it complete with an error soon after.
  virtual void AbortLink(void* link) = 0;

  // Moves all segments, makes them visible at the target, then sends `notification` (if not
  // empty and ShouldNotify agrees) and calls OnPostComplete. `segments` and `notification` stay
  // valid (owned by the core) until OnPostComplete. A non-OK return means nothing was
  // started and OnPostComplete will not be called.
  virtual absl::Status PostBatch(void* link, TransferOp op, absl::Span<const Segment> segments,
                                 absl::string_view notification, void* post_context) = 0;

  virtual int64_t RequestsInFlight() const = 0;
};

}  // namespace deepinfer::kv_transfer::internal

#endif  // DEEPINFER_KV_TRANSFER_INTERNAL_TRANSPORT_H_
