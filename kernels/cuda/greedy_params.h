// Greedy choice and logprobs on the GPU, per row of logits: the arg-max (lowest id on ties, like
// torch.argmax and engine/sampler.h's Greedy), its logprob under the row's log-softmax, and the
// top_n tokens by logit (descending, lowest id first on ties) with their logprobs — what
// engine/sampler.h's Sampler reports at temperature 0 for a request without penalties (the
// engine applies penalties before, or keeps such requests on the host). log Z = max +
// log(sum exp(x - max)) accumulated in f32 (the host sums in f64: they differ by about 1e-6
// relative). Logits may hold -inf (masked tokens); a row that is all -inf yields token 0 with
// logprob NaN, as the host's arithmetic does. Plain C++ so nvcc sees it too; the launcher is
// kernels/cuda/greedy_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_GREEDY_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_GREEDY_PARAMS_H_

#include <cstdint>

namespace deepinfer::kernels {

inline constexpr int kGreedyMaxTopN = 20;  // the API's logprobs limit

struct GreedyParams {
  // All pointers are device memory.
  const float* logits = nullptr;  // [rows, row_stride], first vocab used
  int64_t rows = 0;               // >= 0, < 2^31
  int vocab = 0;                  // > 0
  int64_t row_stride = 0;         // 0 means vocab, otherwise >= vocab
  int32_t* tokens = nullptr;      // [rows]
  float* logprobs = nullptr;      // [rows], optional
  int top_n = 0;                  // 0..kGreedyMaxTopN; min(top_n, vocab) entries are written
  int32_t* top_tokens = nullptr;  // [rows, top_n], required when top_n > 0
  float* top_logprobs = nullptr;  // [rows, top_n], required when top_n > 0
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_GREEDY_PARAMS_H_
