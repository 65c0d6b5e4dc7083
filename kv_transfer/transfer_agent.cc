#include "kv_transfer/transfer_agent.h"

namespace deepinfer::kv_transfer {

absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCudaDevice:
      return "cuda";
  }
  return "unknown";
}

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kLoopback:
      return "loopback";
    case Backend::kUcx:
      return "ucx";
  }
  return "unknown";
}

}  // namespace deepinfer::kv_transfer
