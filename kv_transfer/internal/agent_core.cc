#include "kv_transfer/internal/agent_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kv_transfer/internal/wire.h"
#include "spdlog/spdlog.h"

namespace deepinfer::kv_transfer::internal {

struct AgentCore::Region {
  RegionId id = 0;
  char* base = nullptr;
  uint64_t length = 0;
  MemoryKind kind = MemoryKind::kHost;
  void* memory = nullptr;  // transport token
  std::string packed_key;
  int64_t in_flight = 0;  // segments of in-flight posts using this region
  bool deregistered = false;
};

struct AgentCore::Peer {
  enum class State { kActive, kFailed, kRetired };
  struct RemoteRegion {
    uint64_t base = 0;
    uint64_t length = 0;
    void* key = nullptr;
  };
  std::string name;
  uint64_t incarnation = 0;
  uint64_t cookie = 0;
  void* link = nullptr;
  State state = State::kActive;
  absl::Status failure;
  absl::flat_hash_map<RegionId, RemoteRegion> regions;
  int64_t in_flight = 0;  // posts in flight to this peer
  bool link_released = false;
};

struct AgentCore::DescList {
  struct Entry {
    Region* region = nullptr;  // local lists: kept alive by `pins`
    char* local_addr = nullptr;
    uint64_t remote_addr = 0;
    uint64_t length = 0;
    void* token = nullptr;  // local: transport memory; remote: remote key
  };
  bool remote = false;
  std::shared_ptr<Peer> peer;                 // remote lists
  std::vector<std::shared_ptr<Region>> pins;  // local lists: regions named by entries
  std::vector<Entry> entries;
};

struct AgentCore::Handle {
  HandleId id = 0;
  std::shared_ptr<DescList> local;
  std::shared_ptr<DescList> remote;
  TransferState state = TransferState::kIdle;
  absl::Status outcome;
  TransferOp op = TransferOp::kWrite;
  absl::Time deadline;
  uint64_t bytes = 0;
  int guard = 0;  // Post() is still between accepting and PostBatch returning
  bool cancel = false;
  bool notify_sent = false;
  bool link_aborted = false;
  bool backend_done = false;
  absl::Status backend_status;
  std::vector<Segment> segments;  // reused across posts
  std::vector<Region*> pinned;    // one per segment
  std::string notification;       // encoded, empty if none
};

AgentCore::AgentCore(AgentConfig config, std::unique_ptr<Transport> transport)
    : config_(std::move(config)), transport_(std::move(transport)) {}

absl::StatusOr<std::unique_ptr<AgentCore>> AgentCore::Create(AgentConfig config,
                                                             std::unique_ptr<Transport> transport) {
  if (config.name.empty()) {
    return absl::InvalidArgumentError("AgentConfig.name: expected a non-empty agent name");
  }
  if (config.incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AgentConfig.incarnation for agent '", config.name,
                     "': expected a non-zero number unique to this process start, found 0"));
  }
  if (config.abort_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("AgentConfig.abort_grace: expected >= 0");
  }
  if (!config.clock) config.clock = [] { return absl::Now(); };
  auto core = std::unique_ptr<AgentCore>(new AgentCore(std::move(config), std::move(transport)));
  core->transport_->SetCallbacks(core.get());
  return core;
}

AgentCore::~AgentCore() { Stop(); }

absl::Status AgentCore::SupportsMemoryKind(MemoryKind kind) const {
  return transport_->SupportsMemoryKind(kind);
}

absl::Status AgentCore::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      return absl::FailedPreconditionError(
          absl::StrCat("agent '", config_.name, "': expected a fresh agent, found it stopped"));
    }
    if (started_) return absl::OkStatus();
  }
  if (absl::Status s = transport_->Start(); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  started_ = true;
  return absl::OkStatus();
}

void AgentCore::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  transport_->Stop();
}

