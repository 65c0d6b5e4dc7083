// //deploy/local:launcher — a whole deepinfer cluster on this machine.
//
//   bazel run -c opt //deploy/local:launcher -- --model engine/testdata/models/llama
//   bazel run -c opt //deploy/local:launcher -- --model DIR --prefill 2 --decode 1 --threads 4
//   bazel run -c opt //deploy/local:launcher -- --model DIR --prefill 0 --decode 1 --colocated
//   bazel run -c opt //deploy/local:launcher -- --model DIR --autoscale --max_prefill 4
//
// Starts the router (on --router_listen, with its OpenAI-compatible HTTP API on --http_listen)
// and the workers, waits until every process is healthy, prints the router's gRPC endpoint, its
// HTTP API base URL and each worker, then runs until SIGINT/SIGTERM and stops
// everything cleanly (workers drain first, the router last). If a process exits on its own the
// launcher says so and stops the rest; the exit status is then 1.
//
// --autoscale: the router runs its planner (--autoscale --scaler=external, with the bounds below
// and --autoscale_interval; further planner knobs through --router_flags) and the launcher runs
// the local supervisor (deploy/local/supervisor.h), which adds and drains workers to follow the
// router's plan within [--min_prefill, --max_prefill] and [--min_decode, --max_decode].
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/process_lifecycle.h"
#include "common/subprocess.h"
#include "deploy/local/local_cluster.h"
#include "deploy/local/supervisor.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory served by every process.");
ABSL_FLAG(int, prefill, 1, "Prefill nodes (0 allowed with --colocated).");
ABSL_FLAG(int, decode, 1, "Decode nodes (>= 1).");
ABSL_FLAG(int, encoders, 0,
          "Vision encoder nodes (//vision_encoder) for a LLaVA-style --model; 0 = none.");
ABSL_FLAG(std::vector<std::string>, encoder_flags, {}, "Extra vision_encoder flags.");
ABSL_FLAG(bool, colocated, false, "Decode nodes also prefill locally (--can_prefill).");
ABSL_FLAG(int, colocated_prefill_tokens, -1,
          "Router: prompts up to this many uncached tokens prefill on the decode node "
          "(-1: the router's default).");
ABSL_FLAG(int, kv_blocks, 0, "KV-cache blocks per worker (0: the binaries' default).");
ABSL_FLAG(int, block_size, 0, "KV block size in tokens (0: the binaries' default).");
ABSL_FLAG(int, threads, 0, "Forward-pass threads per worker (0: the binaries' default).");
ABSL_FLAG(std::string, log_dir, "",
          "Where each process logs (<name>.log); default: a new directory under $TMPDIR.");
ABSL_FLAG(std::string, router_listen, "127.0.0.1:50051", "The router's public listen address.");
ABSL_FLAG(std::string, http_listen, "127.0.0.1:8000",
          "The router's OpenAI-compatible HTTP API (its --http_listen; port 0 picks a free "
          "one); empty = off.");
ABSL_FLAG(std::string, log_level, "info", "--log_level of every process.");
ABSL_FLAG(std::string, bin_dir, "",
          "Directory with router/router, prefill_node/prefill_node, decode_node/decode_node; "
          "default: this binary's runfiles.");
ABSL_FLAG(std::string, ready_file, "",
          "Written (atomically) with the router address once every process is healthy.");
ABSL_FLAG(absl::Duration, startup_timeout, absl::Seconds(180),
          "Longest wait for the processes to become healthy.");
ABSL_FLAG(absl::Duration, stop_timeout, absl::Seconds(30),
          "On shutdown, how long each group (workers, then router) may drain before SIGKILL.");
ABSL_FLAG(std::vector<std::string>, router_flags, {},
          "Extra router flags, comma-separated (e.g. --heartbeat_interval=500ms).");
ABSL_FLAG(std::vector<std::string>, prefill_flags, {}, "Extra prefill_node flags.");
ABSL_FLAG(bool, autoscale, false,
          "Size the prefill and decode pools from their load: the router plans, the launcher "
          "adds and drains workers.");
ABSL_FLAG(int, min_prefill, 1, "--autoscale: fewest prefill nodes.");
ABSL_FLAG(int, max_prefill, 4, "--autoscale: most prefill nodes.");
ABSL_FLAG(int, min_decode, 1, "--autoscale: fewest decode nodes.");
ABSL_FLAG(int, max_decode, 4, "--autoscale: most decode nodes.");
ABSL_FLAG(absl::Duration, autoscale_interval, absl::Seconds(5),
          "--autoscale: how often the router re-plans and the supervisor follows.");
