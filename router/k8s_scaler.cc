#include "router/k8s_scaler.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace deepinfer::router {
namespace {

// curl_global_init is not guaranteed thread-safe on every libcurl build: run it exactly once.
void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// RFC 1123 subdomain, as Kubernetes checks object names: lower-case alphanumerics, '-' and '.',
// starting and ending alphanumeric, at most 253 characters.
bool IsDns1123Subdomain(absl::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(name.front()) || !alnum(name.back())) return false;
  for (char c : name) {
    if (!alnum(c) && c != '-' && c != '.') return false;
  }
  return true;
}

// RFC 1123 label (namespaces): as above without '.', at most 63 characters.
bool IsDns1123Label(absl::string_view name) {
  return name.size() <= 63 && IsDns1123Subdomain(name) && !absl::StrContains(name, '.');
}

absl::StatusOr<std::string> ReadFile(absl::string_view field, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": cannot read \"", path, "\": no such file or not readable"));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

size_t AppendToString(char* data, size_t size, size_t nmemb, void* user) {
  static_cast<std::string*>(user)->append(data, size * nmemb);
  return size * nmemb;
}

// The API server's explanation from a metav1.Status body, or a short excerpt of the body.
std::string ServerMessage(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    return j["message"].get<std::string>();
  }
  std::string excerpt = body.substr(0, 200);
  absl::StripAsciiWhitespace(&excerpt);
  return excerpt;
}

absl::StatusCode CodeForHttpStatus(long http_status) {
  switch (http_status) {
    case 400:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 409:
      return absl::StatusCode::kAborted;
    case 429:
      return absl::StatusCode::kResourceExhausted;
    default:
      return http_status >= 500 && http_status <= 599 ? absl::StatusCode::kUnavailable
                                                      : absl::StatusCode::kUnknown;
  }
}

absl::StatusCode CodeForCurlError(CURLcode code) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case CURLE_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
      return absl::StatusCode::kInvalidArgument;
    default:
      // Refused, reset, unresolvable, TLS handshake or verification failures: the peer is not
      // usable now; retry later (or fix the CA, which the message names).
      return absl::StatusCode::kUnavailable;
  }
}

// Scale.spec.replicas from a 2xx body (0 when spec.replicas is absent, as the API omits 0).
absl::StatusOr<int> ParseScaleReplicas(const std::string& what, const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("kind", "") != "Scale") {
    return absl::InternalError(absl::StrCat(
        what, ": expected an autoscaling/v1 Scale object, got \"", body.substr(0, 200), "\""));
  }
  if (!j.contains("spec") || !j["spec"].is_object() || !j["spec"].contains("replicas")) return 0;
  const nlohmann::json& r = j["spec"]["replicas"];
  if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > (1 << 30)) {
    return absl::InternalError(
        absl::StrCat(what, ": Scale.spec.replicas: expected an integer >= 0, got ", r.dump()));
  }
  return r.get<int>();
}

absl::Status CheckUrl(const std::string& url) {
  const bool http = absl::StartsWith(url, "http://");
  const bool https = absl::StartsWith(url, "https://");
  absl::string_view rest = absl::string_view(url).substr(http ? 7 : 8);
  if ((!http && !https) || rest.empty() || absl::StrContains(rest, '/') ||
      absl::StrContains(rest, '?') || absl::StrContains(rest, '#') ||
      absl::StrContains(rest, '@')) {
    return absl::InvalidArgumentError(absl::StrCat(
        "api_server: expected \"http(s)://host[:port]\" without a path, got \"", url, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<K8sScaler>> K8sScaler::Create(K8sScalerOptions options) {
  if (options.api_server.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
      return absl::FailedPreconditionError(
          "api_server: empty and KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT are not set "
          "(not running in a pod?)");
    }
    const bool ipv6 = absl::StrContains(host, ':');
    options.api_server =
        absl::StrCat("https://", ipv6 ? "[" : "", host, ipv6 ? "]" : "", ":", port);
  }
  while (absl::EndsWith(options.api_server, "/")) options.api_server.pop_back();
  if (absl::Status s = CheckUrl(options.api_server); !s.ok()) return s;
  if (absl::StartsWith(options.api_server, "https://")) {
    std::ifstream ca(options.ca_path);
    if (options.ca_path.empty() || !ca) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ca_path: cannot read \"", options.ca_path, "\", needed to verify ", options.api_server));
    }
  }
  if (options.k8s_namespace.empty()) {
    absl::StatusOr<std::string> ns = ReadFile("namespace_path", options.namespace_path);
    if (!ns.ok()) return ns.status();
    options.k8s_namespace = std::string(absl::StripAsciiWhitespace(*ns));
  }
  if (!IsDns1123Label(options.k8s_namespace)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k8s_namespace: expected a DNS-1123 label, got \"", options.k8s_namespace, "\""));
  }
  if (options.deployments.empty()) {
    return absl::InvalidArgumentError("deployments: expected at least one pool, got none");
  }
  for (const auto& [pool, name] : options.deployments) {
    if (!IsDns1123Subdomain(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "deployments[", PoolName(pool), "]: expected a DNS-1123 subdomain, got \"", name, "\""));
    }
  }
  if (options.timeout <= absl::ZeroDuration() || options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout: expected timeout and connect_timeout > 0, got ",
                     absl::FormatDuration(options.timeout), " and ",
                     absl::FormatDuration(options.connect_timeout)));
  }
  InitCurlOnce();
  return std::unique_ptr<K8sScaler>(new K8sScaler(std::move(options)));
}

