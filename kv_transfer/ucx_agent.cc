#include "kv_transfer/ucx_agent.h"

#include <ucp/api/ucp.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kv_transfer/internal/agent_core.h"
#include "kv_transfer/internal/transport.h"

namespace deepinfer::kv_transfer {
namespace {

using internal::Segment;
using internal::TransportCallbacks;

constexpr unsigned kNotificationAmId = 0x4b56;  // "KV"
// Default UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE (see Init).
constexpr char kTcpSegmentSize[] = "1m";

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX ", what, ": ", ucs_status_string(status)));
}

class UcxTransport;

// Counts a thread in `*count` for its lifetime; wakes waiters on `*count` when it drops to 0.
class IssuingScope {
 public:
  explicit IssuingScope(std::atomic<int>* count) : count_(count) {
    count_->fetch_add(1, std::memory_order_acq_rel);
  }
  ~IssuingScope() {
    if (count_->fetch_sub(1, std::memory_order_acq_rel) == 1) count_->notify_all();
  }
  IssuingScope(const IssuingScope&) = delete;
  IssuingScope& operator=(const IssuingScope&) = delete;

 private:
  std::atomic<int>* const count_;
};

struct UcxLink {
  UcxTransport* transport = nullptr;
  uint64_t cookie = 0;
  ucp_ep_h ep = nullptr;
  std::atomic<bool> failed{false};
  // Readers: posts issuing operations on `ep`. Writer: the progress thread closing it.
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  void* close_request ABSL_GUARDED_BY(mu) = nullptr;  // pending ucp_ep_close_nbx, if any
  std::vector<ucp_rkey_h> rkeys ABSL_GUARDED_BY(mu);
};

struct UcxMemory {
  ucp_mem_h memh = nullptr;
};

struct PostState {
  UcxTransport* transport = nullptr;
  UcxLink* link = nullptr;
  void* context = nullptr;
  absl::string_view notification;
  absl::Status status;  // first error while issuing operations
};

struct RndvReceive {
  UcxTransport* transport = nullptr;
  std::string data;
};

class UcxTransport final : public internal::Transport {
 public:
  static absl::StatusOr<std::unique_ptr<UcxTransport>> Create(const AgentConfig& config) {
    auto t = std::unique_ptr<UcxTransport>(new UcxTransport(config));
    if (absl::Status s = t->Init(); !s.ok()) return s;
    return t;
  }

  ~UcxTransport() override {
    Stop();
    Shutdown();
  }

  void SetCallbacks(TransportCallbacks* callbacks) override { callbacks_ = callbacks; }

  absl::Status SupportsMemoryKind(MemoryKind kind) const override {
    if (kind == MemoryKind::kHost) return absl::OkStatus();
    if (cuda_supported_) return absl::OkStatus();
    return absl::UnimplementedError(
        "UCX backend: expected a UCX build with CUDA memory support for device memory, found "
        "none (ucp_context_query reports no UCS_MEMORY_TYPE_CUDA)");
  }

  absl::Status Start() override {
    absl::MutexLock lock(&state_mu_);
    if (running_.load()) return absl::OkStatus();
    running_.store(true);
    progress_thread_ = std::thread([this] { ProgressLoop(); });
    return absl::OkStatus();
  }

  void Stop() override {
    {
      absl::MutexLock lock(&state_mu_);
      if (stopped_) return;
      stopped_ = true;
      running_.store(false);
    }
    Wake();
    if (progress_thread_.joinable()) progress_thread_.join();
    // From here on only this thread touches the worker: close every endpoint, which fails the
    // operations still in flight, and drive them to completion.
    ProcessQueues();
    std::vector<UcxLink*> links;
    {
      absl::MutexLock lock(&queue_mu_);
      links.assign(links_.begin(), links_.end());
    }
    for (UcxLink* link : links) CloseLink(link);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while ((in_flight_.load() > 0 || !closing_.empty()) && absl::Now() < give_up) {
      ucp_worker_progress(worker_);
      ProcessQueues();
      ReapClosed();
    }
  }

  std::string LocalAddress() const override { return address_; }

