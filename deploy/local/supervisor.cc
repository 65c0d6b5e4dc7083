#include "deploy/local/supervisor.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"

namespace deepinfer::deploy {
namespace {

internal::v1::WorkerRole RoleOf(ClusterRole role) {
  switch (role) {
    case ClusterRole::kPrefill:
      return internal::v1::WORKER_ROLE_PREFILL;
    case ClusterRole::kEncoder:
      return internal::v1::WORKER_ROLE_ENCODER;
    default:
      return internal::v1::WORKER_ROLE_DECODE;
  }
}

void Log(const std::string& line) { spdlog::info("supervisor: {}", line); }

absl::Status ValidateBounds(absl::string_view pool, const SupervisorOptions::Bounds& b,
                            int least_min) {
  if (b.min_replicas < least_min) {
    return absl::InvalidArgumentError(
        absl::StrCat(pool, ".min_replicas: expected >= ", least_min, "; got ", b.min_replicas));
  }
  if (b.max_replicas < b.min_replicas) {
    return absl::InvalidArgumentError(absl::StrCat(pool,
                                                   ".max_replicas: expected >= min_replicas (",
                                                   b.min_replicas, "); got ", b.max_replicas));
  }
  return absl::OkStatus();
}

}  // namespace

RouterPlanSource::RouterPlanSource(const std::string& router_address, absl::Duration timeout)
    : stub_(internal::v1::RouterAdmin::NewStub(
          grpc::CreateChannel(router_address, grpc::InsecureChannelCredentials()))),
      timeout_(timeout) {}

absl::StatusOr<internal::v1::GetPlanResponse> RouterPlanSource::GetPlan() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  internal::v1::GetPlanResponse response;
  absl::Status status =
      FromGrpcStatus(stub_->GetPlan(&context, internal::v1::GetPlanRequest(), &response));
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("RouterAdmin.GetPlan: ", status.message()));
  }
  return response;
}

absl::StatusOr<std::unique_ptr<Supervisor>> Supervisor::Create(PlanSource* plans,
                                                               ClusterControl* cluster,
                                                               SupervisorOptions options) {
  if (plans == nullptr) return absl::InvalidArgumentError("plans: expected non-null");
  if (cluster == nullptr) return absl::InvalidArgumentError("cluster: expected non-null");
  if (absl::Status s = ValidateBounds("prefill", options.prefill, 0); !s.ok()) return s;
  if (absl::Status s = ValidateBounds("decode", options.decode, 1); !s.ok()) return s;
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("interval: expected > 0; got ", absl::FormatDuration(options.interval)));
  }
  if (options.drain_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("drain_grace: expected >= 0; got ",
                                                   absl::FormatDuration(options.drain_grace)));
  }
  if (options.stats_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("stats_timeout: expected > 0; got ",
                                                   absl::FormatDuration(options.stats_timeout)));
  }
  return std::unique_ptr<Supervisor>(new Supervisor(plans, cluster, options));
}

Supervisor::~Supervisor() { Stop(); }

void Supervisor::Start() {
  absl::MutexLock start_lock(&start_mu_);
  if (thread_.joinable()) return;
  {
    absl::MutexLock lock(&loop_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Loop(); });
}

void Supervisor::Stop() {
  absl::MutexLock start_lock(&start_mu_);
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&loop_mu_);
    stop_ = true;
  }
  thread_.join();
}

void Supervisor::Loop() {
  while (true) {
    (void)Step();
    absl::MutexLock lock(&loop_mu_);
    if (loop_mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.interval)) return;
  }
}

absl::Status Supervisor::Step(SupervisorStep* done) {
  absl::MutexLock step_lock(&step_mu_);
  SupervisorStep local;
  SupervisorStep& out = done != nullptr ? *done : local;
  absl::Status status;
  absl::StatusOr<internal::v1::GetPlanResponse> plan = plans_->GetPlan();
  if (!plan.ok()) {
    status = plan.status();
  } else {
    for (ClusterRole role : {ClusterRole::kPrefill, ClusterRole::kDecode}) {
      for (const internal::v1::PoolPlan& pool : plan->pools()) {
        if (pool.pool() != RoleOf(role) || !pool.planned()) continue;
        absl::Status followed = Follow(role, pool, out);
        if (status.ok()) status = followed;
      }
    }
  }
  absl::MutexLock lock(&mu_);
  ++steps_;
  if (!status.ok()) {
    ++errors_;
    last_error_ = status.ToString();
    spdlog::warn("supervisor: pass failed: {}", last_error_);
  }
  return status;
}

