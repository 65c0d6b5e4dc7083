#include "proto/worker_role.h"

namespace deepinfer {

absl::string_view WorkerRoleName(internal::v1::WorkerRole role) {
  switch (role) {
    case internal::v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case internal::v1::WORKER_ROLE_DECODE:
      return "decode";
    case internal::v1::WORKER_ROLE_ENCODER:
      return "encoder";
    default:
      return "unspecified";
  }
}

}  // namespace deepinfer
