#include "kernels/cuda/rope_cuda.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const RopeParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.num_tokens < 0) return bad("num_tokens", ">= 0", p.num_tokens);
  if (p.num_tokens > 0x7fffffff) return bad("num_tokens", "< 2^31", p.num_tokens);
  if (p.head_dim < 2 || p.head_dim > 512 || p.head_dim % 2 != 0) {
    return bad("head_dim", "even and in [2, 512]", p.head_dim);
  }
  if (p.num_heads <= 0) return bad("num_heads", "> 0", p.num_heads);
  if (p.num_kv_heads < 0) return bad("num_kv_heads", ">= 0", p.num_kv_heads);
  const int64_t q_width = static_cast<int64_t>(p.num_heads) * p.head_dim;
  const int64_t k_width = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  if (p.q_row_stride != 0 && p.q_row_stride < q_width) {
    return bad("q_row_stride", absl::StrCat("0 or >= num_heads * head_dim (", q_width, ")"),
               p.q_row_stride);
  }
  if (p.k_row_stride != 0 && p.k_row_stride < k_width) {
    return bad("k_row_stride", absl::StrCat("0 or >= num_kv_heads * head_dim (", k_width, ")"),
               p.k_row_stride);
  }
  if (p.num_tokens > 0) {
    if (p.q == nullptr) return bad("q", "a device pointer", "null");
    if ((p.k == nullptr) != (p.num_kv_heads == 0)) {
      return bad("k", "null exactly when num_kv_heads is 0",
                 p.k == nullptr ? "null" : "a pointer");
    }
    if (p.positions == nullptr) return bad("positions", "a device pointer", "null");
    if (p.inv_freq == nullptr) return bad("inv_freq", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RopeCuda(const RopeParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchRope(p, stream), "rope launch");
}

}  // namespace deepinfer::kernels
