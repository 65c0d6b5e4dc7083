#include "deploy/local/local_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "common/grpc_status.h"
#include "common/process_lifecycle.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/deepinfer/internal/v1/worker.grpc.pb.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace deepinfer::deploy {
namespace {

constexpr int kLogTailLines = 30;
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
constexpr absl::Duration kHealthRpcTimeout = absl::Seconds(1);

std::string BinaryPath(const std::string& bin_dir, ClusterRole role) {
  switch (role) {
    case ClusterRole::kRouter:
      return absl::StrCat(bin_dir, "/router/router");
    case ClusterRole::kPrefill:
      return absl::StrCat(bin_dir, "/prefill_node/prefill_node");
    case ClusterRole::kDecode:
      return absl::StrCat(bin_dir, "/decode_node/decode_node");
    case ClusterRole::kEncoder:
      return absl::StrCat(bin_dir, "/vision_encoder/vision_encoder");
  }
  return "";
}

// Clients cannot connect to a wildcard listen address: use loopback for those.
std::string ConnectHost(const std::string& listen_host) {
  if (listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "::") return "127.0.0.1";
  return listen_host;
}

std::string LogTail(const std::string& log_path) {
  std::string tail = TailFile(log_path, kLogTailLines);
  if (tail.empty()) return absl::StrCat("; ", log_path, " is empty");
  return absl::StrCat("; last lines of ", log_path, ":\n", tail);
}

}  // namespace

std::vector<std::string> RouterCommandLine(const LocalClusterConfig& config,
                                           const std::string& port_file) {
  std::vector<std::string> argv = {
      BinaryPath(config.bin_dir, ClusterRole::kRouter),
      absl::StrCat("--listen=", config.router_listen),
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--model=", config.model_dir),
      absl::StrCat("--log_level=", config.log_level),
  };
  // A local cluster on loopback is a trusted setup: calls without an API key are served unless
  // the caller configures tenants itself (--tenants_file or an explicit --allow_anonymous).
  bool tenants_configured = false;
  for (const std::string& flag : config.router_flags) {
    if (absl::StartsWith(flag, "--tenants_file") || absl::StartsWith(flag, "--allow_anonymous") ||
        absl::StartsWith(flag, "--noallow_anonymous")) {
      tenants_configured = true;
    }
  }
  const std::string host = config.router_listen.substr(0, config.router_listen.rfind(':'));
  const bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]";
  if (!tenants_configured && loopback) argv.push_back("--allow_anonymous");
  argv.insert(argv.end(), config.router_flags.begin(), config.router_flags.end());
  return argv;
}

