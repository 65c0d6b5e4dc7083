// Who is calling the router, and what they may do: tenants with API keys and per-tenant limits.
//
// The tenants file (--tenants_file) is JSON:
//
//   {"tenants": [
//     {"id": "acme",                      // [A-Za-z0-9_.-]{1,64}, unique; the metrics label
//      "key_sha256": ["<64 hex>", ...],   // SHA-256 of each API key, lowercase hex; >= 1, unique
//      "cache_namespace": "acme",         // optional, default: the id
//      "allow_client_cache_salt": false,  // optional
//      "models": ["llama"],               // optional; absent or empty: every model
//      "max_priority": 0,                 // optional, -100..100, default 0
//      "requests_per_second": 10,         // optional, >= 0; 0 or absent: unlimited
//      "tokens_per_second": 5000,         // optional, >= 0; prompt + completion tokens
//      "max_concurrent_streams": 4}]}     // optional, >= 0; 0 or absent: unlimited
//
// Keys are never stored, only their hashes (HashApiKey; `printf %s "$KEY" | sha256sum`). Unknown
// fields are refused (a typo must not silently drop a limit). Errors name the field:
// "tenants[1].key_sha256[0]: expected 64 lowercase hex digits".
//
// A call presents its key as `authorization: Bearer <key>` (gRPC metadata; the HTTP API forwards
// its Authorization header). Refusals, in order:
//   - no key (and anonymous access off), a malformed header, an unknown key -> kUnauthenticated;
//   - a tenant not allowed the requested model, or a priority above its max_priority ->
//     kPermissionDenied (priorities are refused rather than clamped: a client that asks for more
//     than it may have should learn so, not be silently demoted);
//   - over requests_per_second, tokens_per_second or max_concurrent_streams ->
//     kResourceExhausted naming the limit, with the seconds to wait (RetryAfterSeconds).
// Limits are token buckets refilled continuously with one second of burst: requests_per_second
// admits at most max(1, rate) requests at once; tokens_per_second is charged the prompt tokens
// when a request is admitted and its completion tokens when it ends, may go into debt
// (a request is never refused for its own size), and refuses new requests while in debt. The
// bucket state of a tenant id survives reloads.
//
// Anonymous calls (no authorization metadata) are served only with allow_anonymous, as the
// "anonymous" tenant: no limits, any priority, and the client's own cache salt. Without a tenants
// file every call is anonymous and a key it sends is ignored (the openai SDK always sends one);
// with a file, a key that is sent must be valid even when anonymous calls are allowed.
//
// Cache isolation: CacheSalt gives the salt a request's prefix-cache hashes use: the tenant's
// cache namespace, so two tenants never share blocks or see each other's cached_tokens; a tenant
// with allow_client_cache_salt sends its own salt instead (empty: its namespace), e.g. a trusted
// gateway that isolates its own users.
//
// Reload: Reload() reads the file again; a file that does not parse leaves the previous table in
// place and the error is logged. Watch() polls the file's modification time and size, and reloads
// when they change or when SIGHUP arrived (InstallReloadOnSighup).
//
// Metrics (with a MetricsRegistry): deepinfer_tenant_requests_total{tenant},
// deepinfer_tenant_tokens_total{tenant,kind="prompt"|"completion"},
// deepinfer_tenant_rejections_total{tenant,reason}. The tenant label is a configured id or
// "anonymous"; calls refused before a tenant is known count as "unauthenticated". Reasons:
// unauthenticated, model, priority, requests_per_second, tokens_per_second, concurrent_streams.
//
// Thread-safety: every method is thread-safe.
#ifndef DEEPINFER_ROUTER_TENANTS_H_
#define DEEPINFER_ROUTER_TENANTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace deepinfer::router {

struct Tenant {
  std::string id;
  std::string cache_namespace;
  bool allow_client_cache_salt = false;
  std::vector<std::string> models;  // empty: every model
  int32_t max_priority = 0;
  double requests_per_second = 0;  // 0: unlimited
  double tokens_per_second = 0;    // 0: unlimited
  int max_concurrent_streams = 0;  // 0: unlimited
};

// The id anonymous calls are served as.
inline constexpr absl::string_view kAnonymousTenant = "anonymous";

