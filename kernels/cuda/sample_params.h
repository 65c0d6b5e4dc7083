// Sampling the next token on the GPU, per row of logits, as engine/sampler.h's Sampler does for a
// request without penalties (the engine applies penalties first, or keeps such requests on the
// host): l = logits / temperature; with top-k, top-p or min-p the tokens sorted by (l descending,
// id ascending) are cut to the first top_k, then to the shortest prefix whose probability reaches
// top_p, then to those with probability >= min_p x the largest, and renormalised; otherwise a
// plain softmax. The token is the first id, in id order, whose cumulative probability exceeds
// the row's uniform draw u (drawn on the host from the request's seeded stream, so a seed gives
// the same tokens on either backend up to rounding at the draw's boundary); temperature 0 is the
// arg-max (lowest id on ties). The logprob is the chosen token's under the raw logits'
// log-softmax. Probabilities are accumulated in f64 as on the host; the order of summation
// differs, so a draw within about 1e-12 of a cumulative boundary may pick the neighbouring token.
// (-0.0 sorts below +0.0 here, while the host treats them as equal: only a tie between exactly
// those two values can order differently.) Plain C++ so nvcc sees it too; the launcher is
// kernels/cuda/sample_cuda.h.
#ifndef DEEPINFER_KERNELS_CUDA_SAMPLE_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_SAMPLE_PARAMS_H_

#include <cstddef>
#include <cstdint>

namespace deepinfer::kernels {

struct SampleParams {
  // All pointers are device memory.
  const float* logits = nullptr;  // [rows, row_stride], first vocab used
  int64_t rows = 0;               // in [0, 65535]; rows * vocab < 2^31
  int vocab = 0;                  // > 0
  int64_t row_stride = 0;         // 0 means vocab, otherwise >= vocab
  // Per row, valid as engine/sampler.h's ValidateSamplingParams says (checked on the host before
  // upload: the device trusts them).
  const float* temperature = nullptr;  // [rows], >= 0
  const int32_t* top_k = nullptr;      // [rows], <= 0 or >= vocab: no cut
  const float* top_p = nullptr;        // [rows], (0, 1]
  const float* min_p = nullptr;        // [rows], [0, 1]
  const double* uniform = nullptr;     // [rows], [0, 1)
  int32_t* tokens = nullptr;           // [rows]
  float* logprobs = nullptr;           // [rows], optional
  // Scratch: SampleWorkspaceBytes(rows, vocab) bytes (kernels/cuda/sample_cuda.h); not shared by
  // concurrent launches.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_SAMPLE_PARAMS_H_
