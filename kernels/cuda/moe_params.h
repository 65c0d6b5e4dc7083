// Parameters of the CUDA mixture-of-experts ops (kernels/cuda/moe_cuda.h). Plain C++ (nvcc
// compiles it too). The expert MLPs themselves are dense projections (kernels/cuda/linear_cuda.h)
// over each expert's gathered rows; these ops route tokens and combine the experts' outputs with
// the numerics of the CPU model (engine/model.cc RunMoe).
#ifndef DEEPINFER_KERNELS_CUDA_MOE_PARAMS_H_
#define DEEPINFER_KERNELS_CUDA_MOE_PARAMS_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

inline constexpr int kMoeMaxExperts = 512;
inline constexpr int kMoeMaxTopK = 32;

// Routing: per row, softmax over the router logits in f32, the top_k experts (ties: the lower
// expert index first, as a stable sort), optionally renormalised to sum to 1, each weight rounded
// to `dtype`.
struct MoeRouteParams {
  // Device memory.
  const void* logits = nullptr;   // [rows, num_experts], dtype
  int32_t* expert_ids = nullptr;  // [rows, top_k]: chosen experts, most probable first
  float* weights = nullptr;       // [rows, top_k]: their routing weights (values of dtype)
  int64_t rows = 0;               // >= 0
  int num_experts = 0;            // in [1, kMoeMaxExperts]
  int top_k = 0;                  // in [1, min(num_experts, kMoeMaxTopK)]
  bool normalize = true;
  DType dtype = DType::kBF16;
};

// Combining: out[t] = sum over j of round(expert_out[rows_of[t, j]] * weight[t, j]), accumulated
// in the given order (callers list each token's experts in ascending expert index, the CPU
// model's order) with a rounding to dtype after every product and every addition.
struct MoeCombineParams {
  // Device memory.
  const void* expert_out = nullptr;      // [assignments, hidden], dtype: the experts' outputs
  const int32_t* token_rows = nullptr;   // [rows, top_k]: rows of expert_out per token
  const float* token_weights = nullptr;  // [rows, top_k]
  void* out = nullptr;                   // [rows, hidden], dtype
  int64_t rows = 0;                      // >= 0
  int top_k = 0;                         // in [1, kMoeMaxTopK]
  int64_t hidden = 0;                    // > 0
  int64_t assignments = 0;               // rows of expert_out; token_rows outside are skipped
  DType dtype = DType::kBF16;
};

// Qwen2-MoE's shared expert: out[t] = round(out[t] + round(g * shared[t])) with
// g = round(sigmoid(gate_logit[t])).
struct MoeSharedParams {
  // Device memory.
  void* out = nullptr;                // [rows, hidden], dtype
  const void* shared = nullptr;       // [rows, hidden], dtype
  const void* gate_logits = nullptr;  // [rows], dtype
  int64_t rows = 0;                   // >= 0
  int64_t hidden = 0;                 // > 0
  DType dtype = DType::kBF16;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_CUDA_MOE_PARAMS_H_