absl::StatusOr<RegionId> AgentCore::RegisterMemory(void* base, size_t length, MemoryKind kind) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterMemory: expected a non-null base and a non-zero length, found base=",
                     reinterpret_cast<uintptr_t>(base), " length=", length));
  }
  if (absl::Status s = transport_->SupportsMemoryKind(kind); !s.ok()) return s;
  std::string packed_key;
  absl::StatusOr<void*> memory = transport_->RegisterMemory(base, length, kind, &packed_key);
  if (!memory.ok()) return memory.status();
  return AddRegion(static_cast<char*>(base), length, kind, *memory, std::move(packed_key));
}

absl::StatusOr<AllocatedRegion> AgentCore::AllocateMemory(size_t length, MemoryKind kind) {
  if (length == 0) {
    return absl::InvalidArgumentError("AllocateMemory: expected a non-zero length, found 0");
  }
  if (absl::Status s = transport_->SupportsMemoryKind(kind); !s.ok()) return s;
  std::string packed_key;
  void* base = nullptr;
  absl::StatusOr<void*> memory = transport_->AllocateMemory(length, kind, &base, &packed_key);
  if (!memory.ok()) return memory.status();
  const RegionId id =
      AddRegion(static_cast<char*>(base), length, kind, *memory, std::move(packed_key));
  return AllocatedRegion{id, base};
}

RegionId AgentCore::AddRegion(char* base, size_t length, MemoryKind kind, void* memory,
                              std::string packed_key) {
  auto region = std::make_shared<Region>();
  region->base = base;
  region->length = length;
  region->kind = kind;
  region->memory = memory;
  region->packed_key = std::move(packed_key);
  absl::MutexLock lock(&mu_);
  region->id = next_id_++;
  regions_[region->id] = region;
  ++counters_.registered_regions;
  counters_.registered_bytes += length;
  return region->id;
}

absl::Status AgentCore::DeregisterMemory(RegionId id) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("DeregisterMemory: no registered region ", id));
  }
  Region& r = *it->second;
  if (r.in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "DeregisterMemory: region ", id, " is pinned by ", r.in_flight,
        " in-flight transfer segments; expected none (wait until their handles are terminal)"));
  }
  r.deregistered = true;
  transport_->DeregisterMemory(r.memory);
  r.memory = nullptr;
  --counters_.registered_regions;
  counters_.registered_bytes -= r.length;
  regions_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::string> AgentCore::ExportMetadata() const {
  PeerMetadata m;
  m.name = config_.name;
  m.incarnation = config_.incarnation;
  m.backend = config_.backend;
  m.address = transport_->LocalAddress();
  absl::MutexLock lock(&mu_);
  m.regions.reserve(regions_.size());
  for (const auto& [id, r] : regions_) {
    m.regions.push_back(
        RegionMetadata{id, reinterpret_cast<uint64_t>(r->base), r->length, r->kind, r->packed_key});
  }
  std::sort(m.regions.begin(), m.regions.end(),
            [](const RegionMetadata& a, const RegionMetadata& b) { return a.id < b.id; });
  return EncodeMetadata(m);
}

