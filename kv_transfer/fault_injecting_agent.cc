#include "kv_transfer/fault_injecting_agent.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace deepinfer::kv_transfer {

FaultInjectingAgent::FaultInjectingAgent(std::unique_ptr<TransferAgent> inner)
    : inner_(std::move(inner)) {}

void FaultInjectingAgent::SetCompletionDelay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  delay_ = delay;
}
void FaultInjectingAgent::SetDropNotifications(bool drop) {
  absl::MutexLock lock(&mu_);
  drop_notifications_ = drop;
}
void FaultInjectingAgent::FailAfterBytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  byte_budget_ = bytes;
}
void FaultInjectingAgent::KillPeer(absl::string_view peer) {
  absl::MutexLock lock(&mu_);
  killed_.insert(std::string(peer));
}
void FaultInjectingAgent::RevivePeer(absl::string_view peer) {
  absl::MutexLock lock(&mu_);
  killed_.erase(std::string(peer));
}

absl::Status FaultInjectingAgent::DeregisterMemory(RegionId region) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (const auto& [handle, o] : overlays_) {
      if (o.pending && now < o.ready_at) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DeregisterMemory: handle ", handle,
            " expected terminal, found a (delayed) post in flight; memory stays pinned"));
      }
    }
  }
  return inner_->DeregisterMemory(region);
}

absl::StatusOr<DescListId> FaultInjectingAgent::PrepareLocalDescriptors(
    absl::Span<const BlockDesc> blocks) {
  absl::StatusOr<DescListId> id = inner_->PrepareLocalDescriptors(blocks);
  if (!id.ok()) return id;
  std::vector<uint64_t> lengths;
  lengths.reserve(blocks.size());
  for (const BlockDesc& b : blocks) lengths.push_back(b.length);
  absl::MutexLock lock(&mu_);
  local_lengths_[*id] = std::move(lengths);
  return id;
}

absl::StatusOr<DescListId> FaultInjectingAgent::PrepareRemoteDescriptors(
    absl::string_view peer, absl::Span<const BlockDesc> blocks) {
  absl::StatusOr<DescListId> id = inner_->PrepareRemoteDescriptors(peer, blocks);
  if (!id.ok()) return id;
  absl::MutexLock lock(&mu_);
  remote_peers_[*id] = std::string(peer);
  return id;
}

absl::Status FaultInjectingAgent::ReleaseDescriptors(DescListId list) {
  absl::Status s = inner_->ReleaseDescriptors(list);
  absl::MutexLock lock(&mu_);
  local_lengths_.erase(list);
  remote_peers_.erase(list);
  return s;
}

absl::StatusOr<HandleId> FaultInjectingAgent::CreateHandle(DescListId local, DescListId remote) {
  absl::StatusOr<HandleId> id = inner_->CreateHandle(local, remote);
  if (!id.ok()) return id;
  absl::MutexLock lock(&mu_);
  overlays_[*id].peer = remote_peers_[remote];
  handle_local_[*id] = local;
  return id;
}

absl::Status FaultInjectingAgent::ReleaseHandle(HandleId handle) {
  {
    absl::MutexLock lock(&mu_);
    auto it = overlays_.find(handle);
    if (it != overlays_.end() && it->second.pending && absl::Now() < it->second.ready_at) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ReleaseHandle: handle ", handle, " expected terminal, found a (delayed) post"));
    }
  }
  absl::Status s = inner_->ReleaseHandle(handle);
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    overlays_.erase(handle);
    handle_local_.erase(handle);
  }
  return s;
}

