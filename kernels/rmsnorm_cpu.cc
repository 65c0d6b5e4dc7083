#include "kernels/rmsnorm_cpu.h"

#include <cmath>
#include <vector>

#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

void RmsNormReference(const RmsNormParams& p) {
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
}

#if defined(__x86_64__)
// f32 buffers (the CPU engine's activations) only; hidden % 8 == 0.
DI_AVX2 void RmsNormAvx2(const RmsNormParams& p) {
  thread_local std::vector<float> row;
  if (static_cast<int64_t>(row.size()) < p.hidden) row.resize(p.hidden);
  const DType round = p.round_to;
  const __m256 offset = _mm256_set1_ps(p.weight_offset);
  const float* weight = static_cast<const float*>(p.weight);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t base = r * p.hidden;
    const float* in = static_cast<const float*>(p.input) + base;
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    for (int64_t i = 0; i < p.hidden; i += 8) {
      __m256 x = _mm256_loadu_ps(in + i);
      if (p.residual != nullptr) {
        x = avx2::RoundTo(
            round,
            _mm256_add_ps(x, _mm256_loadu_ps(static_cast<const float*>(p.residual) + base + i)));
        _mm256_storeu_ps(static_cast<float*>(p.residual_out) + base + i, x);
      }
      _mm256_storeu_ps(row.data() + i, x);
      const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
      const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
      s0 = _mm256_fmadd_pd(lo, lo, s0);
      s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(s0, s1));
    const double sum_sq = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    const float inv_rms =
        1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(p.hidden)) + p.eps);
    const __m256 vinv = _mm256_set1_ps(inv_rms);
    float* out = static_cast<float*>(p.output) + base;
    for (int64_t i = 0; i < p.hidden; i += 8) {
      __m256 normalized = _mm256_mul_ps(_mm256_loadu_ps(row.data() + i), vinv);
      if (p.weight_offset == 0.0f) normalized = avx2::RoundTo(round, normalized);
      const __m256 w = _mm256_add_ps(_mm256_loadu_ps(weight + i), offset);
      _mm256_storeu_ps(out + i, avx2::RoundTo(round, _mm256_mul_ps(w, normalized)));
    }
  }
}
#endif

}  // namespace

absl::Status RmsNormCpuWithIsa(const RmsNormParams& p, CpuIsa isa) {
  if (const char* error = ValidateRmsNormParams(p)) return absl::InvalidArgumentError(error);
#if defined(__x86_64__)
  if (IsaAtLeast(isa, CpuIsa::kAvx2) && p.dtype == DType::kF32 && p.hidden % 8 == 0) {
    RmsNormAvx2(p);
    return absl::OkStatus();
  }
#endif
  RmsNormReference(p);
  return absl::OkStatus();
}

absl::Status RmsNormCpu(const RmsNormParams& p) { return RmsNormCpuWithIsa(p, BestCpuIsa()); }

}  // namespace deepinfer::kernels
