#include "router/tenants.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace deepinfer::router {
namespace {

using nlohmann::json;

std::atomic<uint64_t> g_sighups{0};

void OnSighup(int /*signal*/) { g_sighups.fetch_add(1, std::memory_order_relaxed); }

constexpr absl::string_view kRetryMarker = "; retry after ";

bool ValidId(absl::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidHash(absl::string_view hex) {
  if (hex.size() != 64) return false;
  for (char c : hex) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::StatusOr<double> Rate(const json& value, const std::string& field) {
  if (!value.is_number()) return FieldError(field, "expected a number >= 0");
  const double v = value.get<double>();
  if (!std::isfinite(v) || v < 0) return FieldError(field, "expected a number >= 0");
  return v;
}

absl::StatusOr<int64_t> Integer(const json& value, const std::string& field, int64_t lo,
                                int64_t hi) {
  if (!value.is_number_integer()) {
    return FieldError(field, absl::StrCat("expected an integer in [", lo, ", ", hi, "]"));
  }
  const int64_t v = value.get<int64_t>();
  if (v < lo || v > hi) {
    return FieldError(field, absl::StrCat("expected an integer in [", lo, ", ", hi, "]; got ", v));
  }
  return v;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace

struct Tenants::Stream::State {
  absl::Mutex mu;
  bool started ABSL_GUARDED_BY(mu) = false;
  absl::Time refilled ABSL_GUARDED_BY(mu);
  double request_tokens ABSL_GUARDED_BY(mu) = 0;
  double tokens ABSL_GUARDED_BY(mu) = 0;
  double requests_per_second ABSL_GUARDED_BY(mu) = 0;
  double tokens_per_second ABSL_GUARDED_BY(mu) = 0;
  int streams ABSL_GUARDED_BY(mu) = 0;
  std::string id;
  Counter* prompt_tokens = nullptr;
  Counter* completion_tokens = nullptr;
};

absl::StatusOr<TenantTable> ParseTenants(absl::string_view json_text) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("malformed JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("expected a JSON object");
  for (const auto& [key, value] : root.items()) {
    if (key != "tenants") return FieldError(key, "unknown field (expected \"tenants\")");
  }
  if (!root.contains("tenants") || !root["tenants"].is_array()) {
    return FieldError("tenants", "expected an array");
  }
  TenantTable table;
  absl::flat_hash_set<std::string> ids;
  const json& list = root["tenants"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = absl::StrCat("tenants[", i, "]");
    const json& entry = list[i];
    if (!entry.is_object()) return FieldError(at, "expected an object");
    auto tenant = std::make_shared<Tenant>();
    std::vector<std::string> hashes;
    bool has_id = false;
    bool has_keys = false;
    for (const auto& [key, value] : entry.items()) {
      const std::string field = absl::StrCat(at, ".", key);
      if (key == "id") {
        if (!value.is_string() || !ValidId(value.get<std::string>())) {
          return FieldError(field, "expected 1-64 characters of [A-Za-z0-9_.-]");
        }
        tenant->id = value.get<std::string>();
        has_id = true;
      } else if (key == "key_sha256") {
        if (!value.is_array() || value.empty()) {
          return FieldError(field, "expected a non-empty array of SHA-256 hex digests");
        }
        for (size_t k = 0; k < value.size(); ++k) {
          if (!value[k].is_string() || !ValidHash(value[k].get<std::string>())) {
            return FieldError(absl::StrCat(field, "[", k, "]"),
                              "expected 64 lowercase hex digits (printf %s KEY | sha256sum)");
          }
          hashes.push_back(value[k].get<std::string>());
        }
        has_keys = true;
      } else if (key == "cache_namespace") {
        if (!value.is_string() || value.get<std::string>().empty() ||
            value.get<std::string>().size() > 128) {
          return FieldError(field, "expected a string of 1-128 bytes");
        }
        tenant->cache_namespace = value.get<std::string>();
      } else if (key == "allow_client_cache_salt") {
        if (!value.is_boolean()) return FieldError(field, "expected true or false");
        tenant->allow_client_cache_salt = value.get<bool>();
      } else if (key == "models") {
        if (!value.is_array()) return FieldError(field, "expected an array of model ids");
        for (size_t k = 0; k < value.size(); ++k) {
          if (!value[k].is_string() || value[k].get<std::string>().empty()) {
            return FieldError(absl::StrCat(field, "[", k, "]"), "expected a model id");
          }
          tenant->models.push_back(value[k].get<std::string>());
        }
      } else if (key == "max_priority") {
        auto v = Integer(value, field, -100, 100);
        if (!v.ok()) return v.status();
        tenant->max_priority = static_cast<int32_t>(*v);
      } else if (key == "requests_per_second") {
        auto v = Rate(value, field);
        if (!v.ok()) return v.status();
        tenant->requests_per_second = *v;
      } else if (key == "tokens_per_second") {
        auto v = Rate(value, field);
        if (!v.ok()) return v.status();
        tenant->tokens_per_second = *v;
      } else if (key == "max_concurrent_streams") {
        auto v = Integer(value, field, 0, 1 << 20);
        if (!v.ok()) return v.status();
        tenant->max_concurrent_streams = static_cast<int>(*v);
      } else {
        return FieldError(field, "unknown field");
      }
    }
    if (!has_id) return FieldError(absl::StrCat(at, ".id"), "missing");
    if (!has_keys) return FieldError(absl::StrCat(at, ".key_sha256"), "missing");
    if (tenant->id == kAnonymousTenant) {
      return FieldError(absl::StrCat(at, ".id"), "\"anonymous\" is reserved");
    }
    if (!ids.insert(tenant->id).second) {
      return FieldError(absl::StrCat(at, ".id"), absl::StrCat("duplicate id \"", tenant->id, "\""));
    }
    if (tenant->cache_namespace.empty()) tenant->cache_namespace = tenant->id;
    for (size_t k = 0; k < hashes.size(); ++k) {
      if (!table.by_key_sha256.emplace(hashes[k], tenant).second) {
        return FieldError(absl::StrCat(at, ".key_sha256[", k, "]"),
                          "this key is already listed (keys must be unique)");
      }
    }
    table.tenants.push_back(std::move(tenant));
  }
  return table;
}

std::string HashApiKey(absl::string_view key) { return HexLower(Sha256(key)); }

absl::StatusOr<std::string> BearerKey(absl::string_view authorization) {
  absl::string_view v = absl::StripAsciiWhitespace(authorization);
  if (v.size() < 7 || !absl::EqualsIgnoreCase(v.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError(
        "authorization: expected \"Bearer <API key>\"");
  }
  v = absl::StripAsciiWhitespace(v.substr(7));
  if (v.empty()) return absl::UnauthenticatedError("authorization: empty API key");
  return std::string(v);
}

int64_t RetryAfterSeconds(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kResourceExhausted) return 0;
  absl::string_view m = status.message();
  const size_t at = m.rfind(kRetryMarker);
  if (at == absl::string_view::npos) return 0;
  m.remove_prefix(at + kRetryMarker.size());
  absl::ConsumeSuffix(&m, "s");
  int64_t s = 0;
  if (!absl::SimpleAtoi(m, &s)) return 0;
  return std::max<int64_t>(1, s);
}

absl::StatusOr<std::unique_ptr<Tenants>> Tenants::Create(TenantsOptions options) {
  if (options.file.empty() && !options.allow_anonymous) {
    return absl::InvalidArgumentError(
        "--tenants_file: no tenants file and --allow_anonymous is not set: nobody could call "
        "this router (set --tenants_file, or --allow_anonymous for a local, trusted setup)");
  }
  std::unique_ptr<Tenants> tenants(new Tenants(std::move(options)));
  if (tenants->options_.metrics != nullptr) {
    MetricsRegistry* m = tenants->options_.metrics;
    auto requests = m->AddCounterFamily("deepinfer_tenant_requests_total",
                                        "Requests admitted, by tenant.", {"tenant"});
    auto tokens = m->AddCounterFamily("deepinfer_tenant_tokens_total",
                                      "Prompt and completion tokens, by tenant.",
                                      {"tenant", "kind"});
    auto rejections = m->AddCounterFamily("deepinfer_tenant_rejections_total",
                                          "Requests refused by tenant checks, by reason.",
                                          {"tenant", "reason"});
    if (!requests.ok()) return requests.status();
    if (!tokens.ok()) return tokens.status();
    if (!rejections.ok()) return rejections.status();
    tenants->requests_ = *requests;
    tenants->tokens_ = *tokens;
    tenants->rejections_ = *rejections;
  }
  if (!tenants->options_.file.empty()) {
    if (absl::Status s = tenants->Load(/*initial=*/true); !s.ok()) return s;
  } else {
    absl::MutexLock lock(&tenants->mu_);
    tenants->table_ = std::make_shared<TenantTable>();
  }
  return tenants;
}

Tenants::Tenants(TenantsOptions options) : options_(std::move(options)) {
  auto anonymous = std::make_shared<Tenant>();
  anonymous->id = std::string(kAnonymousTenant);
  anonymous->allow_client_cache_salt = true;
  anonymous->max_priority = 100;
  anonymous_ = std::move(anonymous);
  seen_sighups_ = g_sighups.load();
}

Tenants::~Tenants() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

absl::Status Tenants::Load(bool initial) {
  const std::string& path = options_.file;
  struct stat st {};
  int64_t mtime = -1;
  int64_t size = -1;
  if (::stat(path.c_str(), &st) == 0) {
    mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    size = static_cast<int64_t>(st.st_size);
  }
  {
    absl::MutexLock lock(&mu_);
    file_mtime_ns_ = mtime;
    file_size_ = size;
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  absl::StatusOr<TenantTable> table =
      text.ok() ? ParseTenants(*text) : absl::StatusOr<TenantTable>(text.status());
  if (!table.ok()) {
    absl::Status error(table.status().code(),
                       absl::StrCat("--tenants_file ", path, ": ", table.status().message()));
    if (!initial) spdlog::error("tenants: reload failed, keeping the previous table: {}",
                                std::string(error.message()));
    return error;
  }
  const size_t count = table->tenants.size();
  {
    absl::MutexLock lock(&mu_);
    table_ = std::make_shared<const TenantTable>(std::move(*table));
  }
  spdlog::info("tenants: {} {} from {}", initial ? "loaded" : "reloaded", count, path);
  return absl::OkStatus();
}

absl::Status Tenants::Reload() {
  if (options_.file.empty()) return absl::OkStatus();
  return Load(/*initial=*/false);
}

void Tenants::ReloadIfChanged() {
  if (options_.file.empty()) return;
  struct stat st {};
  int64_t mtime = -1;
  int64_t size = -1;
  if (::stat(options_.file.c_str(), &st) == 0) {
    mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    size = static_cast<int64_t>(st.st_size);
  }
  const uint64_t sighups = g_sighups.load();
  bool changed;
  {
    absl::MutexLock lock(&mu_);
    changed = mtime != file_mtime_ns_ || size != file_size_ || sighups != seen_sighups_;
    seen_sighups_ = sighups;
  }
  if (changed) (void)Reload();
}

void Tenants::Watch(absl::Duration interval) {
  if (watcher_.joinable() || options_.file.empty()) return;
  watcher_ = std::thread([this, interval] {
    while (!stop_.WaitForNotificationWithTimeout(interval)) ReloadIfChanged();
  });
}

void Tenants::InstallReloadOnSighup() {
  struct sigaction action {};
  action.sa_handler = OnSighup;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGHUP, &action, nullptr);
}

absl::StatusOr<std::shared_ptr<const Tenant>> Tenants::Authenticate(
    std::optional<absl::string_view> authorization) {
  // Without a tenants file there is nobody but anonymous: a key is not checked (clients such as
  // the openai SDK always send one).
  if (options_.file.empty()) return anonymous_;
  if (!authorization.has_value()) {
    if (options_.allow_anonymous) return anonymous_;
    RecordRejection(nullptr, "unauthenticated");
    return absl::UnauthenticatedError(
        "authorization: missing; send \"authorization: Bearer <API key>\"");
  }
  absl::StatusOr<std::string> key = BearerKey(*authorization);
  if (!key.ok()) {
    RecordRejection(nullptr, "unauthenticated");
    return key.status();
  }
  std::shared_ptr<const TenantTable> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  auto it = table->by_key_sha256.find(HashApiKey(*key));
  if (it == table->by_key_sha256.end()) {
    RecordRejection(nullptr, "unauthenticated");
    return absl::UnauthenticatedError("authorization: unknown API key");
  }
  return it->second;
}

absl::Status Tenants::CheckModel(const Tenant& tenant, absl::string_view model) {
  if (tenant.models.empty() ||
      std::find(tenant.models.begin(), tenant.models.end(), model) != tenant.models.end()) {
    return absl::OkStatus();
  }
  RecordRejection(&tenant, "model");
  return absl::PermissionDeniedError(
      absl::StrCat("model: tenant \"", tenant.id, "\" may not use model \"", model, "\""));
}

absl::Status Tenants::CheckPriority(const Tenant& tenant, int32_t priority) {
  // Out of the API's range: request validation refuses it as kInvalidArgument naming priority.
  if (priority <= tenant.max_priority || priority > 100) return absl::OkStatus();
  RecordRejection(&tenant, "priority");
  return absl::PermissionDeniedError(absl::StrCat("priority: tenant \"", tenant.id,
                                                  "\" may use at most ", tenant.max_priority,
                                                  "; got ", priority));
}

absl::StatusOr<std::unique_ptr<Tenants::Stream>> Tenants::Admit(const Tenant& tenant) {
  std::shared_ptr<Stream::State> state;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Stream::State>& slot = state_[tenant.id];
    if (slot == nullptr) {
      slot = std::make_shared<Stream::State>();
      slot->id = tenant.id;
      if (tokens_ != nullptr) {
        slot->prompt_tokens = tokens_->WithLabels({tenant.id, "prompt"}).value_or(nullptr);
        slot->completion_tokens = tokens_->WithLabels({tenant.id, "completion"}).value_or(nullptr);
      }
    }
    state = slot;
  }
  const absl::Time now = options_.clock();
  std::string refused;
  double wait_s = 0;
  {
    absl::MutexLock lock(&state->mu);
    const double rps = tenant.requests_per_second;
    const double tps = tenant.tokens_per_second;
    const double request_burst = std::max(1.0, rps);
    const double token_burst = std::max(1.0, tps);
    if (!state->started) {
      state->started = true;
      state->request_tokens = request_burst;
      state->tokens = token_burst;
    } else {
      // Refilled at the current limits (a reload applies from now on).
      const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - state->refilled));
      state->request_tokens = std::min(request_burst, state->request_tokens + elapsed * rps);
      state->tokens = std::min(token_burst, state->tokens + elapsed * tps);
    }
    state->requests_per_second = rps;
    state->tokens_per_second = tps;
    state->refilled = now;
    if (tenant.max_concurrent_streams > 0 && state->streams >= tenant.max_concurrent_streams) {
      refused = "concurrent_streams";
      wait_s = 1;
    } else if (rps > 0 && state->request_tokens < 1) {
      refused = "requests_per_second";
      wait_s = (1 - state->request_tokens) / rps;
    } else if (tps > 0 && state->tokens < 0) {
      refused = "tokens_per_second";
      wait_s = -state->tokens / tps;
    } else {
      if (rps > 0) state->request_tokens -= 1;
      ++state->streams;
    }
  }
  if (!refused.empty()) {
    RecordRejection(&tenant, refused);
    const int64_t retry = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(wait_s)));
    std::string limit;
    if (refused == "concurrent_streams") {
      limit = absl::StrCat("max_concurrent_streams (", tenant.max_concurrent_streams, ")");
    } else if (refused == "requests_per_second") {
      limit = absl::StrCat("requests_per_second (", tenant.requests_per_second, ")");
    } else {
      limit = absl::StrCat("tokens_per_second (", tenant.tokens_per_second, ")");
    }
    return absl::ResourceExhaustedError(absl::StrCat("tenant \"", tenant.id, "\" is over its ",
                                                     limit, kRetryMarker, retry, "s"));
  }
  if (requests_ != nullptr) {
    if (auto c = requests_->WithLabels({tenant.id}); c.ok()) (*c)->Increment();
  }
  return std::unique_ptr<Stream>(new Stream(this, std::move(state)));
}

