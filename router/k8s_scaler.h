// K8sScaler: a Scaler (router/scaler.h) over the Kubernetes API server's `scale` subresource of
// one Deployment per pool:
//
//   GET   {api_server}/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale
//         -> autoscaling/v1 Scale; GetReplicas returns spec.replicas (0 when absent)
//   PATCH the same URL, Content-Type: application/merge-patch+json, body {"spec":{"replicas":N}}
//
// Authentication is the pod's service account: every request sends "Authorization: Bearer
// <token>" with the token re-read from token_path (the kubelet rotates it), and https peers are
// verified against ca_path. The identity needs get and patch on deployments/scale in the
// namespace (deploy/k8s/base/rbac.yaml).
//
// Status mapping (messages name the deployment as namespace/name and the pool, the method and
// URL, and the API server's own message when it sent one):
//   HTTP 400, 422 -> kInvalidArgument   401 -> kUnauthenticated   403 -> kPermissionDenied
//   404 -> kNotFound   409 -> kAborted   429 -> kResourceExhausted   5xx -> kUnavailable
//   other non-2xx -> kUnknown; connection refused / unresolvable host / TLS failure ->
//   kUnavailable; no answer within timeout -> kDeadlineExceeded; unreadable token file ->
//   kFailedPrecondition; a 2xx body that is not a Scale -> kInternal.
//
// Each call is one HTTP request on its own connection (scaling is rare; no pooling needed).
// Thread-safety: every method is thread-safe. Not copyable or movable.
#ifndef DEEPINFER_ROUTER_K8S_SCALER_H_
#define DEEPINFER_ROUTER_K8S_SCALER_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/planner.h"
#include "router/scaler.h"

namespace deepinfer::router {

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct K8sScalerOptions {
  // "http://host:port" or "https://host:port" (no path). Empty: in-cluster,
  // "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT" (IPv6 hosts bracketed).
  std::string api_server;
  // Bearer token file, re-read on every request; empty = send no Authorization header.
  std::string token_path = std::string(kServiceAccountDir) + "/token";
  // CA bundle that verifies an https API server; must exist when api_server is https.
  std::string ca_path = std::string(kServiceAccountDir) + "/ca.crt";
  // The Deployments' namespace. Empty: read (and trimmed) from namespace_path.
  std::string k8s_namespace;
  std::string namespace_path = std::string(kServiceAccountDir) + "/namespace";
  // Pool -> Deployment name (DNS-1123 subdomain); at least one. Pools not listed: kNotFound.
  std::map<Pool, std::string> deployments;
  // Whole request, connection included; > 0.
  absl::Duration timeout = absl::Seconds(5);
  // TCP + TLS connection set-up; > 0 (capped by timeout).
  absl::Duration connect_timeout = absl::Seconds(2);
};

class K8sScaler : public Scaler {
 public:
  // Validates the options and resolves the in-cluster defaults. kInvalidArgument naming the
  // field for a malformed api_server, name, namespace or timeout ("deployments[decode]: expected
  // a DNS-1123 subdomain, got \"Decode_1\""); kFailedPrecondition when in-cluster settings are
  // needed but absent (no KUBERNETES_SERVICE_HOST, no namespace file, no CA file for https).
  // Nothing is sent to the API server.
  static absl::StatusOr<std::unique_ptr<K8sScaler>> Create(K8sScalerOptions options);

  K8sScaler(const K8sScaler&) = delete;
  K8sScaler& operator=(const K8sScaler&) = delete;

  absl::StatusOr<int> GetReplicas(Pool pool) override;
  absl::Status SetReplicas(Pool pool, int replicas) override;

  // The resolved settings (api_server and k8s_namespace filled in).
  const K8sScalerOptions& options() const { return options_; }

  // The scale subresource URL of `pool`'s Deployment; kNotFound for a pool not configured.
  absl::StatusOr<std::string> ScaleUrl(Pool pool) const;

 private:
  explicit K8sScaler(K8sScalerOptions options) : options_(std::move(options)) {}

  struct Response {
    long http_status = 0;
    std::string body;
  };
  // One request; `what` prefixes every error ("deployment ns/name (pool decode)").
  absl::StatusOr<Response> Send(const std::string& what, const std::string& method,
                                const std::string& url, const std::string& body) const;
  // "deployment ns/name (pool p)" or kNotFound.
  absl::StatusOr<std::string> Describe(Pool pool) const;

  const K8sScalerOptions options_;
};

}  // namespace deepinfer::router

#endif  // DEEPINFER_ROUTER_K8S_SCALER_H_
