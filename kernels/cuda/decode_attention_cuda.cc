#include "kernels/cuda/decode_attention_cuda.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

constexpr int kMaxContext = 1 << 20;  // keeps the reduce kernel's weights in shared memory

absl::Status Validate(const DecodeAttentionParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode_attention: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.num_seqs < 0 || p.num_seqs > 65535) return bad("num_seqs", "in [0, 65535]", p.num_seqs);
  if (p.num_kv_heads <= 0) return bad("num_kv_heads", "> 0", p.num_kv_heads);
  if (p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0 ||
      p.num_heads / p.num_kv_heads > kDecodeAttentionMaxGroup) {
    return bad("num_heads",
               absl::StrCat("a multiple of num_kv_heads (", p.num_kv_heads, ") at most ",
                            kDecodeAttentionMaxGroup, " times it"),
               p.num_heads);
  }
  if (p.head_dim < 32 || p.head_dim > kDecodeAttentionMaxHeadDim || p.head_dim % 32 != 0) {
    return bad("head_dim",
               absl::StrCat("a multiple of 32 in [32, ", kDecodeAttentionMaxHeadDim, "]"),
               p.head_dim);
  }
  if (p.block_size <= 0) return bad("block_size", "> 0", p.block_size);
  if (p.num_blocks <= 0) return bad("num_blocks", "> 0", p.num_blocks);
  const int64_t block_elements =
      static_cast<int64_t>(p.block_size) * p.num_kv_heads * p.head_dim;
  if (p.block_stride < block_elements) {
    return bad("block_stride",
               absl::StrCat(">= block_size * num_kv_heads * head_dim (", block_elements, ")"),
               p.block_stride);
  }
  if (p.max_context_len < 0 || p.max_context_len > kMaxContext) {
    return bad("max_context_len", absl::StrCat("in [0, ", kMaxContext, "]"), p.max_context_len);
  }
  const int64_t needed_blocks = (int64_t{p.max_context_len} + p.block_size - 1) / p.block_size;
  if (p.max_blocks_per_seq <= 0 || p.max_blocks_per_seq < needed_blocks) {
    return bad("max_blocks_per_seq",
               absl::StrCat(">= max(1, ceil(max_context_len / block_size)) (", needed_blocks, ")"),
               p.max_blocks_per_seq);
  }
  if (p.sliding_window < 0) return bad("sliding_window", ">= 0", p.sliding_window);
  if (!std::isfinite(p.scale)) return bad("scale", "finite", p.scale);
  if (p.num_seqs > 0) {
    if (p.q == nullptr) return bad("q", "a device pointer", "null");
    if (p.out == nullptr) return bad("out", "a device pointer", "null");
    if (p.k_cache == nullptr) return bad("k_cache", "a device pointer", "null");
    if (p.v_cache == nullptr) return bad("v_cache", "a device pointer", "null");
    if (p.block_tables == nullptr) return bad("block_tables", "a device pointer", "null");
    if (p.context_lens == nullptr) return bad("context_lens", "a device pointer", "null");
    const size_t needed = DecodeAttentionWorkspaceBytes(p);
    if (needed > 0 && (p.workspace == nullptr || p.workspace_bytes < needed)) {
      return bad("workspace_bytes",
                 absl::StrCat(">= DecodeAttentionWorkspaceBytes() (", needed,
                              ") with a non-null workspace"),
                 p.workspace == nullptr ? std::string("a null workspace")
                                        : absl::StrCat(p.workspace_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeAttentionCuda(const DecodeAttentionParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchDecodeAttention(p, stream), "decode_attention launch");
}

}  // namespace deepinfer::kernels
