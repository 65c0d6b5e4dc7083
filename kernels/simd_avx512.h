// AVX-512 (with bf16 dot products) building blocks shared by the kernels of that path
// (kernels/linear_avx512.h, kernels/attention_avx512.h). Every function carries the target
// attribute itself; callers must only reach them after CpuSupports(CpuIsa::kAvx512Bf16).
//
// Thread-safety: pure functions.
#ifndef DEEPINFER_KERNELS_SIMD_AVX512_H_
#define DEEPINFER_KERNELS_SIMD_AVX512_H_

#if defined(__x86_64__)
#include <immintrin.h>

// AVX-512 with VDPBF16PS, and AVX2 for the helpers of simd_avx2.h.
#define DI_AVX512BF16 \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// For loops that must unroll for their accumulators to stay in registers.
#define DI_INLINE_AVX512BF16 DI_AVX512BF16 __attribute__((always_inline)) inline

namespace deepinfer::kernels::avx512 {

// The 16 lane sums of v[0..15] in one vector: lane 4 c + r holds the sum of v[4 r + c]. Every
// vector's lanes are summed by the same tree whatever its slot (IEEE addition commutes), so a sum
// depends only on its own accumulator, and zero vectors in unused slots change nothing.
DI_INLINE_AVX512BF16 __m512 Reduce16(const __m512* v) {
  __m512 s[8];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {
    // [v2p low 8 + high 8 | v2p+1 low 8 + high 8]
    s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xee));
  }
  __m512 u[4];
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    // Quarters hold v4t .. v4t+3, 4 partial sums each.
    u[t] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * t], s[2 * t + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * t], s[2 * t + 1], 0xdd));
  }
  __m512 w[2];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    // Quarter j: v8h+j (2 partial sums), v8h+4+j (2).
    w[h] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * h], u[2 * h + 1], 0x44),
                         _mm512_shuffle_ps(u[2 * h], u[2 * h + 1], 0xee));
  }
  // Quarter j: vj, v4+j, v8+j, v12+j.
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
}

}  // namespace deepinfer::kernels::avx512

#endif  // defined(__x86_64__)

#endif  // DEEPINFER_KERNELS_SIMD_AVX512_H_
