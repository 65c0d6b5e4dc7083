// AVX2/FMA building blocks shared by the optimised CPU kernels. Every function carries the
// target attribute itself, so this header may be included by translation units built without
// -mavx2; callers must only reach these functions after checking CpuSupports(CpuIsa::kAvx2).
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_KERNELS_SIMD_AVX2_H_
#define DEEPINFER_KERNELS_SIMD_AVX2_H_

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "kernels/dtype.h"

#define DI_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace deepinfer::kernels::avx2 {

// Sum of the 8 lanes in a fixed order (so results do not depend on the caller).
DI_AVX2 inline float Hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The 8 horizontal sums of v[0..7] as one vector: lane i = ((v_i0 + v_i1) + (v_i2 + v_i3)) +
// ((v_i4 + v_i5) + (v_i6 + v_i7)).
DI_AVX2 inline __m256 Hsum8x8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);  // v0..v3 low-half sums | v0..v3 high-half sums
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Round-to-nearest-even to bf16 and back, as F32ToBf16 (NaN stays NaN).
DI_AVX2 inline __m256 RoundBf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                       _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded), v, is_nan);
}

// Round to f16 and back (hardware round-to-nearest-even, like F32ToF16).
DI_AVX2 inline __m256 RoundF16(__m256 v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

DI_AVX2 inline __m256 RoundTo(DType t, __m256 v) {
  switch (t) {
    case DType::kF32:
      return v;
    case DType::kBF16:
      return RoundBf16(v);
    case DType::kF16:
      return RoundF16(v);
  }
  return v;
}

// 8 elements of type t starting at element i, widened to f32.
DI_AVX2 inline __m256 Load8(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return _mm256_loadu_ps(static_cast<const float*>(data) + i);
    case DType::kBF16: {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case DType::kF16: {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
      return _mm256_cvtph_ps(h);
    }
  }
  return _mm256_setzero_ps();
}

// Stores 8 f32 values as type t (rounding to nearest even) at element i.
DI_AVX2 inline void Store8(void* data, DType t, int64_t i, __m256 v) {
  switch (t) {
    case DType::kF32:
      _mm256_storeu_ps(static_cast<float*>(data) + i, v);
      return;
    case DType::kBF16: {
      const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(RoundBf16(v)), 16);
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i), packed);
      return;
    }
    case DType::kF16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i),
                       _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return;
  }
}

// exp(x) for f32 lanes: Cody-Waite range reduction and a degree-6 polynomial; relative error
// within ~2 ulp over the normal range, 0 below -87.3, +inf above 88.7, NaN propagates.
DI_AVX2 inline __m256 Exp(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.7228f);
  const __m256 lo = _mm256_set1_ps(-87.3365f);
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  // n = round(x / ln2); r = x - n ln2 (in two parts).
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // Scale by 2^n in two steps so that n = 128 (x near 88.7) does not overflow the exponent.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half1 = _mm256_srai_epi32(ni, 1);
  const __m256i half2 = _mm256_sub_epi32(ni, half1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half1, _mm256_set1_epi32(127)), 23));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half2, _mm256_set1_epi32(127)), 23));
  __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(), under);
  result = _mm256_blendv_ps(result, _mm256_set1_ps(__builtin_inff()), over);
  return _mm256_blendv_ps(result, x, is_nan);
}

}  // namespace deepinfer::kernels::avx2

#endif  // defined(__x86_64__)
#endif  // DEEPINFER_KERNELS_SIMD_AVX2_H_