ABSL_FLAG(std::vector<std::string>, decode_flags, {}, "Extra decode_node flags.");
ABSL_FLAG(std::string, decode_cpus, "",
          "CPUs the decode nodes run on from their start, as taskset writes them (\"1\", "
          "\"2-3\"); empty: inherited. With --other_cpus, decode nodes keep to their own cores as "
          "on machines of their own (benchmarks: tools/bench/spec_sweep.sh).");
ABSL_FLAG(std::string, other_cpus, "",
          "CPUs the router, prefill nodes and encoders run on (as --decode_cpus); empty: "
          "inherited.");

namespace deepinfer::deploy {
namespace {

bool IsDir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

// Under `bazel run` the working directory is the runfiles tree; paths the user typed are
// relative to where they ran bazel (BUILD_WORKING_DIRECTORY).
std::string UserPath(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const char* wd = getenv("BUILD_WORKING_DIRECTORY");
  if (wd != nullptr && *wd != '\0') return absl::StrCat(wd, "/", path);
  return std::filesystem::absolute(path).string();
}

// The runfiles tree holding the three binaries: $RUNFILES_DIR, or <argv[0]>.runfiles, or
// /proc/self/exe's; the workspace directory in it is "deepinfer" (WORKSPACE name) or
// "__main__" (unnamed workspaces).
std::string FindBinDir(const char* argv0) {
  std::vector<std::string> roots;
  if (const char* r = getenv("RUNFILES_DIR"); r != nullptr && *r != '\0') roots.push_back(r);
  roots.push_back(absl::StrCat(argv0, ".runfiles"));
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) roots.push_back(absl::StrCat(exe.string(), ".runfiles"));
  for (const std::string& root : roots) {
    for (const char* workspace : {"deepinfer", "__main__"}) {
      std::string dir = absl::StrCat(root, "/", workspace);
      if (access(absl::StrCat(dir, "/router/router").c_str(), X_OK) == 0) {
        return std::filesystem::absolute(dir).string();
      }
    }
  }
  return ".";  // As in a Bazel test: the runfiles root is the working directory.
}

absl::Status WriteReadyFile(const std::string& path, const std::string& content) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  FILE* f = fopen(tmp.c_str(), "w");
  if (f == nullptr)
    return absl::InternalError(absl::StrCat("--ready_file ", tmp, ": cannot write"));
  fputs(content.c_str(), f);
  const bool ok = fclose(f) == 0;
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--ready_file ", path, ": cannot write"));
  }
  return absl::OkStatus();
}

std::string Describe(const ClusterProcessInfo& p) {
  return absl::StrFormat("%-8s %-10s %-21s pid %-7d log %s", ClusterRoleName(p.role), p.name,
                         p.address, p.pid, p.log_path);
}