  absl::StatusOr<void*> RegisterMemory(void* base, size_t length, MemoryKind kind,
                                       std::string* packed_key) override {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = base;
    params.length = length;
    params.memory_type = UcxMemoryType(kind);
    return MapMemory(params, nullptr, packed_key);
  }

  // UCP_MEM_MAP_ALLOCATE: UCX takes the memory from its allocators in UCX_ALLOC_PRIO order (by
  // default a System V or POSIX shared-memory segment), which the shared-memory transports map
  // into the peer so that its puts and gets are plain copies.
  absl::StatusOr<void*> AllocateMemory(size_t length, MemoryKind kind, void** base,
                                       std::string* packed_key) override {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS | UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = nullptr;
    params.length = length;
    params.flags = UCP_MEM_MAP_ALLOCATE;
    params.memory_type = UcxMemoryType(kind);
    return MapMemory(params, base, packed_key);
  }

  void DeregisterMemory(void* memory) override {
    {
      absl::MutexLock lock(&queue_mu_);
      to_unmap_.push_back(static_cast<UcxMemory*>(memory));
      queued_.store(true, std::memory_order_release);
    }
    Wake();
  }

  absl::StatusOr<void*> Connect(absl::string_view address, uint64_t cookie) override {
    auto link = std::make_unique<UcxLink>();
    link->transport = this;
    link->cookie = cookie;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxTransport::OnEndpointError;
    params.err_handler.arg = link.get();
    ucs_status_t s = ucp_ep_create(worker_, &params, &link->ep);
    if (s == UCS_ERR_UNREACHABLE) {
      // UCX 1.13's shared-memory AM transports (posix, sysv) have no peer failure handler, so
      // with UCX_TLS=sm,self an endpoint can only be made without error handling. Peer death is
      // then noticed through deadlines (the post ends with kDeadlineExceeded and the endpoint is
      // torn down) instead of an endpoint error; add tcp to UCX_TLS for prompt detection.
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      s = ucp_ep_create(worker_, &params, &link->ep);
    }
    if (s != UCS_OK) return UcxError("ucp_ep_create from the peer's worker address", s);
    absl::MutexLock lock(&queue_mu_);
    links_.insert(link.get());
    return link.release();
  }

  absl::StatusOr<void*> UnpackRemoteKey(void* link_ptr, absl::string_view packed_key, uint64_t,
                                        uint64_t) override {
    UcxLink* link = static_cast<UcxLink*>(link_ptr);
    absl::MutexLock lock(&link->mu);
    if (link->closed) return absl::UnavailableError("UCX backend: endpoint already closed");
    ucp_rkey_h rkey = nullptr;
    if (ucs_status_t s = ucp_ep_rkey_unpack(link->ep, packed_key.data(), &rkey); s != UCS_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("UCX ucp_ep_rkey_unpack of a peer region key: ", ucs_status_string(s)));
    }
    link->rkeys.push_back(rkey);
    return rkey;
  }

  void Disconnect(void* link) override {
    {
      absl::MutexLock lock(&queue_mu_);
      to_disconnect_.push_back(static_cast<UcxLink*>(link));
      queued_.store(true, std::memory_order_release);
    }
    Wake();
  }

  void AbortLink(void* link) override {
    {
      absl::MutexLock lock(&queue_mu_);
      to_abort_.push_back(static_cast<UcxLink*>(link));
      queued_.store(true, std::memory_order_release);
    }
    Wake();
  }