absl::StatusOr<std::string> K8sScaler::Describe(Pool pool) const {
  auto it = options_.deployments.find(pool);
  if (it == options_.deployments.end()) {
    return absl::NotFoundError(
        absl::StrCat("pool ", PoolName(pool), ": no deployment configured for it"));
  }
  return absl::StrCat("deployment ", options_.k8s_namespace, "/", it->second, " (pool ",
                      PoolName(pool), ")");
}

absl::StatusOr<std::string> K8sScaler::ScaleUrl(Pool pool) const {
  auto it = options_.deployments.find(pool);
  if (it == options_.deployments.end()) {
    return absl::NotFoundError(
        absl::StrCat("pool ", PoolName(pool), ": no deployment configured for it"));
  }
  // Names are validated DNS-1123, so they need no escaping in the path.
  return absl::StrCat(options_.api_server, "/apis/apps/v1/namespaces/", options_.k8s_namespace,
                      "/deployments/", it->second, "/scale");
}

absl::StatusOr<K8sScaler::Response> K8sScaler::Send(const std::string& what,
                                                    const std::string& method,
                                                    const std::string& url,
                                                    const std::string& body) const {
  std::string token;
  if (!options_.token_path.empty()) {
    absl::StatusOr<std::string> t = ReadFile("token_path", options_.token_path);
    if (!t.ok())
      return absl::FailedPreconditionError(absl::StrCat(what, ": ", t.status().message()));
    token = std::string(absl::StripAsciiWhitespace(*t));
  }

  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (curl == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": curl_easy_init failed"));
  }
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept: application/json");
  if (!token.empty()) {
    headers = curl_slist_append(headers, absl::StrCat("Authorization: Bearer ", token).c_str());
  }
  if (method == "PATCH") {
    headers = curl_slist_append(headers, "Content-Type: application/merge-patch+json");
  }
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> header_list(headers,
                                                                          &curl_slist_free_all);
  Response response;
  char error[CURL_ERROR_SIZE] = {0};
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "deepinfer-router-scaler");
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  // No signals: the router is multi-threaded, and timeouts would otherwise use SIGALRM.
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.timeout)));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(
                       std::min(options_.connect_timeout, options_.timeout))));
  // The API server is reached directly; proxy variables in the pod's environment are for
  // traffic leaving the cluster.
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
  if (absl::StartsWith(url, "https://")) {
    curl_easy_setopt(c, CURLOPT_CAINFO, options_.ca_path.c_str());
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  }
  if (method == "PATCH") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PATCH");
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  } else {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  }
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &AppendToString);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response.body);

  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    std::string detail = error[0] != '\0' ? error : curl_easy_strerror(rc);
    return absl::Status(CodeForCurlError(rc),
                        absl::StrCat(what, ": ", method, " ", url, ": ", detail));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.http_status);
  if (response.http_status < 200 || response.http_status > 299) {
    return absl::Status(CodeForHttpStatus(response.http_status),
                        absl::StrCat(what, ": ", method, " ", url, ": HTTP ", response.http_status,
                                     ": ", ServerMessage(response.body)));
  }
  return response;
}

absl::StatusOr<int> K8sScaler::GetReplicas(Pool pool) {
  absl::StatusOr<std::string> what = Describe(pool);
  if (!what.ok()) return what.status();
  absl::StatusOr<std::string> url = ScaleUrl(pool);
  if (!url.ok()) return url.status();
  absl::StatusOr<Response> response = Send(*what, "GET", *url, "");
  if (!response.ok()) return response.status();
  return ParseScaleReplicas(*what, response->body);
}

absl::Status K8sScaler::SetReplicas(Pool pool, int replicas) {
  absl::StatusOr<std::string> what = Describe(pool);
  if (!what.ok()) return what.status();
  if (replicas < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(*what, ": replicas: expected >= 0, got ", replicas));
  }
  absl::StatusOr<std::string> url = ScaleUrl(pool);
  if (!url.ok()) return url.status();
  const std::string body = nlohmann::json{{"spec", {{"replicas", replicas}}}}.dump();
  absl::StatusOr<Response> response = Send(*what, "PATCH", *url, body);
  if (!response.ok()) return response.status();
  absl::StatusOr<int> applied = ParseScaleReplicas(*what, response->body);
  if (!applied.ok()) return applied.status();
  if (*applied != replicas) {
    // A merge patch of spec.replicas is applied as sent; a different answer means something
    // else (an admission webhook, a concurrent writer) changed it.
    return absl::AbortedError(
        absl::StrCat(*what, ": asked for ", replicas,
                     " replicas, the API server answered spec.replicas=", *applied));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::router
