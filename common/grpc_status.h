// absl::Status <-> grpc::Status. The codes share numbering (both follow google.rpc.Code), so the
// mapping is 1:1 and the message travels unchanged (STYLE.md 1).
#ifndef DEEPINFER_COMMON_GRPC_STATUS_H_
#define DEEPINFER_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace deepinfer {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_GRPC_STATUS_H_
