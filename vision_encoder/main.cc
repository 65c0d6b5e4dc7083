// //vision_encoder:vision_encoder — serves deepinfer.internal.v1.Encoder: images -> the
// embeddings that replace their placeholder tokens in a LLaVA-style model's prompt.
//
//   vision_encoder --model DIR --router 127.0.0.1:7000 --embedding_cache 256MiB
//
// Registers with the router as an encoder worker (unless standalone), serves WorkerAdmin and
// grpc.health.v1 beside Encoder, and drains on SIGTERM/SIGINT (--drain_timeout). Bad flags exit
// with status 2 and a message naming the flag.
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/process_lifecycle.h"
#include "spdlog/spdlog.h"
#include "vision_encoder/encoder_node.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0", "gRPC listen address host:port (port 0 = any).");
ABSL_FLAG(std::string, advertise_host, "",
          "Host registered with the router instead of the bound one (e.g. the pod IP).");
ABSL_FLAG(std::string, router, "", "Router host:port to register with; empty = standalone.");
ABSL_FLAG(std::string, model, "", "LLaVA-style Hugging Face model directory (required).");
ABSL_FLAG(std::string, model_id, "",
          "Model id registered (default: the directory's last component); must match the "
          "prefill/decode workers' id.");
ABSL_FLAG(std::string, worker_id, "", "Unique worker id (default encoder-<host>-<pid>).");
ABSL_FLAG(int, threads, 0, "Threads for the vision tower; 0 = all cores.");
ABSL_FLAG(std::string, embedding_cache, "256MiB",
          "Embedding cache capacity (float32 embeddings keyed by image SHA-256); 0 disables.");
ABSL_FLAG(std::string, max_image_bytes, "20MiB", "Largest encoded image accepted.");
ABSL_FLAG(int64_t, max_image_pixels, 6000LL * 6000, "Largest decoded image, width x height.");
ABSL_FLAG(int, max_images_per_request, 16, "Most images in one Encode call.");
ABSL_FLAG(std::string, port_file, "", "Write the bound port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port serving Prometheus /metrics and /healthz over HTTP (port 0 = any); "
          "empty = off.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "Longest the drain waits for in-flight Encode calls.");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or critical.");

int main(int argc, char** argv) {
  deepinfer::InstallShutdownSignalHandlers();
  absl::SetProgramUsageMessage(
      "Vision encoder node of a deepinfer cluster: encodes images into embeddings for "
      "prefill.\nUsage: vision_encoder --model DIR [--router HOST:PORT] [flags]");
  absl::FlagsUsageConfig usage;
  usage.contains_helpshort_flags = [](absl::string_view file) {
    return absl::StrContains(file, "vision_encoder/");
  };
  usage.contains_help_flags = usage.contains_helpshort_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);

  absl::Status logging = deepinfer::InitLogging("vision_encoder", absl::GetFlag(FLAGS_log_level));
  if (!logging.ok()) {
    std::fprintf(stderr, "%s\n", std::string(logging.message()).c_str());
    return 2;
  }
  deepinfer::vision_encoder::EncoderNodeOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  o.router_address = absl::GetFlag(FLAGS_router);
  o.model_path = absl::GetFlag(FLAGS_model);
  o.model_id = absl::GetFlag(FLAGS_model_id);
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  o.max_images_per_request = absl::GetFlag(FLAGS_max_images_per_request);
  o.limits.max_pixels = absl::GetFlag(FLAGS_max_image_pixels);
  absl::StatusOr<uint64_t> cache =
      deepinfer::ParseByteSize("embedding_cache", absl::GetFlag(FLAGS_embedding_cache));
  absl::StatusOr<uint64_t> image_bytes =
      deepinfer::ParseByteSize("max_image_bytes", absl::GetFlag(FLAGS_max_image_bytes));
  for (const absl::Status& s : {cache.status(), image_bytes.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  o.cache_bytes = static_cast<int64_t>(*cache);
  o.limits.max_bytes = static_cast<int64_t>(*image_bytes);
  if (!o.router_address.empty()) {
    absl::StatusOr<deepinfer::HostPort> router =
        deepinfer::ParseHostPort("router", o.router_address, /*allow_port_zero=*/false);
    if (!router.ok()) {
      std::fprintf(stderr, "%s\n", std::string(router.status().message()).c_str());
      return 2;
    }
  }
  absl::StatusOr<std::unique_ptr<deepinfer::vision_encoder::EncoderNode>> node =
      deepinfer::vision_encoder::EncoderNode::Create(std::move(o));
  if (!node.ok()) {
    spdlog::critical("startup failed: {}", node.status().ToString());
    return node.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (absl::Status s = (*node)->Start(); !s.ok()) {
    spdlog::critical("startup failed: {}", s.ToString());
    (*node)->Drain(absl::ZeroDuration());
    return 1;
  }
  (*node)->RunUntilSignal();
  return 0;
}