struct TenantTable {
  std::vector<std::shared_ptr<const Tenant>> tenants;
  absl::flat_hash_map<std::string, std::shared_ptr<const Tenant>> by_key_sha256;
};

// kInvalidArgument naming the field for anything that is not the format above.
absl::StatusOr<TenantTable> ParseTenants(absl::string_view json_text);

// SHA-256 of `key`, lowercase hex: what key_sha256 holds.
std::string HashApiKey(absl::string_view key);

// "Bearer <key>" -> key; kUnauthenticated for anything else.
absl::StatusOr<std::string> BearerKey(absl::string_view authorization);

// The seconds a kResourceExhausted status from Tenants says to wait (>= 1), 0 for other statuses.
int64_t RetryAfterSeconds(const absl::Status& status);

struct TenantsOptions {
  std::string file;  // empty: no keys (then allow_anonymous must be set)
  bool allow_anonymous = false;
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  MetricsRegistry* metrics = nullptr;  // not owned; null: no metrics
};

class Tenants {
 public:
  // kInvalidArgument when neither a file nor allow_anonymous is given, or the file does not
  // parse ("--tenants_file <path>: tenants[0].id: ..."); kNotFound when it cannot be read.
  static absl::StatusOr<std::unique_ptr<Tenants>> Create(TenantsOptions options);
  ~Tenants();
  Tenants(const Tenants&) = delete;
  Tenants& operator=(const Tenants&) = delete;

  // Reads the file again; on error the table in use stays and the error is returned and logged.
  absl::Status Reload();
  // Reloads when the file's modification time or size changed since the last attempt, or a
  // SIGHUP arrived since.
  void ReloadIfChanged();
  // A thread that calls ReloadIfChanged every `interval` until destruction.
  void Watch(absl::Duration interval);

  // The tenant of a call from its authorization value (nullopt: none was sent).
  absl::StatusOr<std::shared_ptr<const Tenant>> Authenticate(
      std::optional<absl::string_view> authorization);
  // kPermissionDenied when `tenant` may not use `model`.
  absl::Status CheckModel(const Tenant& tenant, absl::string_view model);
  // kPermissionDenied for a priority above the tenant's max_priority; one above 100 (out of the
  // API's range) passes, for request validation to refuse as kInvalidArgument.
  absl::Status CheckPriority(const Tenant& tenant, int32_t priority);

  // A running stream of a tenant: holds one of its concurrent-stream slots until destroyed.
  class Stream {
   public:
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    void ChargePromptTokens(int64_t tokens);
    void ChargeCompletionTokens(int64_t tokens);

   private:
    friend class Tenants;
    struct State;
    Stream(Tenants* owner, std::shared_ptr<State> state) : owner_(owner), state_(state) {}
    Tenants* const owner_;
    const std::shared_ptr<State> state_;
  };
  // Admits one request of `tenant` against its limits; kResourceExhausted naming the limit.
  absl::StatusOr<std::unique_ptr<Stream>> Admit(const Tenant& tenant);

  // The cache salt of a request of `tenant` whose client sent `client_salt`.
  static std::string CacheSalt(const Tenant& tenant, absl::string_view client_salt);

  // Counts a refusal for the metrics (tenant null: before a tenant was known).
  void RecordRejection(const Tenant* tenant, absl::string_view reason);

  // Installs a SIGHUP handler that makes every Tenants reload at its next ReloadIfChanged.
  static void InstallReloadOnSighup();

 private:
  struct Counters;
  explicit Tenants(TenantsOptions options);
  absl::Status Load(bool initial);
  Counters* CountersFor(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  const TenantsOptions options_;
  std::shared_ptr<const Tenant> anonymous_;
  CounterFamily* requests_ = nullptr;
  CounterFamily* tokens_ = nullptr;
  CounterFamily* rejections_ = nullptr;

  absl::Mutex mu_;
  std::shared_ptr<const TenantTable> table_ ABSL_GUARDED_BY(mu_);
  int64_t file_mtime_ns_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t file_size_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t seen_sighups_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<Stream::State>> state_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_;
  std::thread watcher_;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_TENANTS_H_
