#include "kernels/softmax_cpu.h"

#include <cmath>
#include <limits>

#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

// NaN entries are skipped (as std::max_element skips them after a first entry that is not NaN).
float RowMaxReference(const float* x, int64_t begin, int64_t end, float m) {
  for (int64_t i = begin; i < end; ++i) {
    if (x[i] > m) m = x[i];
  }
  return m;
}

int64_t FindReference(const float* x, int64_t begin, int64_t end, float m) {
  for (int64_t i = begin; i < end; ++i) {
    if (x[i] == m) return i;
  }
  return -1;
}

double SumExpReference(const float* x, int64_t begin, int64_t end, float shift) {
  double sum = 0.0;
  for (int64_t i = begin; i < end; ++i) sum += std::exp(static_cast<double>(x[i] - shift));
  return sum;
}

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

#if defined(__x86_64__)
DI_AVX2 float RowMaxAvx2(const float* x, int64_t n) {
  // max(new, m) returns m where new is NaN: NaN entries are skipped, as in the reference.
  __m256 m = _mm256_set1_ps(kMinusInf);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  return RowMaxReference(x, i, n, RowMaxReference(lanes, 0, 8, kMinusInf));
}

DI_AVX2 int64_t FindAvx2(const float* x, int64_t n, float m) {
  const __m256 v = _mm256_set1_ps(m);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), v, _CMP_EQ_OQ));
    if (mask != 0) return i + __builtin_ctz(static_cast<unsigned>(mask));
  }
  return FindReference(x, i, n, m);
}

DI_AVX2 double SumExpAvx2(const float* x, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  // Four accumulators: the adds of one do not wait on the previous vector's.
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int a = 0; a < 4; ++a) {
      acc[a] = _mm256_add_ps(acc[a], avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * a), s)));
    }
  }
  for (; i + 8 <= n; i += 8) {
    acc[0] = _mm256_add_ps(acc[0], avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  }
  const __m256 total = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  return static_cast<double>(avx2::Hsum(total)) + SumExpReference(x, i, n, shift);
}
#endif

}  // namespace

float RowMaxCpuWithIsa(const float* x, int64_t n, CpuIsa isa) {
#if defined(__x86_64__)
  if (IsaAtLeast(isa, CpuIsa::kAvx2)) return RowMaxAvx2(x, n);
#endif
  (void)isa;
  return RowMaxReference(x, 0, n, kMinusInf);
}

int64_t ArgMaxCpuWithIsa(const float* x, int64_t n, CpuIsa isa) {
  // std::max_element: a NaN first entry is never replaced; later NaN entries are skipped, and
  // of equal maxima the first is kept.
  if (std::isnan(x[0])) return 0;
  const float m = RowMaxCpuWithIsa(x, n, isa);
#if defined(__x86_64__)
  if (IsaAtLeast(isa, CpuIsa::kAvx2)) return FindAvx2(x, n, m);
#endif
  return FindReference(x, 0, n, m);
}

double SumExpCpuWithIsa(const float* x, int64_t n, float shift, CpuIsa isa) {
#if defined(__x86_64__)
  if (IsaAtLeast(isa, CpuIsa::kAvx2)) return SumExpAvx2(x, n, shift);
#endif
  (void)isa;
  return SumExpReference(x, 0, n, shift);
}

float RowMaxCpu(const float* x, int64_t n) { return RowMaxCpuWithIsa(x, n, BestCpuIsa()); }

int64_t ArgMaxCpu(const float* x, int64_t n) { return ArgMaxCpuWithIsa(x, n, BestCpuIsa()); }

double SumExpCpu(const float* x, int64_t n, float shift) {
  return SumExpCpuWithIsa(x, n, shift, BestCpuIsa());
}

}  // namespace deepinfer::kernels