std::vector<std::string> WorkerCommandLine(const LocalClusterConfig& config, ClusterRole role,
                                           const std::string& worker_id,
                                           const std::string& router_address,
                                           const std::string& port_file) {
  std::vector<std::string> argv = {
      BinaryPath(config.bin_dir, role),
      "--listen=127.0.0.1:0",
      absl::StrCat("--port_file=", port_file),
      absl::StrCat("--model=", config.model_dir),
      absl::StrCat("--log_level=", config.log_level),
      absl::StrCat("--router=", router_address),
      absl::StrCat("--worker_id=", worker_id),
  };
  if (role == ClusterRole::kEncoder) {
    // An encoder holds no KV: only the shared flags and its own.
    if (config.threads_per_worker > 0) {
      argv.push_back(absl::StrCat("--threads=", config.threads_per_worker));
    }
    argv.insert(argv.end(), config.encoder_flags.begin(), config.encoder_flags.end());
    return argv;
  }
  argv.push_back("--kv_transport=ucx");
  if (config.kv_blocks > 0) argv.push_back(absl::StrCat("--kv_blocks=", config.kv_blocks));
  if (config.block_size > 0) argv.push_back(absl::StrCat("--block_size=", config.block_size));
  if (config.threads_per_worker > 0) {
    argv.push_back(absl::StrCat("--threads=", config.threads_per_worker));
  }
  if (role == ClusterRole::kDecode && config.decode_can_prefill) argv.push_back("--can_prefill");
  const std::vector<std::string>& extra =
      role == ClusterRole::kPrefill ? config.prefill_flags : config.decode_flags;
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::pair<std::string, std::string>> ClusterEnvironment(
    const LocalClusterConfig& config) {
  std::vector<std::pair<std::string, std::string>> env = config.env;
  const bool set_by_config = std::any_of(env.begin(), env.end(),
                                         [](const auto& kv) { return kv.first == "UCX_TLS"; });
  if (!set_by_config && getenv("UCX_TLS") == nullptr) env.emplace_back("UCX_TLS", "sm,self");
  return env;
}

ClusterProcessInfo LocalCluster::Process::Info() const {
  ClusterProcessInfo info;
  info.name = name;
  info.role = role;
  info.address = address;
  info.pid = subprocess->pid();
  info.running = subprocess->Running();
  info.log_path = log_path;
  info.exit_status = subprocess->exit_status();
  return info;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(LocalClusterConfig config) {
  if (config.model_dir.empty()) {
    return absl::InvalidArgumentError("model_dir: expected a model directory, got \"\"");
  }
  if (config.log_dir.empty()) {
    return absl::InvalidArgumentError("log_dir: expected a directory, got \"\"");
  }
  if (config.num_decode < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_decode: expected >= 1, got ", config.num_decode));
  }
  if (config.num_prefill < 0 || (config.num_prefill == 0 && !config.decode_can_prefill)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_prefill: expected >= 1 (or >= 0 with decode_can_prefill), got ", config.num_prefill));
  }
  if (config.kv_blocks < 0 || config.block_size < 0 || config.threads_per_worker < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_blocks, block_size, threads_per_worker: expected >= 0 (0 = binary default), got ",
        config.kv_blocks, ", ", config.block_size, ", ", config.threads_per_worker));
  }
  if (config.startup_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("startup_timeout: expected > 0");
  }
  DI_RETURN_IF_ERROR(ParseHostPort("router_listen", config.router_listen, true).status());
  if (config.num_encoders < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_encoders: expected >= 0, got ", config.num_encoders));
  }
  for (ClusterRole role : {ClusterRole::kRouter, ClusterRole::kPrefill, ClusterRole::kDecode,
                           ClusterRole::kEncoder}) {
    if (role == ClusterRole::kEncoder && config.num_encoders == 0) continue;
    const std::string path = BinaryPath(config.bin_dir, role);
    if (access(path.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "bin_dir: ", path, " is missing or not executable (build //",
          role == ClusterRole::kEncoder ? "vision_encoder" : ClusterRoleName(role),
          role == ClusterRole::kRouter || role == ClusterRole::kEncoder ? "" : "_node", ")"));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(config.log_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("log_dir: cannot create ", config.log_dir, ": ", ec.message()));
  }

  std::unique_ptr<LocalCluster> cluster(new LocalCluster(std::move(config)));
  absl::Status status = [&]() -> absl::Status {
    const absl::Time deadline = absl::Now() + cluster->config_.startup_timeout;
    DI_ASSIGN_OR_RETURN(cluster->router_, cluster->Spawn(ClusterRole::kRouter, "router"));
    DI_RETURN_IF_ERROR(cluster->AwaitPort(*cluster->router_));
    cluster->router_address_ = cluster->router_->address;

    // Prefill and encoder nodes load their models in parallel; decode nodes start once those
    // have loaded (a worker writes its port file once it serves), then load theirs in parallel.
    // An adaptive decode node profiles its step cost at start-up (engine/speculative/budget.h): it
    // should not share the cores with another node's model loading (a local cluster often runs
    // every process on the same few cores).
    std::vector<std::shared_ptr<Process>> all = {cluster->router_};
    std::vector<ClusterRole> first(cluster->config_.num_prefill, ClusterRole::kPrefill);
    first.insert(first.end(), cluster->config_.num_encoders, ClusterRole::kEncoder);
    const std::vector<ClusterRole> second(cluster->config_.num_decode, ClusterRole::kDecode);
    for (const std::vector<ClusterRole>* roles : {&std::as_const(first), &second}) {
      const size_t begin = all.size();
      for (ClusterRole role : *roles) {
        DI_ASSIGN_OR_RETURN(std::shared_ptr<Process> worker,
                            cluster->Spawn(role, cluster->NextWorkerName(role)));
        all.push_back(worker);
      }
      for (size_t i = begin; i < all.size(); ++i) DI_RETURN_IF_ERROR(cluster->AwaitPort(*all[i]));
    }
    return cluster->WaitServing(all, deadline);
  }();
  if (!status.ok()) {
    (void)cluster->Stop(absl::Seconds(5));
    return status;
  }
  return cluster;
}

LocalCluster::~LocalCluster() { (void)Stop(); }

std::string LocalCluster::NextWorkerName(ClusterRole role) {
  absl::MutexLock lock(&mu_);
  int& next = role == ClusterRole::kPrefill   ? next_prefill_
              : role == ClusterRole::kEncoder ? next_encoder_
                                              : next_decode_;
  return absl::StrCat(ClusterRoleName(role), "-", next++);
}

