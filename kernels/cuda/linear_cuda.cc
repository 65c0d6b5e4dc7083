#include "kernels/cuda/linear_cuda.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/linear_launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const LinearCudaParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear: ", field, ": expected ", expected, ", got ", got));
  };
  // cuBLASLt takes 64-bit sizes; rows and leading dimensions stay below 2^31 so that every index
  // the library forms fits its kernels' arithmetic.
  constexpr int64_t kMax = 0x7fffffff;
  if (p.m < 0 || p.m > kMax) return bad("m", "in [0, 2^31)", p.m);
  if (p.n <= 0 || p.n > kMax) return bad("n", "in [1, 2^31)", p.n);
  if (p.k <= 0 || p.k > kMax) return bad("k", "in [1, 2^31)", p.k);
  if (p.ldx != 0 && (p.ldx < p.k || p.ldx > kMax)) {
    return bad("ldx", absl::StrCat("0 or in [k (", p.k, "), 2^31)"), p.ldx);
  }
  if (p.ldy != 0 && (p.ldy < p.n || p.ldy > kMax)) {
    return bad("ldy", absl::StrCat("0 or in [n (", p.n, "), 2^31)"), p.ldy);
  }
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16 && p.dtype != DType::kF32) {
    return bad("dtype", "bf16, f16 or f32", static_cast<int>(p.dtype));
  }
  if (p.workspace_bytes > 0 && p.workspace == nullptr) {
    return bad("workspace", "a device pointer when workspace_bytes > 0", "null");
  }
  if (p.m > 0) {
    if (p.x == nullptr) return bad("x", "a device pointer", "null");
    if (p.weight == nullptr) return bad("weight", "a device pointer", "null");
    if (p.y == nullptr) return bad("y", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CublasLtAvailable() {
  const char* error = cuda_raw::CublasLtLoadError();
  if (error[0] == '\0') return absl::OkStatus();
  return absl::UnavailableError(error);
}

absl::Status LinearCuda(const LinearCudaParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  if (p.m == 0) return absl::OkStatus();
  if (absl::Status loaded = CublasLtAvailable(); !loaded.ok()) return loaded;
  const int status = cuda_raw::LaunchLinearCublasLt(p, stream);
  if (status == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("linear: cublasLtMatmul: ", cuda_raw::CublasStatusName(status), " (",
                   cuda_raw::CublasStatusString(status), ")"));
}

}  // namespace deepinfer::kernels
