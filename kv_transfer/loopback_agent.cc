#include "kv_transfer/loopback_agent.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/internal/agent_core.h"
#include "kv_transfer/internal/transport.h"

namespace deepinfer::kv_transfer {
namespace {

using internal::Segment;
using internal::TransportCallbacks;

// The part of a loopback transport that peers reach: its callbacks and its registered ranges.
// Lock order: mu before ranges_mu. A post holds mu (shared) while it calls the target's callbacks,
// which take the target core's mutex; DeregisterMemory runs under that core mutex and so may take
// only ranges_mu, which nobody holds while calling out.
struct Endpoint {
  absl::Mutex mu;
  TransportCallbacks* callbacks ABSL_GUARDED_BY(mu) = nullptr;  // null once stopped
  absl::Mutex ranges_mu;
  std::map<uintptr_t, uint64_t> ranges ABSL_GUARDED_BY(ranges_mu);  // base -> length

  bool CoversLocked(uint64_t addr, uint64_t length) const ABSL_SHARED_LOCKS_REQUIRED(ranges_mu) {
    auto it = ranges.upper_bound(addr);
    if (it == ranges.begin()) return false;
    --it;
    return addr >= it->first && length <= it->second - (addr - it->first);
  }
};

class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();
    return *registry;
  }
  std::string Add(std::shared_ptr<Endpoint> endpoint) {
    absl::MutexLock lock(&mu_);
    std::string address = absl::StrCat("loopback/", next_++);
    endpoints_[address] = std::move(endpoint);
    return address;
  }
  void Remove(absl::string_view address) {
    absl::MutexLock lock(&mu_);
    endpoints_.erase(std::string(address));
  }
  std::shared_ptr<Endpoint> Find(absl::string_view address) {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(std::string(address));
    return it == endpoints_.end() ? nullptr : it->second;
  }

 private:
  absl::Mutex mu_;
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, std::shared_ptr<Endpoint>> endpoints_ ABSL_GUARDED_BY(mu_);
};

struct Link {
  std::shared_ptr<Endpoint> target;
  std::string address;
  uint64_t cookie = 0;
  std::atomic<bool> aborted{false};
};

class LoopbackTransport final : public internal::Transport {
 public:
  LoopbackTransport() : endpoint_(std::make_shared<Endpoint>()) {
    address_ = Registry::Get().Add(endpoint_);
  }
  ~LoopbackTransport() override {
    Stop();
    Registry::Get().Remove(address_);
    for (auto& [link, owned] : links_) delete link;
    for (void* memory : allocated_) std::free(memory);
  }