absl::StatusOr<std::shared_ptr<LocalCluster::Process>> LocalCluster::Spawn(
    ClusterRole role, const std::string& name) {
  auto process = std::make_shared<Process>();
  process->name = name;
  process->role = role;
  process->log_path = absl::StrCat(config_.log_dir, "/", name, ".log");
  process->port_file = absl::StrCat(config_.log_dir, "/", name, ".port");
  const std::string& port_file = process->port_file;
  std::error_code ignored;
  std::filesystem::remove(port_file, ignored);  // A stale one from an earlier run would mislead us.

  SubprocessOptions options;
  options.argv = role == ClusterRole::kRouter
                     ? RouterCommandLine(config_, port_file)
                     : WorkerCommandLine(config_, role, name, router_address_, port_file);
  options.env = ClusterEnvironment(config_);
  options.log_path = process->log_path;
  options.cpus = role == ClusterRole::kDecode ? config_.decode_cpus : config_.other_cpus;
  absl::StatusOr<std::unique_ptr<Subprocess>> subprocess = Subprocess::Start(std::move(options));
  if (!subprocess.ok()) {
    return absl::Status(subprocess.status().code(),
                        absl::StrCat(name, ": ", subprocess.status().message()));
  }
  process->subprocess = *std::move(subprocess);
  if (role != ClusterRole::kRouter) {
    absl::MutexLock lock(&mu_);
    if (stopped_) {  // Stop ran meanwhile (AddWorker on another thread): do not leak this one.
      process->subprocess->Terminate(absl::Seconds(5));
      return absl::FailedPreconditionError(
          absl::StrCat(name, ": the cluster was stopped while it started"));
    }
    workers_.push_back(process);  // From here on Stop sees it, whatever happens next.
  }
  return process;
}

absl::Status LocalCluster::AwaitPort(Process& process) {
  const std::string& name = process.name;
  const ClusterRole role = process.role;
  const std::string& port_file = process.port_file;

  const absl::Time deadline = absl::Now() + config_.startup_timeout;
  for (;;) {
    absl::StatusOr<int> port = ReadPortFile(port_file, absl::ZeroDuration());
    if (port.ok()) {
      std::string host = "127.0.0.1";
      if (role == ClusterRole::kRouter) {
        DI_ASSIGN_OR_RETURN(HostPort listen,
                            ParseHostPort("router_listen", config_.router_listen, true));
        host = ConnectHost(listen.host);
      }
      process.address = HostPort{host, static_cast<uint16_t>(*port)}.ToString();
      process.channel =
          grpc::CreateChannel(process.address, grpc::InsecureChannelCredentials());
      return absl::OkStatus();
    }
    if (port.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(port.status().code(), absl::StrCat(name, ": ", port.status().message(),
                                                             LogTail(process.log_path)));
    }
    if (!process.subprocess->Running()) {
      return absl::UnavailableError(absl::StrCat(
          name, " (pid ", process.subprocess->pid(), ") exited during start-up: ",
          process.subprocess->exit_status()->ToString(), LogTail(process.log_path)));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " wrote no port file (", port_file, ") within ",
                       absl::FormatDuration(config_.startup_timeout), LogTail(process.log_path)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::Status LocalCluster::WaitServing(const std::vector<std::shared_ptr<Process>>& processes,
                                       absl::Time deadline) {
  std::vector<std::shared_ptr<Process>> pending = processes;
  std::vector<std::string> last_health(pending.size());
  for (;;) {
    for (size_t i = 0; i < pending.size();) {
      Process& p = *pending[i];
      if (!p.subprocess->Running()) {
        return absl::UnavailableError(absl::StrCat(
            p.name, " (pid ", p.subprocess->pid(), ") exited during start-up: ",
            p.subprocess->exit_status()->ToString(), LogTail(p.log_path)));
      }
      auto stub = grpc::health::v1::Health::NewStub(p.channel);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(std::min(absl::Now() + kHealthRpcTimeout, deadline)));
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      grpc::Status rpc = stub->Check(&context, request, &response);
      if (rpc.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        pending.erase(pending.begin() + i);
        last_health.erase(last_health.begin() + i);
        continue;
      }
      last_health[i] = rpc.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                                      response.status())
                                : FromGrpcStatus(rpc).ToString();
      ++i;
    }
    if (pending.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      const Process& p = *pending.front();
      return absl::DeadlineExceededError(absl::StrCat(
          p.name, " at ", p.address, " not SERVING in time (last health check: ",
          last_health.front(), ")", LogTail(p.log_path)));
    }
    absl::SleepFor(kPollInterval);
  }
}

ClusterProcessInfo LocalCluster::router() const { return router_->Info(); }

std::vector<ClusterProcessInfo> LocalCluster::workers() const {
  absl::MutexLock lock(&mu_);
  std::vector<ClusterProcessInfo> out;
  for (const auto& w : workers_) out.push_back(w->Info());
  return out;
}

absl::StatusOr<int> LocalCluster::FindWorker(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i]->name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(absl::StrCat("no worker named \"", name, "\""));
}

