#include "kernels/cuda/moe_cuda.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

template <typename T>
absl::Status Bad(absl::string_view op, absl::string_view field, absl::string_view expected,
                 const T& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", field, ": expected ", expected, ", got ", got));
}

bool KnownDType(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

absl::Status Validate(const MoeRouteParams& p) {
  constexpr absl::string_view op = "moe route";
  if (p.rows < 0 || p.rows > 0x7fffffff) return Bad(op, "rows", "in [0, 2^31)", p.rows);
  if (p.num_experts < 1 || p.num_experts > kMoeMaxExperts) {
    return Bad(op, "num_experts", absl::StrCat("in [1, ", kMoeMaxExperts, "]"), p.num_experts);
  }
  if (p.top_k < 1 || p.top_k > std::min(p.num_experts, kMoeMaxTopK)) {
    return Bad(op, "top_k", absl::StrCat("in [1, ", std::min(p.num_experts, kMoeMaxTopK), "]"),
               p.top_k);
  }
  if (!KnownDType(p.dtype)) return Bad(op, "dtype", "f32, bf16 or f16", static_cast<int>(p.dtype));
  if (p.rows > 0) {
    if (p.logits == nullptr) return Bad(op, "logits", "a device pointer", "null");
    if (p.expert_ids == nullptr) return Bad(op, "expert_ids", "a device pointer", "null");
    if (p.weights == nullptr) return Bad(op, "weights", "a device pointer", "null");
  }
  return absl::OkStatus();
}

absl::Status Validate(const MoeCombineParams& p) {
  constexpr absl::string_view op = "moe combine";
  if (p.rows < 0 || p.rows > 0x7fffffff) return Bad(op, "rows", "in [0, 2^31)", p.rows);
  if (p.top_k < 1 || p.top_k > kMoeMaxTopK) {
    return Bad(op, "top_k", absl::StrCat("in [1, ", kMoeMaxTopK, "]"), p.top_k);
  }
  if (p.hidden <= 0) return Bad(op, "hidden", "> 0", p.hidden);
  if (p.assignments < 0) return Bad(op, "assignments", ">= 0", p.assignments);
  if (!KnownDType(p.dtype)) return Bad(op, "dtype", "f32, bf16 or f16", static_cast<int>(p.dtype));
  if (p.rows > 0) {
    if (p.expert_out == nullptr && p.assignments > 0) {
      return Bad(op, "expert_out", "a device pointer", "null");
    }
    if (p.token_rows == nullptr) return Bad(op, "token_rows", "a device pointer", "null");
    if (p.token_weights == nullptr) return Bad(op, "token_weights", "a device pointer", "null");
    if (p.out == nullptr) return Bad(op, "out", "a device pointer", "null");
  }
  return absl::OkStatus();
}

absl::Status Validate(const MoeSharedParams& p) {
  constexpr absl::string_view op = "moe shared";
  if (p.rows < 0 || p.rows > 0x7fffffff) return Bad(op, "rows", "in [0, 2^31)", p.rows);
  if (p.hidden <= 0) return Bad(op, "hidden", "> 0", p.hidden);
  if (!KnownDType(p.dtype)) return Bad(op, "dtype", "f32, bf16 or f16", static_cast<int>(p.dtype));
  if (p.rows > 0) {
    if (p.out == nullptr) return Bad(op, "out", "a device pointer", "null");
    if (p.shared == nullptr) return Bad(op, "shared", "a device pointer", "null");
    if (p.gate_logits == nullptr) return Bad(op, "gate_logits", "a device pointer", "null");
  }
  return absl::OkStatus();
}

template <typename P>
absl::Status Launch(const P& p, void* stream, int (*launch)(const P&, void*), const char* what) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(launch(p, stream), what);
}

}  // namespace

absl::Status MoeRouteCuda(const MoeRouteParams& p, void* stream) {
  return Launch(p, stream, &cuda_raw::LaunchMoeRoute, "moe route launch");
}

absl::Status MoeCombineCuda(const MoeCombineParams& p, void* stream) {
  return Launch(p, stream, &cuda_raw::LaunchMoeCombine, "moe combine launch");
}

absl::Status MoeSharedCuda(const MoeSharedParams& p, void* stream) {
  return Launch(p, stream, &cuda_raw::LaunchMoeShared, "moe shared launch");
}

}  // namespace deepinfer::kernels
