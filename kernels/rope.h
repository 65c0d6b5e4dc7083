// Rotary position embedding (RoPE), "rotate half" form as in Hugging Face transformers' Llama:
// for i < head_dim/2, (x[i], x[i + head_dim/2]) is rotated by angle = position * inv_freq[i].
//
// Numerics follow engine/model.cc (and transformers): inv_freq in f32 from the scaling below;
// angle = float(position) * inv_freq[i] in f32; cos and sin rounded to the activation type;
//   x'[i]        = round(round(a * cos) - round(b * sin))
//   x'[i + half] = round(round(b * cos) + round(a * sin))
// with a = x[i], b = x[i + half] and round = rounding to the activation type.
//
// Plain C++ (nvcc-compatible). The CPU reference is here; the CUDA op is kernels/cuda/rope_cuda.h.
#ifndef DEEPINFER_KERNELS_ROPE_H_
#define DEEPINFER_KERNELS_ROPE_H_

#include <cstdint>

#include "kernels/dtype.h"

namespace deepinfer::kernels {

enum class RopeScalingType : uint8_t { kDefault = 0, kLinear = 1, kLlama3 = 2 };

// The scalings the engine supports (engine/model_config.h RopeConfig).
struct RopeScaling {
  double theta = 10000.0;
  RopeScalingType type = RopeScalingType::kDefault;
  double factor = 1.0;  // kLinear, kLlama3
  // kLlama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq[0 .. head_dim/2), computed in f32 as transformers does (the same code as
// engine/model.cc). head_dim must be even and > 0.
void RopeInvFreq(const RopeScaling& scaling, int head_dim, float* inv_freq);

// CPU reference, in place: x holds num_tokens rows of `row_stride` elements; the first
// `num_heads` vectors of head_dim elements of row t are rotated for positions[t]. The buffers
// are f32 holding values of `round_to` (as the CPU engine keeps activations). inv_freq as above.
void ApplyRopeCpu(float* x, int64_t num_tokens, int64_t row_stride, int num_heads, int head_dim,
                  const int64_t* positions, const float* inv_freq, DType round_to);

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_ROPE_H_
