// KV-cache block transfer between nodes (DESIGN.md "KV transfer"): the TransferAgent interface.
//
// A prefill node writes KV blocks straight into a decode node's registered memory; this library
// moves the bytes. It knows nothing of gRPC or of the model. The shape follows STYLE.md 4:
// register memory once, prepare descriptor lists once, then post batches by descriptor index.
//
//   // both sides
//   auto agent = CreateTransferAgent(config).value();    // agent_factory.h
//   agent->Start();
//   RegionId pool = agent->RegisterMemory(base, bytes, MemoryKind::kHost).value();
//   // or, for a pool peers write into (faster over shared memory): AllocateMemory(bytes, kind)
//   std::string blob = agent->ExportMetadata().value();  // send over the control channel
//   // prefill side, after receiving the decode node's blob
//   std::string peer = agent->ImportPeer(decode_blob).value();
//   DescListId src = agent->PrepareLocalDescriptors(local_blocks).value();
//   DescListId dst = agent->PrepareRemoteDescriptors(peer, remote_blocks).value();
//   HandleId h = agent->CreateHandle(src, dst).value();
//   agent->Post(h, TransferOp::kWrite, {0, 1, 2}, {7, 8, 9}, &notification, deadline);
//   agent->Wait(h, deadline);                            // or Poll(h) from an event loop
//   // decode side
//   agent->WaitForNotifications(deadline); for (auto& n : agent->DrainNotifications()) ...
//
// Contract (every backend honours it; tests check it):
//  * Completion. A WRITE handle reaches kDone only once its data is visible in the target's
//    memory; a READ handle once the data is in local memory.
//  * Notifications. A notification attached to a post is delivered to the target agent only after
//    all data of that post is visible there, so on receipt the blocks can be used. A cancelled or
//    expired post never sends its notification.
//  * One post in flight per handle. Posting on a handle that is kInProgress gives
//    kFailedPrecondition. A terminal handle may be posted again (new indices, new notification).
//  * Pinning. Local regions used by a post stay registered until the handle is terminal:
//    DeregisterMemory of a region with in-flight transfers gives kFailedPrecondition, and
//    ReleaseHandle of an in-flight handle gives kFailedPrecondition. Cancel and deadlines are
//    best effort: they stop the notification and report the outcome, but the handle stays
//    kInProgress (memory pinned) until the backend has really stopped touching the buffers.
//  * Peers and incarnations. Every agent carries an incarnation number (new for each process
//    start). Handles and remote descriptor lists are bound to the peer incarnation they were made
//    for. After ForgetPeer, or after ImportPeer of the same name with a newer incarnation, posts on
//    those handles are refused with kAborted. When the peer fails (process gone, endpoint error)
//    in-flight transfers end with kUnavailable and later posts to it are refused with
//    kUnavailable until a new incarnation is imported.
//  * Deadlines. Every post has one. A post that has not completed by its deadline ends with
//    kDeadlineExceeded; if the backend still has not finished `AgentConfig::abort_grace` after the
//    deadline, the agent tears the endpoint down (the peer is then failed, see above) so the
//    buffers are released. Deadlines are enforced by Poll and Wait.
//
// Status codes (STYLE.md 1): kInvalidArgument for caller errors (bad sizes, indices, bounds),
// kNotFound for unknown ids/peers, kFailedPrecondition for calls in the wrong state, kAborted for
// stale peer incarnations, kUnavailable when the peer is gone, kDeadlineExceeded, kCancelled,
// kUnimplemented for capabilities the backend lacks (e.g. device memory without CUDA-aware UCX).
//
// Layer-wise streaming. To hide transfer under prefill compute, the prefill side creates one
// handle per layer (or a small ring of handles) on the same descriptor lists and posts layer L's
// blocks while computing layer L+1, every post carrying a Notification with the same request_id,
// seq = layer index and total = number of layers. The decode side feeds received notifications to
// a NotificationTracker (notification_tracker.h), which reports when all `total` parts of a
// request have landed.
//
// Security. Remote keys and memory addresses travel only inside the metadata blob, which callers
// exchange over their own authenticated control channel (gRPC). Nothing in this library listens on
// a socket for metadata or connections: the UCX backend connects endpoints by worker address taken
// from an imported blob and never opens a listener. Anyone who can inject a blob into ImportPeer
// can read and write the registered regions it names, so only import blobs from authenticated
// peers.
//
// Thread-safety: all TransferAgent methods are thread-safe. Callbacks are not used; completion is
// observed through Poll/Wait, notifications through DrainNotifications.
#ifndef DEEPINFER_KV_TRANSFER_TRANSFER_AGENT_H_
#define DEEPINFER_KV_TRANSFER_TRANSFER_AGENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace deepinfer::kv_transfer {

