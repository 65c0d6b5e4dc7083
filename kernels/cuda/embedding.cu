// Embedding gather: one thread block per token, threads stride over the row. Memory-bound, so
// the element types are dispatched at run time per element (one instantiation).
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deepinfer::kernels::cuda_raw {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const int32_t* __restrict__ ids, const void* __restrict__ weight,
                    DType weight_dtype, void* out, DType out_dtype, int64_t vocab, int64_t hidden,
                    int64_t out_stride) {
  const int64_t row = blockIdx.x;
  const int32_t id = ids[row];
  const bool valid = id >= 0 && id < vocab;
  const int64_t src = static_cast<int64_t>(id) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += kThreads) {
    const float v = valid ? dev::LoadAny(weight, weight_dtype, src + i) : 0.0f;
    dev::StoreAny(out, out_dtype, row * out_stride + i, v);
  }
}

}  // namespace

int LaunchEmbedding(const EmbeddingParams& p, void* stream) {
  if (p.num_tokens == 0) return 0;
  const int64_t stride = p.out_row_stride == 0 ? p.hidden : p.out_row_stride;
  EmbeddingKernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(p.token_ids, p.weight, p.weight_dtype,
                                                         p.out, p.out_dtype, p.vocab_size,
                                                         p.hidden, stride);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace deepinfer::kernels::cuda_raw