  absl::Status PostBatch(void* link_ptr, TransferOp op, absl::Span<const Segment> segments,
                         absl::string_view notification, void* post_context) override {
    UcxLink* link = static_cast<UcxLink*>(link_ptr);
    absl::ReaderMutexLock lock(&link->mu);
    if (link->closed || link->failed.load(std::memory_order_acquire)) {
      return absl::UnavailableError("UCX backend: endpoint to the peer failed or was closed");
    }
    auto* post = new PostState{this, link, post_context, notification, absl::OkStatus()};
    in_flight_.fetch_add(1);
    Wake();
    // Every UCX call below takes the worker lock; the progress loop stands back meanwhile.
    IssuingScope issuing(&issuing_);
    ucp_request_param_t param{};
    for (const Segment& s : segments) {
      param.op_attr_mask = 0;
      if (s.local_memory != nullptr) {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param.memh = static_cast<UcxMemory*>(s.local_memory)->memh;
      }
      ucp_rkey_h rkey = static_cast<ucp_rkey_h>(s.remote_key);
      ucs_status_ptr_t r =
          op == TransferOp::kWrite
              ? ucp_put_nbx(link->ep, s.local_addr, s.length, s.remote_addr, rkey, &param)
              : ucp_get_nbx(link->ep, s.local_addr, s.length, s.remote_addr, rkey, &param);
      if (UCS_PTR_IS_ERR(r)) {
        post->status =
            UcxError(op == TransferOp::kWrite ? "ucp_put_nbx" : "ucp_get_nbx", UCS_PTR_STATUS(r));
        break;
      }
      // The flush below waits for it; the request is released when it completes.
      if (r != nullptr) ucp_request_free(r);
    }
    // Flush: completes once every operation above is complete at the target.
    ucp_request_param_t flush{};
    flush.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    flush.cb.send = &UcxTransport::OnFlushed;
    flush.user_data = post;
    ucs_status_ptr_t r = ucp_ep_flush_nbx(link->ep, &flush);
    if (r == nullptr) {
      AfterFlush(post, UCS_OK, /*in_callback=*/false);
    } else if (UCS_PTR_IS_ERR(r)) {
      AfterFlush(post, UCS_PTR_STATUS(r), /*in_callback=*/false);
    }
    return absl::OkStatus();
  }

  int64_t RequestsInFlight() const override { return in_flight_.load(); }

 private:
  explicit UcxTransport(const AgentConfig& config)
      : spin_before_sleep_(config.ucx_spin_before_sleep),
        idle_sleep_(config.ucx_idle_sleep),
        max_idle_sleep_(std::max(config.ucx_max_idle_sleep, config.ucx_idle_sleep)) {}

