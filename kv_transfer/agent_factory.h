// Creates a TransferAgent for the backend named in its config.
#ifndef DEEPINFER_KV_TRANSFER_AGENT_FACTORY_H_
#define DEEPINFER_KV_TRANSFER_AGENT_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer {

// kInvalidArgument for a bad config, kUnavailable if the backend cannot start (e.g. UCX finds no
// usable transport under the current UCX_TLS). The agent is not started: call Start().
absl::StatusOr<std::unique_ptr<TransferAgent>> CreateTransferAgent(AgentConfig config);

}  // namespace deepinfer::kv_transfer

#endif  // DEEPINFER_KV_TRANSFER_AGENT_FACTORY_H_
