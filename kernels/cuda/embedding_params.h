// Embedding gather on the GPU: out[t, :] = weight[token_ids[t], :], converted from the weight's
// type to the activation type (round to nearest even). Plain C++ so nvcc sees it too; the
// launcher is kernels/cuda/embedding_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_EMBEDDING_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_EMBEDDING_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

struct EmbeddingParams {
  // All pointers are device memory.
  const int32_t* token_ids = nullptr;  // [num_tokens]
  const void* weight = nullptr;        // [vocab_size, hidden], row-major, weight_dtype
  void* out = nullptr;                 // [num_tokens, out_row_stride], out_dtype
  int64_t num_tokens = 0;              // >= 0
  int64_t vocab_size = 0;              // > 0
  int64_t hidden = 0;                  // > 0
  // Elements between consecutive output rows; 0 means `hidden`. Otherwise >= hidden.
  int64_t out_row_stride = 0;
  DType weight_dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_EMBEDDING_PARAMS_H_
