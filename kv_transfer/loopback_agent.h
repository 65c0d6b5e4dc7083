// In-process loopback backend: agents in one process find each other through a process-wide
// registry keyed by the address in their metadata, and transfers are memcpy. It honours the whole
// TransferAgent contract (bounds, pinning, incarnations, notifications after data, peer gone ->
// kUnavailable once the peer agent is stopped or destroyed), so unit tests of code above
// kv_transfer use it as the fake (STYLE.md 2). Posts complete synchronously inside Post().
#ifndef DEEPINFER_KV_TRANSFER_LOOPBACK_AGENT_H_
#define DEEPINFER_KV_TRANSFER_LOOPBACK_AGENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer {

// `config.backend` must be Backend::kLoopback.
absl::StatusOr<std::unique_ptr<TransferAgent>> CreateLoopbackAgent(AgentConfig config);

}  // namespace deepinfer::kv_transfer

#endif  // DEEPINFER_KV_TRANSFER_LOOPBACK_AGENT_H_