absl::StatusOr<std::shared_ptr<LocalCluster::Process>> LocalCluster::WorkerAt(int index) const {
  absl::MutexLock lock(&mu_);
  if (index < 0 || index >= static_cast<int>(workers_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("worker index: expected [0, ", workers_.size(), "), got ", index));
  }
  return workers_[index];
}

absl::Status LocalCluster::Signal(int index, int sig) {
  DI_ASSIGN_OR_RETURN(std::shared_ptr<Process> p, WorkerAt(index));
  absl::Status status = p->subprocess->Signal(sig);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat(p->name, ": ", status.message()));
  return absl::OkStatus();
}

absl::StatusOr<ExitStatus> LocalCluster::WaitExit(int index, absl::Duration timeout) {
  DI_ASSIGN_OR_RETURN(std::shared_ptr<Process> p, WorkerAt(index));
  absl::StatusOr<ExitStatus> status = p->subprocess->Wait(timeout);
  if (!status.ok()) {
    return absl::Status(status.status().code(),
                        absl::StrCat(p->name, ": ", status.status().message()));
  }
  return status;
}

absl::StatusOr<int> LocalCluster::AddWorker(ClusterRole role) {
  if (role == ClusterRole::kRouter) {
    return absl::InvalidArgumentError("role: expected prefill or decode, got router");
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::FailedPreconditionError("the cluster has been stopped");
  }
  DI_ASSIGN_OR_RETURN(std::shared_ptr<Process> process, Spawn(role, NextWorkerName(role)));
  absl::Status status = AwaitPort(*process);
  if (status.ok()) status = WaitServing({process}, absl::Now() + config_.startup_timeout);
  std::shared_ptr<Process> failed;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find(workers_.begin(), workers_.end(), process);
    if (it == workers_.end()) {
      return absl::AbortedError(absl::StrCat(process->name, " was removed while starting"));
    }
    if (status.ok()) return static_cast<int>(it - workers_.begin());
    workers_.erase(it);
  }
  process->subprocess->Terminate(absl::Seconds(5));
  return status;
}

absl::StatusOr<ExitStatus> LocalCluster::RemoveWorker(int index, absl::Duration grace) {
  std::shared_ptr<Process> p;
  {
    absl::MutexLock lock(&mu_);
    if (index < 0 || index >= static_cast<int>(workers_.size())) {
      return absl::OutOfRangeError(
          absl::StrCat("worker index: expected [0, ", workers_.size(), "), got ", index));
    }
    p = workers_[index];
    workers_.erase(workers_.begin() + index);
  }
  return p->subprocess->Terminate(grace);
}

absl::StatusOr<internal::v1::WorkerStats> LocalCluster::GetStats(int index,
                                                                  absl::Duration timeout) {
  DI_ASSIGN_OR_RETURN(std::shared_ptr<Process> p, WorkerAt(index));
  auto stub = internal::v1::WorkerAdmin::NewStub(p->channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  internal::v1::WorkerStats stats;
  grpc::Status rpc = stub->GetStats(&context, internal::v1::WorkerStatsRequest(), &stats);
  if (!rpc.ok()) {
    absl::Status status = FromGrpcStatus(rpc);
    return absl::Status(status.code(),
                        absl::StrCat(p->name, " WorkerAdmin.GetStats: ", status.message()));
  }
  return stats;
}

absl::Status LocalCluster::Stop(absl::Duration grace) {
  std::vector<std::shared_ptr<Process>> workers;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::OkStatus();
    stopped_ = true;
    workers = workers_;
  }
  std::vector<std::string> problems;
  // Stops a group in parallel: SIGTERM all, one shared grace period, SIGKILL the rest.
  auto stop_group = [&](const std::vector<std::shared_ptr<Process>>& group) {
    for (const auto& p : group) {
      if (p->subprocess->Running()) (void)p->subprocess->Signal(SIGTERM);
    }
    const absl::Time deadline = absl::Now() + grace;
    for (const auto& p : group) {
      absl::StatusOr<ExitStatus> status =
          p->subprocess->Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
      if (!status.ok()) {
        (void)p->subprocess->Signal(SIGKILL);
        (void)p->subprocess->Wait(absl::InfiniteDuration());
        problems.push_back(absl::StrCat(p->name, ": still running ",
                                        absl::FormatDuration(grace),
                                        " after SIGTERM, killed (log: ", p->log_path, ")"));
      } else if (!status->ok()) {
        problems.push_back(
            absl::StrCat(p->name, ": ", status->ToString(), " (log: ", p->log_path, ")"));
      }
    }
  };
  stop_group(workers);
  if (router_ != nullptr) stop_group({router_});
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("unclean cluster stop: ", absl::StrJoin(problems, "; ")));
}

}  // namespace deepinfer::deploy