absl::StatusOr<std::string> AgentCore::ImportPeer(absl::string_view blob) {
  absl::StatusOr<PeerMetadata> decoded = DecodeMetadata(blob);
  if (!decoded.ok()) return decoded.status();
  PeerMetadata& m = *decoded;
  if (m.backend != config_.backend) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImportPeer: expected metadata from a ", BackendName(config_.backend),
                     " agent, found ", BackendName(m.backend), " (peer '", m.name, "')"));
  }
  std::shared_ptr<Peer> refresh;  // same incarnation, still active: add new regions only
  uint64_t cookie = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(m.name);
    if (it != peers_.end()) {
      const Peer& old = *it->second;
      if (m.incarnation < old.incarnation) {
        return absl::AbortedError(absl::StrCat("ImportPeer: peer '", m.name,
                                               "' expected incarnation >= ", old.incarnation,
                                               ", found stale incarnation ", m.incarnation));
      }
      if (m.incarnation == old.incarnation && old.state == Peer::State::kActive) {
        refresh = it->second;
      }
    }
    cookie = next_id_++;
  }

  if (refresh != nullptr) {
    std::vector<std::pair<RegionId, Peer::RemoteRegion>> added;
    {
      absl::MutexLock lock(&mu_);
      for (const RegionMetadata& r : m.regions) {
        if (!refresh->regions.contains(r.id)) added.push_back({r.id, {r.base, r.length, nullptr}});
      }
    }
    for (auto& [id, rr] : added) {
      const RegionMetadata* rm = nullptr;
      for (const RegionMetadata& r : m.regions) {
        if (r.id == id) rm = &r;
      }
      absl::StatusOr<void*> key =
          transport_->UnpackRemoteKey(refresh->link, rm->remote_key, rm->base, rm->length);
      if (!key.ok()) return key.status();
      rr.key = *key;
    }
    absl::MutexLock lock(&mu_);
    for (auto& [id, rr] : added) refresh->regions.emplace(id, rr);
    return m.name;
  }

  absl::StatusOr<void*> link = transport_->Connect(m.address, cookie);
  if (!link.ok()) return link.status();
  auto peer = std::make_shared<Peer>();
  peer->name = m.name;
  peer->incarnation = m.incarnation;
  peer->cookie = cookie;
  peer->link = *link;
  for (const RegionMetadata& r : m.regions) {
    absl::StatusOr<void*> key = transport_->UnpackRemoteKey(*link, r.remote_key, r.base, r.length);
    if (!key.ok()) {
      transport_->Disconnect(*link);
      return key.status();
    }
    peer->regions.emplace(r.id, Peer::RemoteRegion{r.base, r.length, *key});
  }
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(m.name);
  if (it != peers_.end()) {
    if (it->second->incarnation > m.incarnation) {
      transport_->Disconnect(peer->link);
      return absl::AbortedError(absl::StrCat("ImportPeer: peer '", m.name,
                                             "' was replaced concurrently by incarnation ",
                                             it->second->incarnation));
    }
    RetirePeerLocked(it->second);
  }
  linked_peers_[cookie] = peer;
  peers_[m.name] = peer;
  counters_.peers = static_cast<int64_t>(peers_.size());
  return m.name;
}

void AgentCore::RetirePeerLocked(const std::shared_ptr<Peer>& peer) {
  peer->state = Peer::State::kRetired;
  auto it = peers_.find(peer->name);
  if (it != peers_.end() && it->second == peer) peers_.erase(it);
  counters_.peers = static_cast<int64_t>(peers_.size());
  MaybeReleasePeerLocked(peer.get());
}

void AgentCore::MaybeReleasePeerLocked(Peer* peer) {
  if (peer->state == Peer::State::kActive || peer->in_flight > 0 || peer->link_released) return;
  peer->link_released = true;
  transport_->Disconnect(peer->link);
  for (auto& [id, rr] : peer->regions) rr.key = nullptr;
  linked_peers_.erase(peer->cookie);
}

absl::Status AgentCore::ForgetPeer(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(std::string(name));
  if (it == peers_.end()) {
    return absl::NotFoundError(absl::StrCat("ForgetPeer: no imported peer '", name, "'"));
  }
  RetirePeerLocked(it->second);
  return absl::OkStatus();
}

