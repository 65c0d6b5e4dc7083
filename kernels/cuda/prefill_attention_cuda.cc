#include "kernels/cuda/prefill_attention_cuda.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const PrefillAttentionParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_attention: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.num_seqs < 0 || p.num_seqs > 65535) return bad("num_seqs", "in [0, 65535]", p.num_seqs);
  if (p.num_kv_heads <= 0) return bad("num_kv_heads", "> 0", p.num_kv_heads);
  if (p.num_heads <= 0 || p.num_heads > 65535 || p.num_heads % p.num_kv_heads != 0) {
    return bad("num_heads",
               absl::StrCat("a multiple of num_kv_heads (", p.num_kv_heads, ") up to 65535"),
               p.num_heads);
  }
  if (p.head_dim < 32 || p.head_dim > kPrefillAttentionMaxHeadDim || p.head_dim % 32 != 0) {
    return bad("head_dim",
               absl::StrCat("a multiple of 32 in [32, ", kPrefillAttentionMaxHeadDim, "]"),
               p.head_dim);
  }
  if (p.block_size <= 0) return bad("block_size", "> 0", p.block_size);
  if (p.num_blocks <= 0) return bad("num_blocks", "> 0", p.num_blocks);
  if (p.max_blocks_per_seq <= 0) return bad("max_blocks_per_seq", "> 0", p.max_blocks_per_seq);
  const int64_t block_elements = static_cast<int64_t>(p.block_size) * p.num_kv_heads * p.head_dim;
  if (p.block_stride < block_elements) {
    return bad("block_stride",
               absl::StrCat(">= block_size * num_kv_heads * head_dim (", block_elements, ")"),
               p.block_stride);
  }
  // The grid's x dimension counts query tiles.
  if (p.max_query_len < 0 || p.max_query_len > (int64_t{1} << 30)) {
    return bad("max_query_len", "in [0, 2^30]", p.max_query_len);
  }
  if (p.sliding_window < 0) return bad("sliding_window", ">= 0", p.sliding_window);
  if (!std::isfinite(p.scale)) return bad("scale", "finite", p.scale);
  if (p.num_seqs > 0 && p.max_query_len > 0) {
    if (p.q == nullptr) return bad("q", "a device pointer", "null");
    if (p.out == nullptr) return bad("out", "a device pointer", "null");
    if (p.k_cache == nullptr) return bad("k_cache", "a device pointer", "null");
    if (p.v_cache == nullptr) return bad("v_cache", "a device pointer", "null");
    if (p.block_tables == nullptr) return bad("block_tables", "a device pointer", "null");
    if (p.query_starts == nullptr) return bad("query_starts", "a device pointer", "null");
    if (p.start_positions == nullptr) return bad("start_positions", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PrefillAttentionCuda(const PrefillAttentionParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchPrefillAttention(p, stream), "prefill_attention launch");
}

}  // namespace deepinfer::kernels
