// RoPE on the GPU, in place on the q and k rows of a ragged batch (tokens of several sequences
// laid end to end, each with its own position). Numerics: kernels/rope.h, with cos/sin computed
// on the device from the same f32 inv_freq (cosf/sinf, within 2 ulp of f32 before rounding).
// Plain C++ so nvcc sees it too; the launcher is kernels/cuda/rope_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_ROPE_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_ROPE_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

struct RopeParams {
  // All pointers are device memory; q and k are rotated in place.
  void* q = nullptr;  // [num_tokens, q_row_stride], first num_heads * head_dim used, dtype
  void* k = nullptr;  // [num_tokens, k_row_stride], first num_kv_heads * head_dim; null iff
                      // num_kv_heads == 0
  const int32_t* positions = nullptr;  // [num_tokens]; a negative position skips the token
  const float* inv_freq = nullptr;     // [head_dim / 2], from RopeInvFreq (kernels/rope.h)
  int64_t num_tokens = 0;              // >= 0
  int num_heads = 0;                   // > 0
  int num_kv_heads = 0;                // >= 0
  int head_dim = 0;                    // even, in [2, 512]
  // Elements between consecutive tokens' rows; 0 means heads * head_dim (packed). Lets q and k
  // be slices of a fused qkv projection output.
  int64_t q_row_stride = 0;
  int64_t k_row_stride = 0;
  DType dtype = DType::kBF16;  // of q and k; also the rounding type of cos/sin and products
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_ROPE_PARAMS_H_
