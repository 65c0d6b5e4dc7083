// UCX backend (UCP): one context and one worker per agent, a progress thread started in Start().
//
// * Transports come from UCX's environment (UCX_TLS, UCX_TCP_*, ...), so one binary uses shared
//   memory, TCP, RDMA or CUDA IPC. What UCX 1.13 really does with ucp_put/ucp_get (measured on
//   the dev machines, see compare_perftest.sh):
//   - Shared memory (UCX_TLS=sm,self): a put is a plain copy into the peer's mapping only if the
//     peer's region came from AllocateMemory (a UCX shared-memory segment). Into memory given to
//     RegisterMemory, UCX emulates it with active messages through the shared-memory FIFO (copy
//     into a bounce buffer here, copy out by the peer's progress thread), several times slower;
//     cma is never used for puts and gets.
//   - Peer error handling excludes the shared-memory transports (they have no peer failure
//     handler): with UCX_TLS=sm,tcp,self every endpoint, data included, goes over TCP. With
//     UCX_TLS=sm,self the endpoint is made without error handling (see Connect), and a dead peer
//     shows through deadlines. Use sm,self between processes on one host.
//   - TCP: puts and gets are emulated with active messages of one segment each, so the segment
//     size decides the cost per MiB. Unless UCX_TCP_TX_SEG_SIZE / UCX_TCP_RX_SEG_SIZE are set,
//     this backend sets both to 1 MiB (UCX's 8 KiB / 64 KiB defaults are several times slower).
// * Endpoints are created from the worker address inside an imported metadata blob, with
//   UCP_ERR_HANDLING_MODE_PEER; the error callback marks the peer failed. The backend never opens
//   a listening socket (see the security note in transfer_agent.h).
// * Remote keys (ucp_rkey_pack) travel in the metadata blob. Writes are ucp_put_nbx, reads
//   ucp_get_nbx; each post ends with ucp_ep_flush_nbx, so completion means the data is visible at
//   the target, and only then is the notification sent as an active message.
// * The progress thread polls the worker while posts are in flight; after `ucx_spin_before_sleep`
//   without work it sleeps between polls, from `ucx_idle_sleep` doubling up to
//   `ucx_max_idle_sleep`, then blocks on the worker's event fd (ucp_worker_arm; the context asks
//   for UCP_FEATURE_WAKEUP and falls back to polling every `ucx_max_idle_sleep` without it).
//   Callers that post or queue work wake it through an eventfd. It also blocks while a caller is
//   inside Post issuing operations, since both would otherwise fight over the worker's spin lock.
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
