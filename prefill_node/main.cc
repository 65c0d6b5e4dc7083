// //prefill_node:prefill_node — serves deepinfer.internal.v1.Prefill: computes prompts' KV and
// writes it into the KV blocks decode nodes reserved (kv_transfer, layer by layer).
//
//   prefill_node --model DIR --router 127.0.0.1:7000 --kv_blocks 4096 --port_file /tmp/p0.port
//
// Registers with the router (unless standalone), serves WorkerAdmin and grpc.health.v1 beside
// Prefill, and drains on SIGTERM/SIGINT (--drain_timeout). Bad flags exit with status 2 and a
// message naming the flag.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"
#include "common/process_lifecycle.h"
#include "node/worker_flags.h"
#include "node/worker_runtime.h"
#include "prefill_node/prefill_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(absl::Duration, transfer_timeout, absl::Seconds(30),
          "Longest a request's KV transfer may take when its own deadline is later (> 0).");

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the blocked signal mask.
  deepinfer::InstallShutdownSignalHandlers();
  absl::SetProgramUsageMessage(
      "Prefill node of a deepinfer cluster: computes prompts' KV and writes it into decode nodes' "
      "reserved KV blocks.\nUsage: prefill_node --model DIR [--router HOST:PORT] [flags]");
  deepinfer::node::ConfigureWorkerFlagsUsage("prefill_node/");
  absl::ParseCommandLine(argc, argv);

  absl::Status logging = deepinfer::InitLogging("prefill_node", absl::GetFlag(FLAGS_log_level));
  if (!logging.ok()) {
    std::fprintf(stderr, "%s\n", std::string(logging.message()).c_str());
    return 2;
  }
  absl::StatusOr<deepinfer::node::WorkerOptions> options =
      deepinfer::node::WorkerOptionsFromFlags(deepinfer::internal::v1::WORKER_ROLE_PREFILL);
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  deepinfer::prefill_node::PrefillServiceOptions service_options;
  service_options.default_transfer_timeout = absl::GetFlag(FLAGS_transfer_timeout);
  if (service_options.default_transfer_timeout <= absl::ZeroDuration()) {
    std::fprintf(stderr, "--transfer_timeout: expected > 0, got %s\n",
                 absl::FormatDuration(service_options.default_transfer_timeout).c_str());
    return 2;
  }

  absl::StatusOr<std::unique_ptr<deepinfer::node::WorkerRuntime>> runtime =
      deepinfer::node::WorkerRuntime::Create(*std::move(options));
  if (!runtime.ok()) {
    spdlog::critical("startup failed: {}", runtime.status().ToString());
    return runtime.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  deepinfer::prefill_node::PrefillService service(runtime->get(), service_options);
  absl::Status started = (*runtime)->Start({&service},
                                           {deepinfer::prefill_node::PrefillService::ServiceName()},
                                           service.stats_contributor());
  if (!started.ok()) {
    spdlog::critical("startup failed: {}", started.ToString());
    (*runtime)->Drain(absl::ZeroDuration());
    return 1;
  }
  (*runtime)->RunUntilSignal();
  return 0;
}