absl::StatusOr<DescListId> AgentCore::PrepareLocalDescriptors(absl::Span<const BlockDesc> blocks) {
  auto list = std::make_shared<DescList>();
  list->entries.reserve(blocks.size());
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockDesc& b = blocks[i];
    auto it = regions_.find(b.region);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("PrepareLocalDescriptors: block ", i,
                                              " names region ", b.region,
                                              ", which is not registered"));
    }
    Region& r = *it->second;
    if (b.length == 0 || b.offset > r.length || b.length > r.length - b.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PrepareLocalDescriptors: block ", i,
          " expected 0 < length and offset + length <= ", r.length, " (size of region ", b.region,
          "), found offset ", b.offset, " length ", b.length));
    }
    if (list->pins.empty() || list->pins.back().get() != &r) list->pins.push_back(it->second);
    list->entries.push_back({&r, r.base + b.offset, 0, b.length, r.memory});
  }
  const DescListId id = next_id_++;
  lists_[id] = std::move(list);
  counters_.descriptor_lists = static_cast<int64_t>(lists_.size());
  return id;
}

absl::StatusOr<DescListId> AgentCore::PrepareRemoteDescriptors(absl::string_view peer_name,
                                                               absl::Span<const BlockDesc> blocks) {
  auto list = std::make_shared<DescList>();
  list->remote = true;
  list->entries.reserve(blocks.size());
  absl::MutexLock lock(&mu_);
  auto pit = peers_.find(std::string(peer_name));
  if (pit == peers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("PrepareRemoteDescriptors: no imported peer '", peer_name, "'"));
  }
  Peer& peer = *pit->second;
  if (peer.state == Peer::State::kFailed) return peer.failure;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockDesc& b = blocks[i];
    auto it = peer.regions.find(b.region);
    if (it == peer.regions.end()) {
      return absl::InvalidArgumentError(absl::StrCat("PrepareRemoteDescriptors: block ", i,
                                                     " names region ", b.region, ", which peer '",
                                                     peer_name, "' did not export"));
    }
    const Peer::RemoteRegion& r = it->second;
    if (b.length == 0 || b.offset > r.length || b.length > r.length - b.offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PrepareRemoteDescriptors: block ", i,
          " expected 0 < length and offset + length <= ", r.length, " (size of peer region ",
          b.region, "), found offset ", b.offset, " length ", b.length));
    }
    list->entries.push_back({nullptr, nullptr, r.base + b.offset, b.length, r.key});
  }
  list->peer = pit->second;
  const DescListId id = next_id_++;
  lists_[id] = std::move(list);
  counters_.descriptor_lists = static_cast<int64_t>(lists_.size());
  return id;
}

absl::Status AgentCore::ReleaseDescriptors(DescListId id) {
  absl::MutexLock lock(&mu_);
  if (lists_.erase(id) == 0) {
    return absl::NotFoundError(absl::StrCat("ReleaseDescriptors: no descriptor list ", id));
  }
  counters_.descriptor_lists = static_cast<int64_t>(lists_.size());
  return absl::OkStatus();
}

absl::StatusOr<HandleId> AgentCore::CreateHandle(DescListId local, DescListId remote) {
  absl::MutexLock lock(&mu_);
  auto lit = lists_.find(local);
  auto rit = lists_.find(remote);
  if (lit == lists_.end() || rit == lists_.end()) {
    return absl::NotFoundError(
        absl::StrCat("CreateHandle: no descriptor list ", lit == lists_.end() ? local : remote));
  }
  if (lit->second->remote || !rit->second->remote) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateHandle: expected a local list then a remote list, found ",
                     lit->second->remote ? "remote" : "local", " list ", local, " and ",
                     rit->second->remote ? "remote" : "local", " list ", remote));
  }
  auto h = std::make_unique<Handle>();
  h->id = next_id_++;
  h->local = lit->second;
  h->remote = rit->second;
  const HandleId id = h->id;
  handles_[id] = std::move(h);
  counters_.handles = static_cast<int64_t>(handles_.size());
  return id;
}