  void SetCallbacks(TransportCallbacks* callbacks) override {
    callbacks_ = callbacks;
    absl::MutexLock lock(&endpoint_->mu);
    endpoint_->callbacks = callbacks;
  }
  absl::Status SupportsMemoryKind(MemoryKind kind) const override {
    if (kind == MemoryKind::kHost) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat("loopback backend: expected host memory, found ",
                                                 MemoryKindName(kind),
                                                 " (the loopback backend copies with memcpy)"));
  }
  absl::Status Start() override { return absl::OkStatus(); }
  void Stop() override {
    {
      absl::MutexLock lock(&endpoint_->mu);
      endpoint_->callbacks = nullptr;
    }
    Registry::Get().Remove(address_);
  }
  std::string LocalAddress() const override { return address_; }

  absl::StatusOr<void*> RegisterMemory(void* base, size_t length, MemoryKind kind,
                                       std::string* packed_key) override {
    packed_key->assign("loopback");
    absl::MutexLock lock(&endpoint_->ranges_mu);
    endpoint_->ranges[reinterpret_cast<uintptr_t>(base)] = length;
    return base;
  }
  absl::StatusOr<void*> AllocateMemory(size_t length, MemoryKind kind, void** base,
                                       std::string* packed_key) override {
    // Page aligned, like the shared-memory segments UCX allocates.
    constexpr size_t kPage = 4096;
    void* memory = std::aligned_alloc(kPage, (length + kPage - 1) / kPage * kPage);
    if (memory == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("loopback backend: could not allocate ", length, " bytes"));
    }
    {
      absl::MutexLock lock(&mu_);
      allocated_.insert(memory);
    }
    *base = memory;
    return RegisterMemory(memory, length, kind, packed_key);
  }
  void DeregisterMemory(void* memory) override {
    {
      absl::MutexLock lock(&endpoint_->ranges_mu);
      endpoint_->ranges.erase(reinterpret_cast<uintptr_t>(memory));
    }
    absl::MutexLock lock(&mu_);
    if (allocated_.erase(memory) > 0) std::free(memory);
  }

  absl::StatusOr<void*> Connect(absl::string_view address, uint64_t cookie) override {
    std::shared_ptr<Endpoint> target = Registry::Get().Find(address);
    if (target == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("loopback backend: no live agent at address '", address, "'"));
    }
    auto* link = new Link();
    link->target = std::move(target);
    link->address = std::string(address);
    link->cookie = cookie;
    absl::MutexLock lock(&mu_);
    links_[link] = true;
    return link;
  }
  absl::StatusOr<void*> UnpackRemoteKey(void* link, absl::string_view packed_key, uint64_t base,
                                        uint64_t length) override {
    if (packed_key != "loopback") {
      return absl::InvalidArgumentError("loopback backend: expected a loopback remote key");
    }
    return link;  // ranges are checked against the target's registrations at post time
  }
  void Disconnect(void* link) override {
    absl::MutexLock lock(&mu_);
    if (links_.erase(static_cast<Link*>(link)) > 0) delete static_cast<Link*>(link);
  }
  void AbortLink(void* link) override { static_cast<Link*>(link)->aborted = true; }

  absl::Status PostBatch(void* link_ptr, TransferOp op, absl::Span<const Segment> segments,
                         absl::string_view notification, void* post_context) override {
    Link* link = static_cast<Link*>(link_ptr);
    Endpoint& target = *link->target;
    {
      absl::ReaderMutexLock lock(&target.mu);
      if (link->aborted || target.callbacks == nullptr) {
        return absl::UnavailableError(
            absl::StrCat("loopback backend: peer at '", link->address, "' is ",
                         link->aborted ? "disconnected (link aborted)" : "gone (agent stopped)"));
      }
      {
        absl::ReaderMutexLock ranges_lock(&target.ranges_mu);
        for (const Segment& s : segments) {
          if (!target.CoversLocked(s.remote_addr, s.length)) {
            return absl::FailedPreconditionError(
                absl::StrCat("loopback backend: remote range [", s.remote_addr, ", +", s.length,
                             ") is no longer registered at peer '", link->address, "'"));
          }
        }
        for (const Segment& s : segments) {
          void* remote = reinterpret_cast<void*>(s.remote_addr);
          if (op == TransferOp::kWrite) {
            std::memmove(remote, s.local_addr, s.length);
          } else {
            std::memmove(s.local_addr, remote, s.length);
          }
        }
      }
      if (!notification.empty() && callbacks_->ShouldNotify(post_context)) {
        target.callbacks->OnNotification(notification);
      }
    }
    callbacks_->OnPostComplete(post_context, absl::OkStatus());
    return absl::OkStatus();
  }

  int64_t RequestsInFlight() const override { return 0; }

 private:
  TransportCallbacks* callbacks_ = nullptr;
  std::shared_ptr<Endpoint> endpoint_;
  std::string address_;
  absl::Mutex mu_;
  absl::flat_hash_map<Link*, bool> links_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<void*> allocated_ ABSL_GUARDED_BY(mu_);  // by AllocateMemory, not freed
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferAgent>> CreateLoopbackAgent(AgentConfig config) {
  if (config.backend != Backend::kLoopback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CreateLoopbackAgent: expected backend loopback, found ", BackendName(config.backend)));
  }
  absl::StatusOr<std::unique_ptr<internal::AgentCore>> core =
      internal::AgentCore::Create(std::move(config), std::make_unique<LoopbackTransport>());
  if (!core.ok()) return core.status();
  return std::unique_ptr<TransferAgent>(std::move(*core));
}

}  // namespace deepinfer::kv_transfer
