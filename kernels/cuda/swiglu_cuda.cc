#include "kernels/cuda/swiglu_cuda.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const SwiGluParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("swiglu: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.rows < 0) return bad("rows", ">= 0", p.rows);
  if (p.rows > 0x7fffffff) return bad("rows", "< 2^31", p.rows);
  if (p.width <= 0 || p.width > int64_t{65535} * 1024) {
    return bad("width", "in [1, 65535 * 1024]", p.width);
  }
  const std::string stride_rule = absl::StrCat("0 or >= width (", p.width, ")");
  if (p.gate_row_stride != 0 && p.gate_row_stride < p.width) {
    return bad("gate_row_stride", stride_rule, p.gate_row_stride);
  }
  if (p.up_row_stride != 0 && p.up_row_stride < p.width) {
    return bad("up_row_stride", stride_rule, p.up_row_stride);
  }
  if (p.out_row_stride != 0 && p.out_row_stride < p.width) {
    return bad("out_row_stride", stride_rule, p.out_row_stride);
  }
  if (p.rows > 0) {
    if (p.gate == nullptr) return bad("gate", "a device pointer", "null");
    if (p.up == nullptr) return bad("up", "a device pointer", "null");
    if (p.out == nullptr) return bad("out", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SwiGluCuda(const SwiGluParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchSwiGlu(p, stream), "swiglu launch");
}

}  // namespace deepinfer::kernels
