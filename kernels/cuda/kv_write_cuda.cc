#include "kernels/cuda/kv_write_cuda.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels {
namespace {

absl::Status Validate(const KvWriteParams& p) {
  auto bad = [](absl::string_view field, absl::string_view expected, auto got) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_write: ", field, ": expected ", expected, ", got ", got));
  };
  if (p.num_tokens < 0) return bad("num_tokens", ">= 0", p.num_tokens);
  if (p.num_tokens > 0x7fffffff) return bad("num_tokens", "< 2^31", p.num_tokens);
  if (p.num_kv_heads <= 0) return bad("num_kv_heads", "> 0", p.num_kv_heads);
  if (p.head_dim <= 0) return bad("head_dim", "> 0", p.head_dim);
  if (p.block_size <= 0) return bad("block_size", "> 0", p.block_size);
  if (p.num_blocks <= 0) return bad("num_blocks", "> 0", p.num_blocks);
  if (p.max_blocks_per_seq <= 0) return bad("max_blocks_per_seq", "> 0", p.max_blocks_per_seq);
  const int64_t width = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t block_elements = width * p.block_size;
  if (p.block_stride < block_elements) {
    return bad("block_stride",
               absl::StrCat(">= block_size * num_kv_heads * head_dim (", block_elements, ")"),
               p.block_stride);
  }
  const std::string stride_rule = absl::StrCat("0 or >= num_kv_heads * head_dim (", width, ")");
  if (p.k_row_stride != 0 && p.k_row_stride < width) {
    return bad("k_row_stride", stride_rule, p.k_row_stride);
  }
  if (p.v_row_stride != 0 && p.v_row_stride < width) {
    return bad("v_row_stride", stride_rule, p.v_row_stride);
  }
  if (p.num_tokens > 0) {
    if (p.num_seqs <= 0) return bad("num_seqs", "> 0", p.num_seqs);
    if (p.k == nullptr) return bad("k", "a device pointer", "null");
    if (p.v == nullptr) return bad("v", "a device pointer", "null");
    if (p.k_cache == nullptr) return bad("k_cache", "a device pointer", "null");
    if (p.v_cache == nullptr) return bad("v_cache", "a device pointer", "null");
    if (p.positions == nullptr) return bad("positions", "a device pointer", "null");
    if (p.token_seq == nullptr) return bad("token_seq", "a device pointer", "null");
    if (p.block_tables == nullptr) return bad("block_tables", "a device pointer", "null");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KvWriteCuda(const KvWriteParams& p, void* stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (absl::Status available = CudaAvailable(); !available.ok()) return available;
  return CudaStatus(cuda_raw::LaunchKvWrite(p, stream), "kv_write launch");
}

}  // namespace deepinfer::kernels
