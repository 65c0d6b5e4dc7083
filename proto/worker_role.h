// Names of internal.v1.WorkerRole values for logs, ids and messages.
#ifndef DEEPINFER_PROTO_WORKER_ROLE_H_
#define DEEPINFER_PROTO_WORKER_ROLE_H_

#include "absl/strings/string_view.h"
#include "proto/deepinfer/internal/v1/worker.pb.h"

namespace deepinfer {

// "prefill", "decode", "encoder", or "unspecified" for anything else.
absl::string_view WorkerRoleName(internal::v1::WorkerRole role);

}  // namespace deepinfer

#endif  // DEEPINFER_PROTO_WORKER_ROLE_H_