enum class MemoryKind : uint8_t { kHost = 0, kCudaDevice = 1 };
enum class TransferOp : uint8_t { kWrite = 0, kRead = 1 };
enum class Backend : uint8_t { kLoopback = 0, kUcx = 1 };

absl::string_view MemoryKindName(MemoryKind kind);
absl::string_view BackendName(Backend backend);

// Ids are unique within one agent and never reused.
using RegionId = uint64_t;
using DescListId = uint64_t;
using HandleId = uint64_t;

// One contiguous piece of a registered region, e.g. one KV block. `region` is a local RegionId
// for local lists, or the peer's RegionId (as listed in its metadata) for remote lists.
struct BlockDesc {
  RegionId region = 0;
  uint64_t offset = 0;  // bytes from the region's base
  uint64_t length = 0;  // bytes, > 0
};

// Largest notification payload, in bytes.
inline constexpr size_t kMaxNotificationPayload = 4096;

// A small message delivered to the target after the data of its post is visible there.
struct Notification {
  uint64_t request_id = 0;  // the tag: identifies the request the blocks belong to
  uint32_t seq = 0;         // part number within the request (e.g. layer index)
  uint32_t total = 0;       // number of parts of the request, 0 if unknown
  std::string payload;      // at most kMaxNotificationPayload bytes
  // Filled in on receipt: the sending agent's name and incarnation.
  std::string sender;
  uint64_t sender_incarnation = 0;
};

enum class TransferState : uint8_t {
  kIdle = 0,        // created, never posted
  kInProgress = 1,  // posted, backend may still touch the buffers
  kDone = 2,        // terminal, succeeded
  kFailed = 3,      // terminal, `status` says why
};

struct TransferStatus {
  TransferState state = TransferState::kIdle;
  absl::Status status;  // OK unless state == kFailed
  bool terminal() const { return state != TransferState::kInProgress; }
};

// Gauges and totals; tests use them to prove nothing leaks.
struct AgentCounters {
  int64_t registered_regions = 0;
  int64_t registered_bytes = 0;
  int64_t peers = 0;  // imported, not forgotten
  int64_t descriptor_lists = 0;
  int64_t handles = 0;                     // created, not released
  int64_t in_flight_handles = 0;           // handles in kInProgress
  int64_t backend_requests_in_flight = 0;  // requests the backend (UCX) has not completed
  int64_t pending_notifications = 0;       // received, not yet drained
  uint64_t bytes_written = 0;              // by completed WRITE posts
  uint64_t bytes_read = 0;                 // by completed READ posts
  uint64_t posts_completed = 0;
  uint64_t posts_failed = 0;
  uint64_t notifications_sent = 0;
  uint64_t notifications_received = 0;
};

// What AllocateMemory returns: the new region and where its memory starts.
struct AllocatedRegion {
  RegionId region = 0;
  void* base = nullptr;
};

struct AgentConfig {
  std::string name;          // unique within the cluster, non-empty
  uint64_t incarnation = 0;  // non-zero, new for every process start (caller supplies it)
  Backend backend = Backend::kUcx;
  // How long after a post's deadline the agent waits for the backend before tearing down the
  // endpoint to release the buffers.
  absl::Duration abort_grace = absl::Seconds(1);
  // UCX progress thread: after this long without work it sleeps between polls, `ucx_idle_sleep`
  // first, each further idle sleep twice as long up to `ucx_max_idle_sleep`; from then on it
  // blocks on the worker's event fd (UCP_FEATURE_WAKEUP: woken by arriving messages), or, where
  // the UCX transports cannot wake it, keeps polling every `ucx_max_idle_sleep`. Posting or
  // queueing work wakes it at once. (Polling every 50 us cost an idle node ~5% of a core.)
  absl::Duration ucx_spin_before_sleep = absl::Microseconds(200);
  absl::Duration ucx_idle_sleep = absl::Microseconds(50);
  absl::Duration ucx_max_idle_sleep = absl::Milliseconds(1);
  // Clock used for deadlines (STYLE.md 9). Must be consistent with absl::Now() pacing since Wait
  // sleeps in real time.
  std::function<absl::Time()> clock;
};

class TransferAgent {
 public:
  virtual ~TransferAgent() = default;
  TransferAgent() = default;
  TransferAgent(const TransferAgent&) = delete;
  TransferAgent& operator=(const TransferAgent&) = delete;