  absl::Status Init() {
    ucp_config_t* ucx_config = nullptr;
    if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &ucx_config); s != UCS_OK) {
      return UcxError("ucp_config_read", s);
    }
    // UCX 1.13 emulates puts and gets over TCP with active messages of at most one segment; its
    // default segments (8 KiB out, 64 KiB in) make a 1 MiB block 128 messages, each with its own
    // copies. 1 MiB segments measured several times faster for KV blocks (DESIGN.md, see
    // compare_perftest.sh). UCX_TCP_{TX,RX}_SEG_SIZE in the environment still win. Applied only
    // when TCP may be used (UCX warns about settings no transport takes).
    const char* tls = std::getenv("UCX_TLS");
    const bool tcp_possible = tls == nullptr || std::strstr(tls, "tcp") != nullptr ||
                              std::strstr(tls, "all") != nullptr || tls[0] == '^';
    for (const char* name : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
      if (!tcp_possible || std::getenv(absl::StrCat("UCX_TCP_", name).c_str()) != nullptr) continue;
      // UCT keys go without their transport prefix; only tcp has these two.
      if (ucs_status_t s = ucp_config_modify(ucx_config, name, kTcpSegmentSize); s != UCS_OK) {
        ucp_config_release(ucx_config);
        return UcxError(absl::StrCat("ucp_config_modify ", name, "=", kTcpSegmentSize), s);
      }
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    // Wakeup lets an idle progress thread block on the worker's event fd; a UCX whose transports
    // cannot do it still works, polling (see ProgressLoop).
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    ucs_status_t s = ucp_init(&params, ucx_config, &context_);
    if (s != UCS_OK) {
      params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
      s = ucp_init(&params, ucx_config, &context_);
    }
    ucp_config_release(ucx_config);
    if (s != UCS_OK) return UcxError("ucp_init (check UCX_TLS)", s);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) {
      return absl::InternalError(absl::StrCat("UCX backend: eventfd failed, errno ", errno));
    }

    ucp_context_attr_t cattr{};
    cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(context_, &cattr) == UCS_OK) {
      cuda_supported_ = (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    }

    ucp_worker_params_t wparams{};
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_MULTI;
    if (s = ucp_worker_create(context_, &wparams, &worker_); s != UCS_OK) {
      return UcxError("ucp_worker_create", s);
    }
    ucp_worker_attr_t wattr{};
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    if (s = ucp_worker_query(worker_, &wattr); s != UCS_OK) return UcxError("ucp_worker_query", s);
    if (wattr.thread_mode != UCS_THREAD_MODE_MULTI) {
      return absl::FailedPreconditionError(
          "UCX backend: expected a worker in UCS_THREAD_MODE_MULTI, found a UCX build without "
          "multi-thread support (configure UCX with --enable-mt)");
    }
    if ((params.features & UCP_FEATURE_WAKEUP) == 0 ||
        ucp_worker_get_efd(worker_, &event_fd_) != UCS_OK) {
      event_fd_ = -1;
    }
    ucp_address_t* address = nullptr;
    size_t length = 0;
    if (s = ucp_worker_get_address(worker_, &address, &length); s != UCS_OK) {
      return UcxError("ucp_worker_get_address", s);
    }
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);

    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = kNotificationAmId;
    am.cb = &UcxTransport::OnActiveMessage;
    am.arg = this;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    if (s = ucp_worker_set_am_recv_handler(worker_, &am); s != UCS_OK) {
      return UcxError("ucp_worker_set_am_recv_handler", s);
    }
    return absl::OkStatus();
  }

  void Shutdown() {
    // Anything queued after Stop() (deregistrations, disconnects) is released here.
    ProcessQueues();
    for (UcxLink* link : std::vector<UcxLink*>(links_.begin(), links_.end())) CloseLink(link);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!closing_.empty() && absl::Now() < give_up) {
      ucp_worker_progress(worker_);
      ReapClosed();
    }
    for (UcxMemory* memory : std::vector<UcxMemory*>(memories_.begin(), memories_.end())) {
      ucp_mem_unmap(context_, memory->memh);
      delete memory;
    }
    memories_.clear();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);  // owns event_fd_
    if (context_ != nullptr) ucp_cleanup(context_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  static ucs_memory_type_t UcxMemoryType(MemoryKind kind) {
    return kind == MemoryKind::kHost ? UCS_MEMORY_TYPE_HOST : UCS_MEMORY_TYPE_CUDA;
  }

  // ucp_mem_map + ucp_rkey_pack. With `base` set (allocations) stores the mapped address there.
  absl::StatusOr<void*> MapMemory(const ucp_mem_map_params_t& params, void** base,
                                  std::string* packed_key) {
    auto memory = std::make_unique<UcxMemory>();
    if (ucs_status_t s = ucp_mem_map(context_, &params, &memory->memh); s != UCS_OK) {
      return UcxError(
          absl::StrCat(base != nullptr ? "ucp_mem_map (allocate) of " : "ucp_mem_map of ",
                       params.length, " bytes"),
          s);
    }
    if (base != nullptr) {
      ucp_mem_attr_t attr{};
      attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
      if (ucs_status_t s = ucp_mem_query(memory->memh, &attr); s != UCS_OK) {
        ucp_mem_unmap(context_, memory->memh);
        return UcxError("ucp_mem_query of an allocated region", s);
      }
      *base = attr.address;
    }
    void* buffer = nullptr;
    size_t size = 0;
    if (ucs_status_t s = ucp_rkey_pack(context_, memory->memh, &buffer, &size); s != UCS_OK) {
      ucp_mem_unmap(context_, memory->memh);
      return UcxError("ucp_rkey_pack", s);
    }
    packed_key->assign(static_cast<const char*>(buffer), size);
    ucp_rkey_buffer_release(buffer);
    absl::MutexLock lock(&queue_mu_);
    memories_.insert(memory.get());
    return memory.release();
  }

  // Runs on the progress thread (or the stopping thread once it has joined).
  bool ProcessQueues() {
    // Cheap check first: the progress loop calls this on every turn, and taking queue_mu_ there
    // (an absl::Mutex, with deadlock detection in Debian's build) would cost more than a poll.
    if (!queued_.exchange(false, std::memory_order_acquire)) return false;
    std::vector<PostState*> notify;
    std::vector<UcxLink*> abort;
    std::vector<UcxLink*> disconnect;
    std::vector<UcxMemory*> unmap;
    {
      absl::MutexLock lock(&queue_mu_);
      notify.swap(to_notify_);
      abort.swap(to_abort_);
      disconnect.swap(to_disconnect_);
      unmap.swap(to_unmap_);
    }
    for (PostState* post : notify) SendNotification(post);
    for (UcxLink* link : abort) {
      {
        absl::MutexLock lock(&queue_mu_);
        if (!links_.contains(link)) continue;  // already disconnected and freed
      }
      link->failed = true;
      CloseLinkEndpoint(link);
    }
    for (UcxLink* link : disconnect) CloseLink(link);
    for (UcxMemory* memory : unmap) {
      {
        absl::MutexLock lock(&queue_mu_);
        memories_.erase(memory);
      }
      ucp_mem_unmap(context_, memory->memh);
      delete memory;
    }
    return !(notify.empty() && abort.empty() && disconnect.empty() && unmap.empty());
  }

  // Force-closes the endpoint (failing its in-flight operations); keeps the link object.
  void CloseLinkEndpoint(UcxLink* link) {
    absl::MutexLock lock(&link->mu);
    if (link->closed) return;
    link->closed = true;
    for (ucp_rkey_h rkey : link->rkeys) ucp_rkey_destroy(rkey);
    link->rkeys.clear();
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(link->ep, &param);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) link->close_request = r;
  }

  // Closes the endpoint and frees the link once the close has completed.
  void CloseLink(UcxLink* link) {
    {
      absl::MutexLock lock(&queue_mu_);
      if (links_.erase(link) == 0) return;
    }
    CloseLinkEndpoint(link);
    closing_.push_back(link);
  }

  // Frees links whose endpoint close has completed.
  void ReapClosed() {
    for (size_t i = 0; i < closing_.size();) {
      UcxLink* link = closing_[i];
      {
        absl::MutexLock lock(&link->mu);
        if (link->close_request != nullptr) {
          if (ucp_request_check_status(link->close_request) == UCS_INPROGRESS) {
            ++i;
            continue;
          }
          ucp_request_free(link->close_request);
          link->close_request = nullptr;
        }
      }
      delete link;
      closing_[i] = closing_.back();
      closing_.pop_back();
    }
  }

  void ProgressLoop() {
    absl::Time idle_since = absl::Now();
    absl::Duration sleep = idle_sleep_;
    while (running_.load(std::memory_order_acquire)) {
      if (const int issuing = issuing_.load(std::memory_order_acquire); issuing > 0) {
        // A caller is issuing operations (PostBatch). They take the worker's spin lock, as does
        // ucp_worker_progress; on an oversubscribed machine a lock holder descheduled while the
        // other thread spins for it wastes whole time slices, and even a yielding poller takes
        // CPU from the caller. Operations issued now complete in the caller or need progress only
        // afterwards, so block (futex) until the count changes; the last caller out notifies.
        issuing_.wait(issuing, std::memory_order_acquire);
        continue;
      }
      bool work = ucp_worker_progress(worker_) != 0;
      work |= ProcessQueues();
      if (!closing_.empty()) ReapClosed();
      if (work || in_flight_.load(std::memory_order_relaxed) > 0) {
        idle_since = absl::Time();
        sleep = idle_sleep_;
        continue;
      }
      const absl::Time now = absl::Now();
      if (idle_since == absl::Time()) idle_since = now;
      if (now - idle_since <= spin_before_sleep_) continue;
      // Idle: sleep between polls, longer each time; once the sleeps have reached their longest,
      // block on the worker's event fd (after ucp_worker_arm: UCS_ERR_BUSY means events are
      // pending, so poll again). A caller that posts or queues work writes wake_fd_.
      bool block = false;
      if (event_fd_ >= 0 && sleep >= max_idle_sleep_) {
        const ucs_status_t armed = ucp_worker_arm(worker_);
        if (armed == UCS_ERR_BUSY) continue;
        block = armed == UCS_OK;
      }
      // Wake writes wake_fd_ only while waiting_ is set. Each side stores, fences, then loads
      // what the other stored: either the caller sees waiting_, or this thread sees its work.
      waiting_.store(true, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const bool pending = !running_.load(std::memory_order_relaxed) ||
                           in_flight_.load(std::memory_order_relaxed) > 0 ||
                           queued_.load(std::memory_order_relaxed);
      const bool woken = pending || WaitForWake(block ? kBlockedIdleTimeout : sleep, block);
      waiting_.store(false, std::memory_order_relaxed);
      if (woken) {
        idle_since = absl::Time();  // a caller has work: spin again
        sleep = idle_sleep_;
      } else if (!block) {
        sleep = std::min(sleep * 2, max_idle_sleep_);
      }
    }
  }

  // Ends the progress thread's idle wait (callers that posted or queued work, Stop; call after
  // storing the work). A system call only while the thread waits: posts stay cheap.
  void Wake() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!waiting_.load(std::memory_order_relaxed)) return;
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  // Waits up to `timeout` for Wake (and with `worker_events` for the armed worker's event fd).
  // True when woken by Wake (the count is consumed).
  bool WaitForWake(absl::Duration timeout, bool worker_events) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {event_fd_, POLLIN, 0}};
    const timespec ts = absl::ToTimespec(timeout);
    if (ppoll(fds, worker_events ? 2 : 1, &ts, nullptr) <= 0) return false;
    if ((fds[0].revents & POLLIN) == 0) return false;
    uint64_t count = 0;
    (void)!read(wake_fd_, &count, sizeof(count));
    return true;
  }

  void AfterFlush(PostState* post, ucs_status_t status, bool in_callback) {
    if (status != UCS_OK) {
      Complete(post, UcxError("ucp_ep_flush_nbx", status));
    } else if (!post->status.ok()) {
      Complete(post, post->status);
    } else if (post->notification.empty()) {
      Complete(post, absl::OkStatus());
    } else if (in_callback) {
      // Sending from inside ucp_worker_progress is avoided: the progress loop sends it next.
      absl::MutexLock lock(&queue_mu_);
      to_notify_.push_back(post);
      queued_.store(true, std::memory_order_release);
    } else {
      SendNotification(post);
    }
  }

  // Called with the endpoint known open: from PostBatch (holding link->mu as reader) or from the
  // progress thread (the only thread that closes endpoints).
  void SendNotification(PostState* post) {
    if (!callbacks_->ShouldNotify(post->context)) {
      Complete(post, absl::OkStatus());
      return;
    }
    if (post->link->failed.load()) {
      Complete(post, absl::UnavailableError("UCX backend: endpoint failed before notifying"));
      return;
    }
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &UcxTransport::OnNotificationSent;
    param.user_data = post;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r =
        ucp_am_send_nbx(post->link->ep, kNotificationAmId, nullptr, 0, post->notification.data(),
                        post->notification.size(), &param);
    if (r == nullptr) {
      Complete(post, absl::OkStatus());
    } else if (UCS_PTR_IS_ERR(r)) {
      Complete(post, UcxError("ucp_am_send_nbx (notification)", UCS_PTR_STATUS(r)));
    }
  }

  void Complete(PostState* post, absl::Status status) {
    if (!status.ok() && stopping()) {
      status = absl::CancelledError(absl::StrCat(
          "UCX backend: agent stopped with the post in flight (", status.message(), ")"));
    }
    void* context = post->context;
    delete post;
    // Counted down first so a caller that sees the handle terminal also sees the request gone.
    in_flight_.fetch_sub(1);
    callbacks_->OnPostComplete(context, std::move(status));
  }

  bool stopping() {
    absl::MutexLock lock(&state_mu_);
    return stopped_;
  }

  static void OnFlushed(void* request, ucs_status_t status, void* user_data) {
    auto* post = static_cast<PostState*>(user_data);
    ucp_request_free(request);
    post->transport->AfterFlush(post, status, /*in_callback=*/true);
  }

  static void OnNotificationSent(void* request, ucs_status_t status, void* user_data) {
    auto* post = static_cast<PostState*>(user_data);
    ucp_request_free(request);
    post->transport->Complete(
        post, status == UCS_OK ? absl::OkStatus() : UcxError("notification send", status));
  }

  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* link = static_cast<UcxLink*>(arg);
    link->failed = true;
    link->transport->callbacks_->OnLinkError(link->cookie, UcxError("endpoint error", status));
  }

  static ucs_status_t OnActiveMessage(void* arg, const void*, size_t, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
    auto* t = static_cast<UcxTransport*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0) {
      t->callbacks_->OnNotification(absl::string_view(static_cast<const char*>(data), length));
      return UCS_OK;
    }
    auto* receive = new RndvReceive{t, std::string(length, '\0')};
    ucp_request_param_t rparam{};
    rparam.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rparam.cb.recv_am = &UcxTransport::OnRndvReceived;
    rparam.user_data = receive;
    ucs_status_ptr_t r =
        ucp_am_recv_data_nbx(t->worker_, data, receive->data.data(), length, &rparam);
    if (r == nullptr) {
      OnRndvReceived(nullptr, UCS_OK, length, receive);
    } else if (UCS_PTR_IS_ERR(r)) {
      delete receive;
    }
    return UCS_OK;
  }

  static void OnRndvReceived(void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* receive = static_cast<RndvReceive*>(user_data);
    if (request != nullptr) ucp_request_free(request);
    if (status == UCS_OK) {
      receive->transport->callbacks_->OnNotification(
          absl::string_view(receive->data.data(), length));
    }
    delete receive;
  }

  const absl::Duration spin_before_sleep_;
  const absl::Duration idle_sleep_;
  const absl::Duration max_idle_sleep_;
  // Longest block on the worker's event fd (a safety net: events and Wake end it sooner).
  static constexpr absl::Duration kBlockedIdleTimeout = absl::Milliseconds(100);
  int wake_fd_ = -1;   // eventfd written by Wake
  int event_fd_ = -1;  // the worker's (UCP_FEATURE_WAKEUP), or -1: poll only
  std::atomic<bool> waiting_{false};  // the progress thread is in (or about to enter) a wait
  TransportCallbacks* callbacks_ = nullptr;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  bool cuda_supported_ = false;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int> issuing_{0};  // PostBatch calls issuing operations right now

  absl::Mutex state_mu_;
  std::atomic<bool> running_{false};  // written under state_mu_, read by the progress loop
  bool stopped_ ABSL_GUARDED_BY(state_mu_) = false;
  std::thread progress_thread_;

  absl::Mutex queue_mu_;
  absl::flat_hash_set<UcxLink*> links_ ABSL_GUARDED_BY(queue_mu_);
  std::vector<PostState*> to_notify_ ABSL_GUARDED_BY(queue_mu_);
  std::vector<UcxLink*> to_abort_ ABSL_GUARDED_BY(queue_mu_);
  std::atomic<bool> queued_{false};  // set after pushing to any to_* queue
  std::vector<UcxLink*> to_disconnect_ ABSL_GUARDED_BY(queue_mu_);
  std::vector<UcxMemory*> to_unmap_ ABSL_GUARDED_BY(queue_mu_);
  absl::flat_hash_set<UcxMemory*> memories_ ABSL_GUARDED_BY(queue_mu_);
  // Links being closed, freed once their endpoint close completes; progress thread only.
  std::vector<UcxLink*> closing_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TransferAgent>> CreateUcxAgent(AgentConfig config) {
  if (config.backend != Backend::kUcx) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateUcxAgent: expected backend ucx, found ", BackendName(config.backend)));
  }
  absl::StatusOr<std::unique_ptr<UcxTransport>> transport = UcxTransport::Create(config);
  if (!transport.ok()) return transport.status();
  absl::StatusOr<std::unique_ptr<internal::AgentCore>> core =
      internal::AgentCore::Create(std::move(config), *std::move(transport));
  if (!core.ok()) return core.status();
  return std::unique_ptr<TransferAgent>(std::move(*core));
}

}  // namespace deepinfer::kv_transfer