int Run(const char* argv0) {
  LocalClusterConfig config;
  config.model_dir = UserPath(absl::GetFlag(FLAGS_model));
  if (config.model_dir.empty()) {
    fprintf(stderr, "launcher: --model: expected a model directory\n");
    return 2;
  }
  if (!IsDir(config.model_dir)) {
    fprintf(stderr, "launcher: --model: %s is not a directory\n", config.model_dir.c_str());
    return 2;
  }
  config.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty() ? FindBinDir(argv0)
                                                        : UserPath(absl::GetFlag(FLAGS_bin_dir));
  config.num_prefill = absl::GetFlag(FLAGS_prefill);
  config.num_decode = absl::GetFlag(FLAGS_decode);
  config.decode_can_prefill = absl::GetFlag(FLAGS_colocated);
  config.num_encoders = absl::GetFlag(FLAGS_encoders);
  config.encoder_flags = absl::GetFlag(FLAGS_encoder_flags);
  config.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  config.block_size = absl::GetFlag(FLAGS_block_size);
  config.threads_per_worker = absl::GetFlag(FLAGS_threads);
  config.router_listen = absl::GetFlag(FLAGS_router_listen);
  config.log_level = absl::GetFlag(FLAGS_log_level);
  config.startup_timeout = absl::GetFlag(FLAGS_startup_timeout);
  config.router_flags = absl::GetFlag(FLAGS_router_flags);
  if (absl::GetFlag(FLAGS_colocated_prefill_tokens) >= 0) {
    config.router_flags.push_back(
        absl::StrCat("--colocated_prefill_tokens=", absl::GetFlag(FLAGS_colocated_prefill_tokens)));
  }
  const bool autoscale = absl::GetFlag(FLAGS_autoscale);
  SupervisorOptions supervisor_options;
  if (autoscale) {
    supervisor_options.prefill = {absl::GetFlag(FLAGS_min_prefill),
                                  absl::GetFlag(FLAGS_max_prefill)};
    supervisor_options.decode = {absl::GetFlag(FLAGS_min_decode), absl::GetFlag(FLAGS_max_decode)};
    supervisor_options.interval = absl::GetFlag(FLAGS_autoscale_interval);
    supervisor_options.drain_grace = absl::GetFlag(FLAGS_stop_timeout);
    // Ahead of --router_flags, so that the user's own planner flags win.
    std::vector<std::string> flags = {
        "--autoscale",
        "--scaler=external",
        absl::StrCat("--autoscale_interval=", absl::FormatDuration(supervisor_options.interval)),
        absl::StrCat("--prefill_min_replicas=", supervisor_options.prefill.min_replicas),
        absl::StrCat("--prefill_max_replicas=", supervisor_options.prefill.max_replicas),
        absl::StrCat("--decode_min_replicas=", supervisor_options.decode.min_replicas),
        absl::StrCat("--decode_max_replicas=", supervisor_options.decode.max_replicas),
    };
    flags.insert(flags.end(), config.router_flags.begin(), config.router_flags.end());
    config.router_flags = std::move(flags);
  }
  config.prefill_flags = absl::GetFlag(FLAGS_prefill_flags);
  config.decode_flags = absl::GetFlag(FLAGS_decode_flags);
  for (auto [flag, name, cpus] :
       {std::tuple{&FLAGS_decode_cpus, "--decode_cpus", &config.decode_cpus},
        std::tuple{&FLAGS_other_cpus, "--other_cpus", &config.other_cpus}}) {
    absl::StatusOr<std::vector<int>> parsed = ParseCpuList(name, absl::GetFlag(*flag));
    if (!parsed.ok()) {
      fprintf(stderr, "launcher: %s\n", std::string(parsed.status().message()).c_str());
      return 1;
    }
    *cpus = *std::move(parsed);
  }
  config.log_dir = UserPath(absl::GetFlag(FLAGS_log_dir));
  if (config.log_dir.empty()) {
    const char* tmp = getenv("TMPDIR");
    std::string templ = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/deepinfer-cluster-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      fprintf(stderr, "launcher: --log_dir: cannot create %s\n", templ.c_str());
      return 1;
    }
    config.log_dir = templ;
  }

  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  const std::string http_port_file = absl::StrCat(config.log_dir, "/router.http.port");
  if (!http_listen.empty()) {
    // Ahead of --router_flags, so that the user's own win.
    std::vector<std::string> flags = {absl::StrCat("--http_listen=", http_listen),
                                      absl::StrCat("--http_port_file=", http_port_file)};
    flags.insert(flags.end(), config.router_flags.begin(), config.router_flags.end());
    config.router_flags = std::move(flags);
  }

  printf("launcher: model %s\nlauncher: binaries in %s\nlauncher: logs in %s\n",
         config.model_dir.c_str(), config.bin_dir.c_str(), config.log_dir.c_str());
  const std::string encoders =
      config.num_encoders > 0 ? absl::StrCat(", ", config.num_encoders, " vision encoder(s)") : "";
  printf("launcher: starting router on %s, %d prefill and %d decode node(s)%s%s ...\n",
         config.router_listen.c_str(), config.num_prefill, config.num_decode,
         config.decode_can_prefill ? " (decode nodes also prefill)" : "", encoders.c_str());
  fflush(stdout);

  // SIGINT/SIGTERM stay blocked for the whole process (InstallShutdownSignalHandlers in main).
  // While starting, a watcher consumes them: the start-up can take minutes (model loading) and
  // Ctrl-C must still work. Exiting kills every child through its parent-death signal.
  std::atomic<bool> started{false};
  absl::Notification watcher_done;
  std::thread startup_watcher([&] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    const timespec poll = {0, 100 * 1000 * 1000};
    while (!started.load()) {
      int sig = sigtimedwait(&set, nullptr, &poll);
      if (sig <= 0) continue;
      if (started.load()) {
        RequestShutdown();  // Arrived just after start-up: hand it to the main loop.
        break;
      }
      fprintf(stderr, "launcher: interrupted during start-up (signal %d); killing children\n", sig);
      _exit(130);
    }
    watcher_done.Notify();
  });

  absl::StatusOr<std::unique_ptr<LocalCluster>> started_cluster = LocalCluster::Start(config);
  started.store(true);
  startup_watcher.join();
  if (!started_cluster.ok()) {
    fprintf(stderr, "launcher: start-up failed: %s\n", started_cluster.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<LocalCluster> cluster = *std::move(started_cluster);

  printf("launcher: cluster ready\n");
  printf("%s\n", Describe(cluster->router()).c_str());
  for (const ClusterProcessInfo& w : cluster->workers()) printf("%s\n", Describe(w).c_str());
  printf("router endpoint: %s\n", cluster->router_address().c_str());
  printf("launcher: try: bazel run //tools:chat -- --router %s --message 'Hello'\n",
         cluster->router_address().c_str());
  if (!http_listen.empty()) {
    absl::StatusOr<int> http_port = ReadPortFile(http_port_file, absl::Seconds(5));
    if (http_port.ok()) {
      const size_t colon = http_listen.rfind(':');
      std::string host = colon == std::string::npos ? "" : http_listen.substr(0, colon);
      if (host.empty() || host == "0.0.0.0") host = "127.0.0.1";
      const std::string url = absl::StrCat("http://", host, ":", *http_port, "/v1");
      printf("HTTP API: %s\n", url.c_str());
      printf("launcher: try: curl %s/chat/completions -H 'Content-Type: application/json' "
             "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n",
             url.c_str());
    } else {
      fprintf(stderr, "launcher: the router's HTTP API did not start: %s\n",
              http_port.status().ToString().c_str());
    }
  }
  printf("launcher: Ctrl-C (SIGINT) or SIGTERM stops the cluster\n");
  fflush(stdout);
  if (!absl::GetFlag(FLAGS_ready_file).empty()) {
    absl::Status s = WriteReadyFile(UserPath(absl::GetFlag(FLAGS_ready_file)),
                                    absl::StrCat(cluster->router_address(), "\n"));
    if (!s.ok()) {
      fprintf(stderr, "launcher: %s\n", s.ToString().c_str());
      (void)cluster->Stop(absl::GetFlag(FLAGS_stop_timeout));
      return 1;
    }
  }

  // The supervisor runs on this (main) thread's behalf but starts children on its own thread,
  // which lives until after cluster->Stop() below.
  std::unique_ptr<RouterPlanSource> plans;
  std::unique_ptr<Supervisor> supervisor;
  if (autoscale) {
    plans = std::make_unique<RouterPlanSource>(cluster->router_address(), absl::Seconds(5));
    absl::StatusOr<std::unique_ptr<Supervisor>> created =
        Supervisor::Create(plans.get(), cluster.get(), supervisor_options);
    if (!created.ok()) {
      fprintf(stderr, "launcher: --autoscale: %s\n", created.status().ToString().c_str());
      (void)cluster->Stop(absl::GetFlag(FLAGS_stop_timeout));
      return 2;
    }
    supervisor = *std::move(created);
    supervisor->Start();
    printf("launcher: autoscaling prefill %d..%d, decode %d..%d (re-planned every %s)\n",
           supervisor_options.prefill.min_replicas, supervisor_options.prefill.max_replicas,
           supervisor_options.decode.min_replicas, supervisor_options.decode.max_replicas,
           absl::FormatDuration(supervisor_options.interval).c_str());
    fflush(stdout);
  }

  // Watches for a process that exits on its own.
  std::atomic<bool> unexpected_exit{false};
  absl::Notification stop_monitor;
  std::thread monitor([&] {
    while (!stop_monitor.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
      std::vector<ClusterProcessInfo> all = cluster->workers();
      all.push_back(cluster->router());
      for (const ClusterProcessInfo& p : all) {
        if (p.running) continue;
        fprintf(stderr, "launcher: %s (pid %d) exited unexpectedly: %s; see %s\n", p.name.c_str(),
                p.pid, p.exit_status.has_value() ? p.exit_status->ToString().c_str() : "unknown",
                p.log_path.c_str());
        unexpected_exit.store(true);
      }
      if (unexpected_exit.load()) {
        RequestShutdown();
        return;
      }
    }
  });

  const int sig = WaitForShutdownSignal();
  stop_monitor.Notify();
  monitor.join();
  if (sig != 0) {
    printf("launcher: got signal %d, stopping the cluster (workers drain first)\n", sig);
  } else {
    printf("launcher: stopping the rest of the cluster\n");
  }
  fflush(stdout);
  absl::Status stopped = cluster->Stop(absl::GetFlag(FLAGS_stop_timeout));
  if (supervisor != nullptr) supervisor->Stop();
  if (!stopped.ok()) {
    fprintf(stderr, "launcher: %s\n", stopped.ToString().c_str());
  } else {
    printf("launcher: all processes exited cleanly; logs in %s\n", config.log_dir.c_str());
  }
  return stopped.ok() && !unexpected_exit.load() ? 0 : 1;
}

}  // namespace
}  // namespace deepinfer::deploy

int main(int argc, char** argv) {
  // First, before any thread exists, so that every thread inherits the blocked mask.
  deepinfer::InstallShutdownSignalHandlers();
  absl::SetProgramUsageMessage(
      "Runs a local deepinfer cluster: launcher --model DIR [--prefill N] [--decode N]");
  absl::ParseCommandLine(argc, argv);
  return deepinfer::deploy::Run(argv[0]);
}
