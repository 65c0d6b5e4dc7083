#include "kernels/softmax_cpu.h"

#include <cmath>

#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

float RowMaxReference(const float* x, int64_t begin, int64_t end, float m) {
  for (int64_t i = begin; i < end; ++i) {
    if (x[i] > m) m = x[i];
  }
  return m;
}

double SumExpReference(const float* x, int64_t begin, int64_t end, float shift) {
  double sum = 0.0;
  for (int64_t i = begin; i < end; ++i) sum += std::exp(static_cast<double>(x[i] - shift));
  return sum;
}

#if defined(__x86_64__)
DI_AVX2 float RowMaxAvx2(const float* x, int64_t n) {
  if (n < 8) return RowMaxReference(x, 1, n, x[0]);
  __m256 m = _mm256_loadu_ps(x);
  int64_t i = 8;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float best = lanes[0];
  for (int l = 1; l < 8; ++l) best = lanes[l] > best ? lanes[l] : best;
  return RowMaxReference(x, i, n, best);
}

DI_AVX2 double SumExpAvx2(const float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  // Four accumulators: the adds of one do not wait on the previous vector's.
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int a = 0; a < 4; ++a) {
      acc[a] = _mm256_add_ps(acc[a],
                             avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * a), s)));
    }
  }
  for (; i + 8 <= n; i += 8) {
    acc[0] = _mm256_add_ps(acc[0], avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  }
  const __m256 total =
      _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  return static_cast<double>(avx2::Hsum(total)) + SumExpReference(x, i, n, shift);
}
#endif

}  // namespace

float RowMaxCpuWithIsa(const float* x, int64_t n, CpuIsa isa) {
#if defined(__x86_64__)
  if (IsaAtLeast(isa, CpuIsa::kAvx2)) return RowMaxAvx2(x, n);
#endif
  (void)isa;
  return RowMaxReference(x, 1, n, x[0]);
}

double SumExpCpuWithIsa(const float* x, int64_t n, float shift, CpuIsa isa) {
#if defined(__x86_64__)
  if (IsaAtLeast(isa, CpuIsa::kAvx2)) return SumExpAvx2(x, n, shift);
#endif
  (void)isa;
  return SumExpReference(x, 0, n, shift);
}

float RowMaxCpu(const float* x, int64_t n) { return RowMaxCpuWithIsa(x, n, BestCpuIsa()); }

double SumExpCpu(const float* x, int64_t n, float shift) {
  return SumExpCpuWithIsa(x, n, shift, BestCpuIsa());
}

}  // namespace deepinfer::kernels