absl::Status AgentCore::ReleaseHandle(HandleId id) {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) {
    return absl::NotFoundError(absl::StrCat("ReleaseHandle: no handle ", id));
  }
  if (it->second->state == TransferState::kInProgress) {
    return absl::FailedPreconditionError(
        absl::StrCat("ReleaseHandle: handle ", id, " expected terminal, found a post in flight"));
  }
  handles_.erase(it);
  counters_.handles = static_cast<int64_t>(handles_.size());
  return absl::OkStatus();
}

absl::Status AgentCore::Post(HandleId id, TransferOp op, absl::Span<const uint32_t> local_indices,
                             absl::Span<const uint32_t> remote_indices,
                             const Notification* notification, absl::Time deadline) {
  Handle* h = nullptr;
  void* link = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopped_) {
      return absl::FailedPreconditionError(absl::StrCat("Post: agent '", config_.name,
                                                        "' expected started, found ",
                                                        stopped_ ? "stopped" : "not started"));
    }
    auto it = handles_.find(id);
    if (it == handles_.end()) return absl::NotFoundError(absl::StrCat("Post: no handle ", id));
    h = it->second.get();
    if (h->state == TransferState::kInProgress) {
      return absl::FailedPreconditionError(
          absl::StrCat("Post: handle ", id, " expected idle or terminal, found a post in flight"));
    }
    Peer& peer = *h->remote->peer;
    if (peer.state == Peer::State::kRetired) {
      return absl::AbortedError(absl::StrCat("Post: handle ", id, " is bound to peer '", peer.name,
                                             "' incarnation ", peer.incarnation,
                                             ", which was forgotten or replaced"));
    }
    if (peer.state == Peer::State::kFailed) return peer.failure;
    if (local_indices.size() != remote_indices.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Post: expected as many local as remote indices, found ",
                       local_indices.size(), " and ", remote_indices.size()));
    }
    if (local_indices.empty() && notification == nullptr) {
      return absl::InvalidArgumentError("Post: expected blocks or a notification, found neither");
    }
    if (notification != nullptr && notification->payload.size() > kMaxNotificationPayload) {
      return absl::InvalidArgumentError(absl::StrCat("Post: notification payload expected at most ",
                                                     kMaxNotificationPayload, " bytes, found ",
                                                     notification->payload.size()));
    }
    if (Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("Post: handle ", id, " deadline already passed"));
    }
    const auto& lent = h->local->entries;
    const auto& rent = h->remote->entries;
    h->segments.clear();
    uint64_t bytes = 0;
    for (size_t i = 0; i < local_indices.size(); ++i) {
      const uint32_t li = local_indices[i];
      const uint32_t ri = remote_indices[i];
      if (li >= lent.size() || ri >= rent.size()) {
        return absl::InvalidArgumentError(absl::StrCat("Post: pair ", i, " expected local index < ",
                                                       lent.size(), " and remote index < ",
                                                       rent.size(), ", found ", li, " and ", ri));
      }
      const DescList::Entry& l = lent[li];
      const DescList::Entry& r = rent[ri];
      if (l.length != r.length) {
        return absl::InvalidArgumentError(
            absl::StrCat("Post: pair ", i, " expected equal block lengths, found local ", l.length,
                         " and remote ", r.length));
      }
      if (l.region->deregistered) {
        return absl::FailedPreconditionError(absl::StrCat("Post: local block ", li,
                                                          " lies in region ", l.region->id,
                                                          ", which was deregistered"));
      }
      h->segments.push_back(Segment{l.local_addr, l.token, r.remote_addr, r.token, l.length});
      bytes += l.length;
    }
    h->pinned.clear();
    for (size_t i = 0; i < local_indices.size(); ++i) {
      Region* r = lent[local_indices[i]].region;
      ++r->in_flight;
      h->pinned.push_back(r);
    }
    if (notification != nullptr) {
      EncodeNotification(*notification, config_.name, config_.incarnation, &h->notification);
    } else {
      h->notification.clear();
    }
    h->state = TransferState::kInProgress;
    h->outcome = absl::OkStatus();
    h->op = op;
    h->deadline = deadline;
    h->bytes = bytes;
    h->guard = 1;
    h->cancel = false;
    h->notify_sent = false;
    h->link_aborted = false;
    h->backend_done = false;
    h->backend_status = absl::OkStatus();
    ++peer.in_flight;
    ++counters_.in_flight_handles;
    link = peer.link;
  }
  absl::Status s = transport_->PostBatch(link, op, h->segments, h->notification, h);
  absl::MutexLock lock(&mu_);
  --h->guard;
  if (!s.ok()) {
    h->backend_done = true;
    h->backend_status = s;
    if (absl::IsUnavailable(s)) {
      Peer& peer = *h->remote->peer;
      if (peer.state == Peer::State::kActive) {
        peer.state = Peer::State::kFailed;
        peer.failure = s;
      }
    }
  }
  if (h->backend_done && h->guard == 0) FinishLocked(h);
  return absl::OkStatus();
}

