#include "kernels/cuda/embedding_cuda.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const EmbeddingParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.num_tokens < 0) return bad("num_tokens", ">= 0", p.num_tokens);
  if (p.num_tokens > 0x7fffffff) return bad("num_tokens", "< 2^31", p.num_tokens);
  if (p.vocab_size <= 0) return bad("vocab_size", "> 0", p.vocab_size);
  if (p.hidden <= 0) return bad("hidden", "> 0", p.hidden);
  if (p.out_row_stride != 0 && p.out_row_stride < p.hidden) {
    return bad("out_row_stride", absl::StrCat("0 or >= hidden (", p.hidden, ")"),
               p.out_row_stride);
  }
  if (p.num_tokens > 0) {
    if (p.token_ids == nullptr) return bad("token_ids", "a device pointer", "null");
    if (p.weight == nullptr) return bad("weight", "a device pointer", "null");
    if (p.out == nullptr) return bad("out", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingCuda(const EmbeddingParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchEmbedding(p, stream), "embedding launch");
}

}  // namespace deepinfer::kernels
