#include "kernels/rmsnorm_cpu.h"

#include <cmath>
#include <vector>

namespace deepinfer::kernels {

absl::Status RmsNormCpu(const RmsNormParams& p) {
  if (const char* error = ValidateRmsNormParams(p)) return absl::InvalidArgumentError(error);
  std::vector<float> row(p.hidden);
  const DType round = p.dtype == DType::kF32 ? p.round_to : p.dtype;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t base = r * p.hidden;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < p.hidden; ++i) {
      float x = LoadAsF32(p.input, p.dtype, base + i);
      if (p.residual != nullptr) {
        // The sum is a tensor of the activation type before it is normalised.
        x = RoundTo(round, x + LoadAsF32(p.residual, p.dtype, base + i));
        StoreFromF32(p.residual_out, p.dtype, base + i, x);
      }
      row[i] = x;
      sum_sq += static_cast<double>(x) * x;
    }
    const float inv_rms =
        1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(p.hidden)) + p.eps);
    for (int64_t i = 0; i < p.hidden; ++i) {
      // Llama rounds the normalised row to the activation type before the weight multiply;
      // Gemma (weight_offset != 0) multiplies in f32 and rounds once.
      const float normalized =
          p.weight_offset == 0.0f ? RoundTo(round, row[i] * inv_rms) : row[i] * inv_rms;
      const float w = LoadAsF32(p.weight, p.dtype, i) + p.weight_offset;
      StoreFromF32(p.output, p.dtype, base + i, RoundTo(round, w * normalized));
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::kernels