  virtual absl::string_view name() const = 0;
  virtual uint64_t incarnation() const = 0;
  virtual Backend backend() const = 0;

  // Capability query: OK if regions of `kind` can be registered, else kUnimplemented saying why.
  virtual absl::Status SupportsMemoryKind(MemoryKind kind) const = 0;

  // Starts the backend's progress machinery (the UCX progress thread). Posts before Start() are
  // refused with kFailedPrecondition. Stop() ends it; in-flight transfers fail with kCancelled.
  virtual absl::Status Start() = 0;
  virtual void Stop() = 0;

  // Registers [base, base + length) for transfers. The memory must outlive the registration.
  virtual absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) = 0;
  // Allocates `length` bytes of `kind` memory the way the backend reaches fastest and registers
  // them like RegisterMemory. The memory belongs to the agent: it stays valid until
  // DeregisterMemory of the region or the agent's destruction, whichever comes first. Contents are
  // unspecified. Use it for pools that peers write into or read from: with UCX over shared memory
  // a peer then copies straight into this process's mapping of the pool, while into memory given
  // to RegisterMemory UCX 1.13 can only emulate puts and gets with active messages (a copy through
  // a bounce buffer on both sides, and work for this process's progress thread), several times
  // slower. Over TCP or RDMA both kinds of region perform alike.
  virtual absl::StatusOr<AllocatedRegion> AllocateMemory(size_t length, MemoryKind kind) = 0;
  // kFailedPrecondition while a post using the region is in flight. Descriptor lists naming the
  // region stay valid objects but posts through them give kFailedPrecondition. A region from
  // AllocateMemory is freed.
  virtual absl::Status DeregisterMemory(RegionId region) = 0;

  // Opaque, versioned blob with this agent's name, incarnation, backend address and the regions
  // registered right now (with their remote keys). Export again after registering more memory.
  virtual absl::StatusOr<std::string> ExportMetadata() const = 0;
  // Imports a peer's blob and connects to it; returns the peer's name. Re-importing the same
  // incarnation refreshes its region list; a newer incarnation replaces the old one (whose handles
  // are then refused with kAborted); an older incarnation gives kAborted.
  virtual absl::StatusOr<std::string> ImportPeer(absl::string_view metadata) = 0;
  virtual absl::Status ForgetPeer(absl::string_view peer) = 0;

  virtual absl::StatusOr<DescListId> PrepareLocalDescriptors(
      absl::Span<const BlockDesc> blocks) = 0;
  virtual absl::StatusOr<DescListId> PrepareRemoteDescriptors(
      absl::string_view peer, absl::Span<const BlockDesc> blocks) = 0;
  virtual absl::Status ReleaseDescriptors(DescListId list) = 0;

  // A handle pairs a local and a remote list (and so one peer incarnation).
  virtual absl::StatusOr<HandleId> CreateHandle(DescListId local, DescListId remote) = 0;
  virtual absl::Status ReleaseHandle(HandleId handle) = 0;

  // Moves local_indices[i] <-> remote_indices[i] (equal lengths required). kWrite copies local
  // blocks into the peer, kRead copies peer blocks into local memory. `notification` (may be null)
  // goes to the peer after the data. Both index lists may be empty if a notification is given.
  // An error return means nothing was started and the handle is unchanged; failures after the
  // post was accepted are reported by Poll/Wait.
  virtual absl::Status Post(HandleId handle, TransferOp op,
                            absl::Span<const uint32_t> local_indices,
                            absl::Span<const uint32_t> remote_indices,
                            const Notification* notification, absl::Time deadline) = 0;
  // Current state (kNotFound for an unknown handle). Enforces the post's deadline.
  virtual absl::StatusOr<TransferStatus> Poll(HandleId handle) = 0;
  // Blocks until the handle is terminal or `wait_deadline` passes (then state is kInProgress).
  virtual absl::StatusOr<TransferStatus> Wait(HandleId handle, absl::Time wait_deadline) = 0;
  // Best effort: the notification is not sent if it has not been yet, and the post ends with
  // kCancelled once the backend is done with the buffers. No-op on a terminal handle.
  virtual absl::Status Cancel(HandleId handle) = 0;

  // Received notifications in arrival order (at most `max`).
  virtual std::vector<Notification> DrainNotifications(size_t max = SIZE_MAX) = 0;
  // True once at least one notification is pending, false if `deadline` passed first.
  virtual bool WaitForNotifications(absl::Time deadline) = 0;

  virtual AgentCounters counters() const = 0;
};

}  // namespace deepinfer::kv_transfer

#endif  // DEEPINFER_KV_TRANSFER_TRANSFER_AGENT_H_
