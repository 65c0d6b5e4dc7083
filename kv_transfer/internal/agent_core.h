// AgentCore: the backend-independent TransferAgent. It owns all bookkeeping (region, list, handle
// and peer tables, validation, pinning, incarnations, deadlines, notification queue, counters)
// and drives a Transport (transport.h) that moves the bytes.
//
// Thread-safety: every public method is thread-safe (one absl::Mutex); see transport.h for the
// locking rule between the core and its transport.
#ifndef DEEPINFER_KV_TRANSFER_INTERNAL_AGENT_CORE_H_
#define DEEPINFER_KV_TRANSFER_INTERNAL_AGENT_CORE_H_

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/internal/transport.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer::internal {

class AgentCore final : public TransferAgent, private TransportCallbacks {
 public:
  // Validates `config` (kInvalidArgument) and takes ownership of `transport`.
  static absl::StatusOr<std::unique_ptr<AgentCore>> Create(AgentConfig config,
                                                           std::unique_ptr<Transport> transport);
  ~AgentCore() override;

  absl::string_view name() const override { return config_.name; }
  uint64_t incarnation() const override { return config_.incarnation; }
  Backend backend() const override { return config_.backend; }
  absl::Status SupportsMemoryKind(MemoryKind kind) const override;
  absl::Status Start() override;
  void Stop() override;
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override;
  absl::StatusOr<AllocatedRegion> AllocateMemory(size_t length, MemoryKind kind) override;
  absl::Status DeregisterMemory(RegionId region) override;
  absl::StatusOr<std::string> ExportMetadata() const override;
  absl::StatusOr<std::string> ImportPeer(absl::string_view metadata) override;
  absl::Status ForgetPeer(absl::string_view peer) override;
  absl::StatusOr<DescListId> PrepareLocalDescriptors(absl::Span<const BlockDesc> blocks) override;
  absl::StatusOr<DescListId> PrepareRemoteDescriptors(absl::string_view peer,
                                                      absl::Span<const BlockDesc> blocks) override;
  absl::Status ReleaseDescriptors(DescListId list) override;
  absl::StatusOr<HandleId> CreateHandle(DescListId local, DescListId remote) override;
  absl::Status ReleaseHandle(HandleId handle) override;
  absl::Status Post(HandleId handle, TransferOp op, absl::Span<const uint32_t> local_indices,
                    absl::Span<const uint32_t> remote_indices, const Notification* notification,
                    absl::Time deadline) override;
  absl::StatusOr<TransferStatus> Poll(HandleId handle) override;
  absl::StatusOr<TransferStatus> Wait(HandleId handle, absl::Time wait_deadline) override;
  absl::Status Cancel(HandleId handle) override;
  std::vector<Notification> DrainNotifications(size_t max) override;
  bool WaitForNotifications(absl::Time deadline) override;
  AgentCounters counters() const override;

 private:
  struct Region;
  struct Peer;
  struct DescList;
  struct Handle;

  AgentCore(AgentConfig config, std::unique_ptr<Transport> transport);

  // TransportCallbacks.
  void OnPostComplete(void* post_context, absl::Status status) override;
  bool ShouldNotify(void* post_context) override;
  void OnNotification(absl::string_view bytes) override;
  void OnLinkError(uint64_t link_cookie, absl::Status status) override;

  absl::Time Now() const { return config_.clock(); }
  // Ends the post on `h` (backend done, no guard left): releases pins, sets the outcome.
  void FinishLocked(Handle* h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tears down the link of a handle whose post is past deadline + grace.
  void EnforceDeadlineLocked(Handle* h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `peer` retired (forgotten or replaced) and releases its link once idle.
  void RetirePeerLocked(const std::shared_ptr<Peer>& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeReleasePeerLocked(Peer* peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a region the transport registered (or allocated) as `memory`.
  RegionId AddRegion(char* base, size_t length, MemoryKind kind, void* memory,
                     std::string packed_key);
  TransferStatus StatusOfLocked(const Handle& h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AgentConfig config_;
  const std::unique_ptr<Transport> transport_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // signalled when a handle ends or a notification arrives
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<RegionId, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  // Peers (current and retired) whose link is still open, by link cookie.
  absl::flat_hash_map<uint64_t, std::shared_ptr<Peer>> linked_peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DescListId, std::shared_ptr<DescList>> lists_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<HandleId, std::unique_ptr<Handle>> handles_ ABSL_GUARDED_BY(mu_);
  std::deque<Notification> notifications_ ABSL_GUARDED_BY(mu_);
  AgentCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::kv_transfer::internal

#endif  // DEEPINFER_KV_TRANSFER_INTERNAL_AGENT_CORE_H_
