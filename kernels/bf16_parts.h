// What the bf16 dot-product paths of LinearCpu (AMX tiles: kernels/linear_amx.cc; AVX-512 BF16:
// kernels/linear_avx512.cc) share. Activations as bf16 operands: a bf16 model's activations are
// bf16 values and are multiplied as they are; any other f32 is split into three bf16 parts whose
// products, accumulated one after another, lose nothing of it. And the rounding of 16 outputs.
//
// Thread-safety: pure functions. AllBf16Values and RoundTo16 use AVX-512: call them only after
// CpuSupports(CpuIsa::kAvx512Bf16).
#ifndef DEEPINFER_KERNELS_BF16_PARTS_H_
#define DEEPINFER_KERNELS_BF16_PARTS_H_

#if defined(__x86_64__)
#include <immintrin.h>

#include <bit>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/simd_avx2.h"

namespace deepinfer::kernels::bf16_parts {

inline constexpr int kParts = 3;  // bf16 parts of an activation that is not a bf16 value

inline uint32_t Bits(float v) { return std::bit_cast<uint32_t>(v); }

// True when every one of x[0..n) is a bf16 value (its low 16 bits are zero).
__attribute__((target("avx512f"))) inline bool AllBf16Values(const float* x, int64_t n) {
  const __m512i low = _mm512_set1_epi32(0xffff);
  __mmask16 any = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) any |= _mm512_test_epi32_mask(_mm512_loadu_si512(x + i), low);
  for (; i < n; ++i) any |= (Bits(x[i]) & 0xffffu) != 0;
  return any == 0;
}

// v = parts[0] + parts[1] + parts[2], each a bf16 (truncations: every remainder is an exact f32,
// and the three parts hold all 24 significant bits). Infinities and NaNs keep only parts[0].
inline void Split(float v, uint16_t parts[kParts]) {
  const uint32_t b = Bits(v);
  parts[0] = static_cast<uint16_t>(b >> 16);
  if ((b & 0x7f800000u) == 0x7f800000u) {
    parts[1] = parts[2] = 0;
    return;
  }
  const float r1 = v - std::bit_cast<float>(b & 0xffff0000u);
  const uint32_t b1 = Bits(r1);
  parts[1] = static_cast<uint16_t>(b1 >> 16);
  const float r2 = r1 - std::bit_cast<float>(b1 & 0xffff0000u);
  parts[2] = static_cast<uint16_t>(Bits(r2) >> 16);
}

// v rounded to type t and back, as RoundTo (kernels/dtype.h): the AVX2 rounding on each half.
__attribute__((target("avx2,fma,f16c,avx512f,avx512dq"))) inline __m512 RoundTo16(DType t,
                                                                                  __m512 v) {
  if (t == DType::kF32) return v;
  const __m256 lo = avx2::RoundTo(t, _mm512_castps512_ps256(v));
  const __m256 hi = avx2::RoundTo(t, _mm512_extractf32x8_ps(v, 1));
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

}  // namespace deepinfer::kernels::bf16_parts

#endif  // defined(__x86_64__)

#endif  // DEEPINFER_KERNELS_BF16_PARTS_H_
