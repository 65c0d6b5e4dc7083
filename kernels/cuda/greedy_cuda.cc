#include "kernels/cuda/greedy_cuda.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const GreedyParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("greedy: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.rows < 0 || p.rows > 0x7fffffff) return bad("rows", "in [0, 2^31)", p.rows);
  if (p.vocab <= 0) return bad("vocab", "> 0", p.vocab);
  if (p.row_stride != 0 && p.row_stride < p.vocab) {
    return bad("row_stride", absl::StrCat("0 or >= vocab (", p.vocab, ")"), p.row_stride);
  }
  if (p.top_n < 0 || p.top_n > kGreedyMaxTopN) {
    return bad("top_n", absl::StrCat("in [0, ", kGreedyMaxTopN, "]"), p.top_n);
  }
  if (p.rows > 0) {
    if (p.logits == nullptr) return bad("logits", "a device pointer", "null");
    if (p.tokens == nullptr) return bad("tokens", "a device pointer", "null");
    if (p.top_n > 0 && p.top_tokens == nullptr) {
      return bad("top_tokens", "a device pointer when top_n > 0", "null");
    }
    if (p.top_n > 0 && p.top_logprobs == nullptr) {
      return bad("top_logprobs", "a device pointer when top_n > 0", "null");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GreedyCuda(const GreedyParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchGreedy(p, stream), "greedy launch");
}

}  // namespace deepinfer::kernels
