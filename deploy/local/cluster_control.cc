#include "deploy/local/cluster_control.h"

namespace deepinfer::deploy {

const char* ClusterRoleName(ClusterRole role) {
  switch (role) {
    case ClusterRole::kRouter:
      return "router";
    case ClusterRole::kPrefill:
      return "prefill";
    case ClusterRole::kDecode:
      return "decode";
    case ClusterRole::kEncoder:
      return "encoder";
  }
  return "?";
}

}  // namespace deepinfer::deploy