absl::Status Supervisor::Follow(ClusterRole role, const internal::v1::PoolPlan& plan,
                                SupervisorStep& done) {
  const SupervisorOptions::Bounds& bounds =
      role == ClusterRole::kPrefill ? options_.prefill : options_.decode;
  const int target = std::clamp(static_cast<int>(plan.desired_replicas()), bounds.min_replicas,
                                bounds.max_replicas);
  const char* name = ClusterRoleName(role);

  // Running workers of the pool, by index in workers() (oldest first).
  std::vector<ClusterProcessInfo> all = cluster_->workers();
  std::vector<int> mine;
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    if (all[i].role == role && all[i].running) mine.push_back(i);
  }
  const int running = static_cast<int>(mine.size());
  if (running == target) return absl::OkStatus();

  if (running < target) {
    Log(absl::StrCat(name, ": plan wants ", plan.desired_replicas(), ", running ", running,
                     ": adding ", target - running));
    for (int n = running; n < target; ++n) {
      absl::StatusOr<int> index = cluster_->AddWorker(role);
      if (!index.ok()) {
        return absl::Status(index.status().code(),
                            absl::StrCat("adding a ", name, " worker: ", index.status().message()));
      }
      std::vector<ClusterProcessInfo> now = cluster_->workers();
      const std::string added =
          *index >= 0 && *index < static_cast<int>(now.size()) ? now[*index].name : "?";
      Log(absl::StrCat(name, ": added ", added));
      done.added.push_back(added);
      absl::MutexLock lock(&mu_);
      ++added_;
    }
    return absl::OkStatus();
  }

  // Least busy first, then newest (highest index) first.
  struct Candidate {
    std::string name;
    int64_t busy;
    int index;
  };
  std::vector<Candidate> candidates;
  for (int index : mine) {
    absl::StatusOr<internal::v1::WorkerStats> stats =
        cluster_->GetStats(index, options_.stats_timeout);
    int64_t busy = std::numeric_limits<int64_t>::max();
    if (stats.ok()) {
      busy = int64_t{stats->active_requests()} + stats->running_sequences() +
             stats->waiting_sequences() + stats->awaiting_kv_sequences() + stats->held_sequences();
    }
    candidates.push_back({all[index].name, busy, index});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.busy != b.busy ? a.busy < b.busy : a.index > b.index;
  });
  Log(absl::StrCat(name, ": plan wants ", plan.desired_replicas(), ", running ", running,
                   ": draining ", running - target));
  for (int n = 0; n < running - target; ++n) {
    // Indexes shift as workers go: look the victim up by name each time.
    const std::string& victim = candidates[n].name;
    std::vector<ClusterProcessInfo> now = cluster_->workers();
    auto it = std::find_if(now.begin(), now.end(),
                           [&](const ClusterProcessInfo& p) { return p.name == victim; });
    if (it == now.end()) continue;  // gone meanwhile
    absl::StatusOr<ExitStatus> exit =
        cluster_->RemoveWorker(static_cast<int>(it - now.begin()), options_.drain_grace);
    if (!exit.ok()) {
      return absl::Status(exit.status().code(),
                          absl::StrCat("removing ", victim, ": ", exit.status().message()));
    }
    Log(absl::StrCat(name, ": removed ", victim, " (", exit->ToString(), ")"));
    done.removed.push_back(victim);
    absl::MutexLock lock(&mu_);
    ++removed_;
  }
  return absl::OkStatus();
}

int64_t Supervisor::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}
int64_t Supervisor::added() const {
  absl::MutexLock lock(&mu_);
  return added_;
}
int64_t Supervisor::removed() const {
  absl::MutexLock lock(&mu_);
  return removed_;
}
int64_t Supervisor::errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
}
std::string Supervisor::last_error() const {
  absl::MutexLock lock(&mu_);
  return last_error_;
}

}  // namespace deepinfer::deploy
