// decode_node: serves internal.v1.Decode (plus WorkerAdmin and health) for one model. It reserves
// KV blocks for each request, has the prefill node the router named fill them over kv_transfer
// (or, with --can_prefill and no prefill node named, prefills locally), then decodes and streams
// tokens. SIGTERM/SIGINT drain it: health NOT_SERVING, deregister, finish in-flight requests.
#include <cstdio>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/process_lifecycle.h"
#include "decode_node/decode_service.h"
#include "node/worker_flags.h"
#include "node/worker_runtime.h"
#include "proto/deepinfer/internal/v1/decode.grpc.pb.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(bool, can_prefill, false,
          "Colocated mode: when the router names no prefill node for a request, prefill it on "
          "this node. Without it such requests fail with FAILED_PRECONDITION.");
ABSL_FLAG(absl::Duration, prefill_timeout, absl::Seconds(30),
          "Longest a remote prefill (compute and KV transfer) may take (> 0, e.g. 30s); past it "
          "the request fails with UNAVAILABLE so the router can retry on another prefill node.");

namespace {

int Fail(int code, const std::string& message) {
  std::fprintf(stderr, "decode_node: %s\n", message.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using deepinfer::decode_node::DecodeService;
  using deepinfer::decode_node::DecodeServiceOptions;
  deepinfer::InstallShutdownSignalHandlers();
  absl::SetProgramUsageMessage(
      "Decode node of a deepinfer cluster.\n"
      "  decode_node --model DIR --router HOST:PORT [--listen HOST:PORT] [--can_prefill] ...\n"
      "Invalid flags exit with status 2 and a message naming the flag.");
  deepinfer::node::ConfigureWorkerFlagsUsage("decode_node/");
  absl::ParseCommandLine(argc, argv);

  absl::Status st = deepinfer::InitLogging("decode_node", absl::GetFlag(FLAGS_log_level));
  if (!st.ok()) return Fail(2, std::string(st.message()));
  absl::StatusOr<deepinfer::node::WorkerOptions> options =
      deepinfer::node::WorkerOptionsFromFlags(deepinfer::internal::v1::WORKER_ROLE_DECODE);
  if (!options.ok()) return Fail(2, std::string(options.status().message()));
  options->can_prefill = absl::GetFlag(FLAGS_can_prefill);
  DecodeServiceOptions service_options;
  service_options.prefill_timeout = absl::GetFlag(FLAGS_prefill_timeout);
  if (service_options.prefill_timeout <= absl::ZeroDuration()) {
    return Fail(2, absl::StrCat("--prefill_timeout: expected > 0, got ",
                                absl::FormatDuration(service_options.prefill_timeout)));
  }

  auto runtime = deepinfer::node::WorkerRuntime::Create(*options);
  if (!runtime.ok()) return Fail(1, runtime.status().ToString());
  DecodeService service(runtime->get(), service_options);
  st = service.Start();
  if (!st.ok()) return Fail(1, st.ToString());
  st = (*runtime)->Start(
      {&service}, {deepinfer::internal::v1::Decode::service_full_name()},
      [&service](deepinfer::internal::v1::WorkerStats* stats) { service.ContributeStats(stats); });
  if (!st.ok()) {
    service.Stop();
    return Fail(1, st.ToString());
  }
  spdlog::info("decode node {} serving on {} (can_prefill={}, prefill_timeout={})",
               (*runtime)->worker_id(), (*runtime)->address(), options->can_prefill,
               absl::FormatDuration(service_options.prefill_timeout));
  (*runtime)->RunUntilSignal();
  service.Stop();
  spdlog::info("decode node {} stopped", (*runtime)->worker_id());
  return 0;
}