absl::Status FaultInjectingAgent::Post(HandleId handle, TransferOp op,
                                       absl::Span<const uint32_t> local_indices,
                                       absl::Span<const uint32_t> remote_indices,
                                       const Notification* notification, absl::Time deadline) {
  size_t forward = local_indices.size();
  absl::Status forced;
  bool drop = false;
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    auto it = overlays_.find(handle);
    if (it == overlays_.end()) return absl::NotFoundError(absl::StrCat("Post: no handle ", handle));
    Overlay& o = it->second;
    if (o.pending && (absl::Now() < o.ready_at || !o.inner_posted)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Post: handle ", handle, " expected idle or terminal, found a post in flight"));
    }
    if (killed_.contains(o.peer)) {
      return absl::UnavailableError(
          absl::StrCat("Post: peer '", o.peer, "' is gone (injected fault: peer killed)"));
    }
    if (byte_budget_ >= 0 && local_indices.size() == remote_indices.size()) {
      const std::vector<uint64_t>& lengths = local_lengths_[handle_local_[handle]];
      uint64_t used = 0;
      for (size_t i = 0; i < local_indices.size(); ++i) {
        const uint32_t li = local_indices[i];
        const uint64_t len = li < lengths.size() ? lengths[li] : 0;
        if (used + len > static_cast<uint64_t>(byte_budget_)) {
          forward = i;
          forced = absl::UnavailableError(absl::StrCat(
              "injected fault: connection failed after ", used, " of the post's bytes"));
          break;
        }
        used += len;
      }
      byte_budget_ -= static_cast<int64_t>(used);
    }
    drop = drop_notifications_ || !forced.ok();
    delay = delay_;
  }
  absl::Status s = absl::OkStatus();
  const bool send_inner = forward > 0 || (notification != nullptr && !drop);
  if (send_inner) {
    s = inner_->Post(handle, op, local_indices.subspan(0, forward),
                     remote_indices.subspan(0, forward), drop ? nullptr : notification, deadline);
    if (!s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  Overlay& o = overlays_[handle];
  o.ready_at = absl::Now() + delay;
  o.forced = forced;
  o.inner_posted = send_inner;
  o.pending = true;
  return absl::OkStatus();
}

TransferStatus FaultInjectingAgent::Combine(HandleId handle, TransferStatus inner) {
  absl::MutexLock lock(&mu_);
  auto it = overlays_.find(handle);
  if (it == overlays_.end()) return inner;
  Overlay& o = it->second;
  if (!o.pending) return inner;
  if (killed_.contains(o.peer)) {
    if (!inner.terminal()) {
      // Stop the notification; the buffers stay pinned until the inner post has ended.
      (void)inner_->Cancel(handle);
      return inner;
    }
    o.pending = false;
    return {TransferState::kFailed,
            absl::UnavailableError(absl::StrCat("peer '", o.peer,
                                                "' is gone (injected fault: peer killed)"))};
  }
  if (!inner.terminal()) return inner;
  if (absl::Now() < o.ready_at) return {TransferState::kInProgress, absl::OkStatus()};
  o.pending = false;
  if (!o.forced.ok() && inner.status.ok()) return {TransferState::kFailed, o.forced};
  return inner;
}

absl::StatusOr<TransferStatus> FaultInjectingAgent::Poll(HandleId handle) {
  bool posted = true;
  {
    absl::MutexLock lock(&mu_);
    auto it = overlays_.find(handle);
    if (it != overlays_.end()) posted = it->second.inner_posted || !it->second.pending;
  }
  TransferStatus inner{TransferState::kDone, absl::OkStatus()};
  if (posted) {
    absl::StatusOr<TransferStatus> s = inner_->Poll(handle);
    if (!s.ok()) return s;
    inner = *s;
  }
  return Combine(handle, inner);
}

absl::StatusOr<TransferStatus> FaultInjectingAgent::Wait(HandleId handle,
                                                         absl::Time wait_deadline) {
  while (true) {
    absl::StatusOr<TransferStatus> s = Poll(handle);
    if (!s.ok() || s->terminal() || absl::Now() >= wait_deadline) return s;
    absl::SleepFor(std::min(absl::Milliseconds(1), wait_deadline - absl::Now()));
  }
}

}  // namespace deepinfer::kv_transfer