void AgentCore::FinishLocked(Handle* h) {
  for (Region* r : h->pinned) --r->in_flight;
  h->pinned.clear();
  const bool backend_ok = h->backend_status.ok();
  absl::Status outcome;
  if (backend_ok && h->notify_sent) {
    outcome = absl::OkStatus();
  } else if (h->cancel) {
    outcome = absl::CancelledError(absl::StrCat("handle ", h->id, ": post cancelled"));
  } else if (Now() > h->deadline) {
    outcome = absl::DeadlineExceededError(absl::StrCat(
        "handle ", h->id, ": post of ", h->segments.size(), " blocks (", h->bytes,
        " bytes) expected to finish by its deadline, found it unfinished",
        backend_ok ? "" : absl::StrCat(" (backend: ", h->backend_status.message(), ")")));
  } else {
    outcome = h->backend_status;
    // A transport error on a post means the link is broken: later posts must not reuse it.
    Peer& peer = *h->remote->peer;
    if (absl::IsUnavailable(outcome) && peer.state == Peer::State::kActive) {
      peer.state = Peer::State::kFailed;
      peer.failure = absl::UnavailableError(absl::StrCat(
          "peer '", peer.name, "' incarnation ", peer.incarnation, " failed: ", outcome.message()));
    }
  }
  h->outcome = outcome;
  h->state = outcome.ok() ? TransferState::kDone : TransferState::kFailed;
  if (outcome.ok()) {
    ++counters_.posts_completed;
    (h->op == TransferOp::kWrite ? counters_.bytes_written : counters_.bytes_read) += h->bytes;
  } else {
    ++counters_.posts_failed;
  }
  --counters_.in_flight_handles;
  Peer* peer = h->remote->peer.get();
  --peer->in_flight;
  MaybeReleasePeerLocked(peer);
  changed_.SignalAll();
}

void AgentCore::OnPostComplete(void* post_context, absl::Status status) {
  absl::MutexLock lock(&mu_);
  Handle* h = static_cast<Handle*>(post_context);
  h->backend_done = true;
  h->backend_status = std::move(status);
  if (h->guard == 0) FinishLocked(h);
}

bool AgentCore::ShouldNotify(void* post_context) {
  absl::MutexLock lock(&mu_);
  Handle* h = static_cast<Handle*>(post_context);
  if (h->cancel || Now() > h->deadline) return false;
  h->notify_sent = true;
  ++counters_.notifications_sent;
  return true;
}

void AgentCore::OnNotification(absl::string_view bytes) {
  absl::StatusOr<Notification> n = DecodeNotification(bytes);
  if (!n.ok()) {
    // A peer speaking another version: drop it rather than crash the receiver.
    spdlog::warn("kv_transfer agent '{}': dropped a notification: {}", config_.name,
                 std::string(n.status().message()));
    return;
  }
  absl::MutexLock lock(&mu_);
  notifications_.push_back(*std::move(n));
  ++counters_.notifications_received;
  changed_.SignalAll();
}

