#include "kv_transfer/agent_factory.h"

#include <utility>

#include "kv_transfer/loopback_agent.h"
#include "kv_transfer/ucx_agent.h"

namespace deepinfer::kv_transfer {

absl::StatusOr<std::unique_ptr<TransferAgent>> CreateTransferAgent(AgentConfig config) {
  switch (config.backend) {
    case Backend::kLoopback:
      return CreateLoopbackAgent(std::move(config));
    case Backend::kUcx:
      return CreateUcxAgent(std::move(config));
  }
  return absl::InvalidArgumentError("CreateTransferAgent: expected backend loopback or ucx");
}

}  // namespace deepinfer::kv_transfer