Tenants::Stream::~Stream() {
  absl::MutexLock lock(&state_->mu);
  --state_->streams;
}

void Tenants::Stream::ChargePromptTokens(int64_t tokens) {
  if (tokens <= 0) return;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->tokens_per_second > 0) state_->tokens -= static_cast<double>(tokens);
  }
  if (state_->prompt_tokens != nullptr) state_->prompt_tokens->Increment(static_cast<double>(tokens));
}

void Tenants::Stream::ChargeCompletionTokens(int64_t tokens) {
  if (tokens <= 0) return;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->tokens_per_second > 0) state_->tokens -= static_cast<double>(tokens);
  }
  if (state_->completion_tokens != nullptr) {
    state_->completion_tokens->Increment(static_cast<double>(tokens));
  }
}

std::string Tenants::CacheSalt(const Tenant& tenant, absl::string_view client_salt) {
  if (tenant.allow_client_cache_salt) {
    if (!client_salt.empty() || tenant.cache_namespace.empty()) return std::string(client_salt);
  }
  return absl::StrCat("tenant:", tenant.cache_namespace);
}

void Tenants::RecordRejection(const Tenant* tenant, absl::string_view reason) {
  if (rejections_ == nullptr) return;
  const std::string label = tenant == nullptr ? "unauthenticated" : tenant->id;
  if (auto c = rejections_->WithLabels({label, std::string(reason)}); c.ok()) (*c)->Increment();
}

}  // namespace deepinfer::router