void AgentCore::OnLinkError(uint64_t cookie, absl::Status status) {
  absl::MutexLock lock(&mu_);
  auto it = linked_peers_.find(cookie);
  if (it == linked_peers_.end()) return;
  std::shared_ptr<Peer> peer = it->second;
  if (peer->state == Peer::State::kActive) {
    peer->state = Peer::State::kFailed;
    peer->failure = absl::UnavailableError(absl::StrCat(
        "peer '", peer->name, "' incarnation ", peer->incarnation, " failed: ", status.message()));
  }
  MaybeReleasePeerLocked(peer.get());
}

void AgentCore::EnforceDeadlineLocked(Handle* h) {
  if (h->state != TransferState::kInProgress || h->backend_done || h->link_aborted) return;
  if (Now() <= h->deadline + config_.abort_grace) return;
  h->link_aborted = true;
  Peer& peer = *h->remote->peer;
  if (peer.state == Peer::State::kActive) {
    peer.state = Peer::State::kFailed;
    peer.failure = absl::UnavailableError(
        absl::StrCat("peer '", peer.name, "' incarnation ", peer.incarnation,
                     ": endpoint torn down because "
                     "handle ",
                     h->id, " was still running ", absl::FormatDuration(config_.abort_grace),
                     " after its deadline; import the peer again to reconnect"));
  }
  if (!peer.link_released) transport_->AbortLink(peer.link);
}

TransferStatus AgentCore::StatusOfLocked(const Handle& h) const {
  return TransferStatus{h.state, h.outcome};
}

absl::StatusOr<TransferStatus> AgentCore::Poll(HandleId id) {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) return absl::NotFoundError(absl::StrCat("Poll: no handle ", id));
  EnforceDeadlineLocked(it->second.get());
  return StatusOfLocked(*it->second);
}

absl::StatusOr<TransferStatus> AgentCore::Wait(HandleId id, absl::Time wait_deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = handles_.find(id);
    if (it == handles_.end()) return absl::NotFoundError(absl::StrCat("Wait: no handle ", id));
    Handle* h = it->second.get();
    EnforceDeadlineLocked(h);
    if (h->state != TransferState::kInProgress) return StatusOfLocked(*h);
    const absl::Time now = Now();
    if (now >= wait_deadline) return StatusOfLocked(*h);
    absl::Time next = std::min(wait_deadline,
                               now < h->deadline ? h->deadline : h->deadline + config_.abort_grace);
    // The clock may be injected; sleep in bounded slices so a fake clock is re-read.
    absl::Duration slice = std::clamp(next - now, absl::Microseconds(100), absl::Milliseconds(20));
    changed_.WaitWithTimeout(&mu_, slice);
  }
}

absl::Status AgentCore::Cancel(HandleId id) {
  absl::MutexLock lock(&mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) return absl::NotFoundError(absl::StrCat("Cancel: no handle ", id));
  if (it->second->state == TransferState::kInProgress) it->second->cancel = true;
  return absl::OkStatus();
}

std::vector<Notification> AgentCore::DrainNotifications(size_t max) {
  absl::MutexLock lock(&mu_);
  std::vector<Notification> out;
  const size_t n = std::min(max, notifications_.size());
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(std::move(notifications_.front()));
    notifications_.pop_front();
  }
  return out;
}

bool AgentCore::WaitForNotifications(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (notifications_.empty()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    changed_.WaitWithTimeout(&mu_, std::min(deadline - now, absl::Milliseconds(20)));
  }
  return true;
}

AgentCounters AgentCore::counters() const {
  int64_t backend = transport_->RequestsInFlight();
  absl::MutexLock lock(&mu_);
  AgentCounters c = counters_;
  c.backend_requests_in_flight = backend;
  c.pending_notifications = static_cast<int64_t>(notifications_.size());
  return c;
}

}  // namespace deepinfer::kv_transfer::internal
