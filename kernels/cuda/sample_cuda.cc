#include "kernels/cuda/sample_cuda.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

auto Bad(absl::string_view field, absl::string_view expected, auto got) {
  return absl::InvalidArgumentError(
      absl::StrCat("sample: ", field, ": expected ", expected, ", got ", got));
}

absl::Status ValidateSizes(int64_t rows, int vocab) {
  if (rows < 0 || rows > 65535) return Bad("rows", "in [0, 65535]", rows);  // a grid dimension
  if (vocab <= 0) return Bad("vocab", "> 0", vocab);
  // The segmented sort indexes items with int.
  if (rows * int64_t{vocab} > int64_t{0x7fffffff}) {
    return Bad("rows", absl::StrCat("rows * vocab (", vocab, ") < 2^31"), rows);
  }
  return absl::OkStatus();
}

absl::Status Validate(const SampleParams& p) {
  if (absl::Status s = ValidateSizes(p.rows, p.vocab); !s.ok()) return s;
  if (p.row_stride != 0 && p.row_stride < p.vocab) {
    return Bad("row_stride", absl::StrCat("0 or >= vocab (", p.vocab, ")"), p.row_stride);
  }
  if (p.rows > 0) {
    if (p.logits == nullptr) return Bad("logits", "a device pointer", "null");
    if (p.temperature == nullptr) return Bad("temperature", "a device pointer", "null");
    if (p.top_k == nullptr) return Bad("top_k", "a device pointer", "null");
    if (p.top_p == nullptr) return Bad("top_p", "a device pointer", "null");
    if (p.min_p == nullptr) return Bad("min_p", "a device pointer", "null");
    if (p.uniform == nullptr) return Bad("uniform", "a device pointer", "null");
    if (p.tokens == nullptr) return Bad("tokens", "a device pointer", "null");
    if (p.workspace == nullptr) return Bad("workspace", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<size_t> SampleWorkspaceBytes(int64_t rows, int vocab) {
  if (absl::Status s = ValidateSizes(rows, vocab); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  size_t bytes = 0;
  if (absl::Status s = CudaStatus(cuda_raw::SampleWorkspaceBytes(rows, vocab, &bytes),
                                  "sample: sizing the sort's scratch");
      !s.ok()) {
    return s;
  }
  return bytes;
}

absl::Status SampleCuda(const SampleParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  if (p.rows == 0) return absl::OkStatus();
  absl::StatusOr<size_t> needed = SampleWorkspaceBytes(p.rows, p.vocab);
  if (!needed.ok()) return needed.status();
  if (p.workspace_bytes < *needed) {
    return Bad("workspace_bytes", absl::StrCat(">= SampleWorkspaceBytes() (", *needed, ")"),
               p.workspace_bytes);
  }
  return CudaStatus(cuda_raw::LaunchSample(p, stream), "sample launch");
}

}  // namespace deepinfer::kernels
