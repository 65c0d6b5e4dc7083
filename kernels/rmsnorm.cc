#include "kernels/rmsnorm.h"

namespace deepinfer::kernels {

const char* ValidateRmsNormParams(const RmsNormParams& p) {
  if (p.input == nullptr) return "rmsnorm: input is null";
  if (p.weight == nullptr) return "rmsnorm: weight is null";
  if (p.output == nullptr) return "rmsnorm: output is null";
  if ((p.residual == nullptr) != (p.residual_out == nullptr)) {
    return "rmsnorm: residual and residual_out must both be set or both be null";
  }
  if (p.rows < 0) return "rmsnorm: rows must be >= 0";
  if (p.hidden <= 0) return "rmsnorm: hidden must be > 0";
  if (!(p.eps > 0.0f)) return "rmsnorm: eps must be > 0";
  if (p.dtype != DType::kF32 && p.round_to != DType::kF32 && p.round_to != p.dtype) {
    return "rmsnorm: round_to must be f32 or equal to dtype when dtype is not f32";
  }
  return nullptr;
}

}  // namespace deepinfer::kernels
