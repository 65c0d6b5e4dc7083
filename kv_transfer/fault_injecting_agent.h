// A TransferAgent wrapper that injects faults into any agent (STYLE.md 10): delayed completion,
// dropped notifications, failure after N bytes, and a killed peer. Everything else is forwarded.
//
// Faults, as the caller sees them through the TransferAgent contract:
//  * SetCompletionDelay(d): every post reports kInProgress for at least `d` after it was posted
//    (its buffers stay pinned that long: DeregisterMemory and ReleaseHandle are refused).
//  * SetDropNotifications(true): data moves but notifications are not sent; the post succeeds.
//  * FailAfterBytes(n): once `n` more bytes have been moved, a post that would exceed the budget
//    moves only the whole blocks that fit, sends no notification and ends with kUnavailable.
//  * KillPeer(name): in-flight posts to that peer are cancelled and end with kUnavailable; new
//    posts are refused with kUnavailable until RevivePeer(name).
//
// Thread-safety: all methods are thread-safe.
#ifndef DEEPINFER_KV_TRANSFER_FAULT_INJECTING_AGENT_H_
#define DEEPINFER_KV_TRANSFER_FAULT_INJECTING_AGENT_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer {

class FaultInjectingAgent final : public TransferAgent {
 public:
  explicit FaultInjectingAgent(std::unique_ptr<TransferAgent> inner);

  void SetCompletionDelay(absl::Duration delay);
  void SetDropNotifications(bool drop);
  // Negative disables the budget.
  void FailAfterBytes(int64_t bytes);
  void KillPeer(absl::string_view peer);
  void RevivePeer(absl::string_view peer);

  TransferAgent& inner() { return *inner_; }

  absl::string_view name() const override { return inner_->name(); }
  uint64_t incarnation() const override { return inner_->incarnation(); }
  Backend backend() const override { return inner_->backend(); }
  absl::Status SupportsMemoryKind(MemoryKind kind) const override {
    return inner_->SupportsMemoryKind(kind);
  }
  absl::Status Start() override { return inner_->Start(); }
  void Stop() override { inner_->Stop(); }
  absl::StatusOr<RegionId> RegisterMemory(void* base, size_t length, MemoryKind kind) override {
    return inner_->RegisterMemory(base, length, kind);
  }
  absl::StatusOr<AllocatedRegion> AllocateMemory(size_t length, MemoryKind kind) override {
    return inner_->AllocateMemory(length, kind);
  }
  absl::Status DeregisterMemory(RegionId region) override;
  absl::StatusOr<std::string> ExportMetadata() const override { return inner_->ExportMetadata(); }
  absl::StatusOr<std::string> ImportPeer(absl::string_view metadata) override {
    return inner_->ImportPeer(metadata);
  }
  absl::Status ForgetPeer(absl::string_view peer) override { return inner_->ForgetPeer(peer); }
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
  absl::Status Cancel(HandleId handle) override { return inner_->Cancel(handle); }
  std::vector<Notification> DrainNotifications(size_t max) override {
    return inner_->DrainNotifications(max);
  }
  bool WaitForNotifications(absl::Time deadline) override {
    return inner_->WaitForNotifications(deadline);
  }
  AgentCounters counters() const override { return inner_->counters(); }

 private:
  struct Overlay {
    std::string peer;
    absl::Time ready_at = absl::InfinitePast();  // report in progress until then
    absl::Status forced;                         // injected outcome, OK if none
    bool inner_posted = false;                   // false: the post never reached `inner_`
    bool pending = false;                        // posted and not yet reported terminal
  };
  // Combines the inner status with the overlay; updates `pending`.
  TransferStatus Combine(HandleId handle, TransferStatus inner) ABSL_LOCKS_EXCLUDED(mu_);

  const std::unique_ptr<TransferAgent> inner_;
  mutable absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool drop_notifications_ ABSL_GUARDED_BY(mu_) = false;
  int64_t byte_budget_ ABSL_GUARDED_BY(mu_) = -1;
  absl::flat_hash_set<std::string> killed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DescListId, std::vector<uint64_t>> local_lengths_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<DescListId, std::string> remote_peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<HandleId, Overlay> overlays_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<HandleId, DescListId> handle_local_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::kv_transfer

#endif  // DEEPINFER_KV_TRANSFER_FAULT_INJECTING_AGENT_H_
