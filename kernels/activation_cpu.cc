#include "kernels/activation_cpu.h"

#include <algorithm>
#include <cmath>

#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

void SwiGluReference(const float* gate, const float* up, float* out, int64_t begin, int64_t end,
                     DType rt) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = gate[i];
    const float silu = g / (1.0f + std::exp(-g));
    out[i] = RoundTo(rt, RoundTo(rt, silu) * up[i]);
  }
}

#if defined(__x86_64__)
DI_AVX2 void SwiGluAvx2(const float* gate, const float* up, float* out, int64_t begin, int64_t end,
                        DType rt) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = avx2::Exp(_mm256_xor_ps(g, sign));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, avx2::RoundTo(rt, _mm256_mul_ps(avx2::RoundTo(rt, silu),
                                                              _mm256_loadu_ps(up + i))));
  }
  SwiGluReference(gate, up, out, i, end, rt);
}
#endif

}  // namespace

void SwiGluCpuWithIsa(const float* gate, const float* up, float* out, int64_t count, DType round_to,
                      ThreadPool* pool, CpuIsa isa) {
  auto work = [&](int64_t begin, int64_t end) {
#if defined(__x86_64__)
    if (IsaAtLeast(isa, CpuIsa::kAvx2)) {
      SwiGluAvx2(gate, up, out, begin, end, round_to);
      return;
    }
#endif
    SwiGluReference(gate, up, out, begin, end, round_to);
  };
  // Chunks are multiples of 8 so the vector path covers everything but the very end.
  constexpr int64_t kMinChunk = 4096;
  if (pool != nullptr && count > kMinChunk) {
    pool->ParallelFor((count + 7) / 8, kMinChunk / 8,
                      [&](int64_t b, int64_t e) { work(b * 8, std::min(count, e * 8)); });
  } else {
    work(0, count);
  }
}

void SwiGluCpu(const float* gate, const float* up, float* out, int64_t count, DType round_to,
               ThreadPool* pool) {
  SwiGluCpuWithIsa(gate, up, out, count, round_to, pool, BestCpuIsa());
}

}  // namespace deepinfer::kernels
