// UCX backend (UCP): one context and one worker per agent, a progress thread started in Start().
//
// * Transports come from UCX's environment (UCX_TLS, UCX_TCP_*, ...), so one binary uses shared
//   memory, TCP, RDMA or CUDA IPC. Good settings measured on the dev machines: UCX_TLS=sm,self for
//   one host; UCX_TLS=tcp,self with UCX_TCP_TX_SEG_SIZE=512k UCX_TCP_RX_SEG_SIZE=512k over TCP
//   (several times faster than UCX's TCP defaults for 1 MiB blocks).
// * Endpoints are created from the worker address inside an imported metadata blob, with
//   UCP_ERR_HANDLING_MODE_PEER; the error callback marks the peer failed. The backend never opens
//   a listening socket (see the security note in transfer_agent.h).
// * Remote keys (ucp_rkey_pack) travel in the metadata blob. Writes are ucp_put_nbx, reads
//   ucp_get_nbx; each post ends with ucp_ep_flush_nbx, so completion means the data is visible at
//   the target, and only then is the notification sent as an active message.
// * Device memory: supported only if this UCX build reports CUDA memory support; otherwise
//   SupportsMemoryKind(kCudaDevice) gives kUnimplemented.
#ifndef DEEPINFER_KV_TRANSFER_UCX_AGENT_H_
#define DEEPINFER_KV_TRANSFER_UCX_AGENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer {

// `config.backend` must be Backend::kUcx.
absl::StatusOr<std::unique_ptr<TransferAgent>> CreateUcxAgent(AgentConfig config);

}  // namespace deepinfer::kv_transfer

#endif  // DEEPINFER_KV_TRANSFER_UCX_AGENT_H_
