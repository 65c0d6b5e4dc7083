#include "kernels/rope.h"

#include <cmath>

namespace deepinfer::kernels {

void RopeInvFreq(const RopeScaling& s, int head_dim, float* inv) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(s.theta), exponent);
  }
  if (s.type == RopeScalingType::kLinear) {
    for (int i = 0; i < half; ++i) inv[i] = inv[i] / static_cast<float>(s.factor);
  } else if (s.type == RopeScalingType::kLlama3) {
    const float factor = static_cast<float>(s.factor);
    const float low = static_cast<float>(s.low_freq_factor);
    const float high = static_cast<float>(s.high_freq_factor);
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const float low_wavelen = old_len / low;
    const float high_wavelen = old_len / high;
    for (int i = 0; i < half; ++i) {
      const float f = inv[i];
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      const float scaled = wavelen > low_wavelen ? f / factor : f;
      const float smooth = (old_len / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      inv[i] = medium ? smoothed : scaled;
    }
  }
}

void ApplyRopeCpu(float* x, int64_t num_tokens, int64_t row_stride, int num_heads, int head_dim,
                  const int64_t* positions, const float* inv_freq, DType rt) {
  const int half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      const float c = RoundTo(rt, std::cos(angle));
      const float s = RoundTo(rt, std::sin(angle));
      for (int h = 0; h < num_heads; ++h) {
        float* vec = x + t * row_stride + static_cast<int64_t>(h) * head_dim;
        const float a = vec[i], b = vec[i + half];
        vec[i] = RoundTo(rt, RoundTo(rt, a * c) - RoundTo(rt, b * s));
        vec[i + half] = RoundTo(rt, RoundTo(rt, b * c) + RoundTo(rt, a * s));
      }
    }
  }
}

}  // namespace deepinfer::kernels
