// The command-line flags the prefill_node and decode_node binaries share (Abseil flags), and
// their conversion into WorkerOptions. Role-only flags (decode: --can_prefill,
// --prefill_timeout) live in the role's binary. Speculative decoding keeps the flags an operator
// needs (--speculative, --draft_model, --num_speculative_tokens, --draft_kv_blocks,
// --spec_adaptive); its research knobs come from the --spec_config file (node/spec_config.h).
//
// Thread-safety: WorkerOptionsFromFlags reads the flags; call it from main() after parsing.
#ifndef DEEPINFER_NODE_WORKER_FLAGS_H_
#define DEEPINFER_NODE_WORKER_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "node/worker_runtime.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

ABSL_DECLARE_FLAG(std::string, listen);
ABSL_DECLARE_FLAG(std::string, advertise_host);
ABSL_DECLARE_FLAG(std::string, router);
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, model_id);
ABSL_DECLARE_FLAG(std::string, worker_id);
ABSL_DECLARE_FLAG(int, kv_blocks);
ABSL_DECLARE_FLAG(int, block_size);
ABSL_DECLARE_FLAG(int, max_batch_tokens);
ABSL_DECLARE_FLAG(int, max_running);
ABSL_DECLARE_FLAG(int, max_waiting);
ABSL_DECLARE_FLAG(bool, prefix_cache);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, overlap);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(uint64_t, hash_seed);
ABSL_DECLARE_FLAG(std::string, kv_transport);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(absl::Duration, drain_timeout);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, speculative);
ABSL_DECLARE_FLAG(int, num_speculative_tokens);
ABSL_DECLARE_FLAG(bool, spec_adaptive);
ABSL_DECLARE_FLAG(std::string, spec_config);
ABSL_DECLARE_FLAG(std::string, draft_model);
ABSL_DECLARE_FLAG(int, draft_kv_blocks);

namespace deepinfer::node {

// WorkerOptions for `role` from the flags above. kInvalidArgument naming the flag
// ("--kv_blocks: expected > 0, got 0") for a bad value. --log_level is validated here too but
// applied by the caller (InitLogging).
absl::StatusOr<WorkerOptions> WorkerOptionsFromFlags(internal::v1::WorkerRole role);

// Makes --help (and --helpshort) list the flags defined under `binary_dir` (e.g.
// "prefill_node/") and the shared worker flags, instead of Abseil's default filter (which
// matches only files named after the binary). Call before absl::ParseCommandLine.
void ConfigureWorkerFlagsUsage(std::string binary_dir);

}  // namespace deepinfer::node

#endif  // DEEPINFER_NODE_WORKER_FLAGS_H_
