// Activations as bf16 operands, for the bf16 dot-product paths of LinearCpu (AMX tiles:
// kernels/linear_amx.cc; AVX-512 BF16: kernels/linear_avx512.cc). A bf16 model's activations are
// bf16 values and are multiplied as they are; any other f32 is split into three bf16 parts whose
// products, accumulated one after another, lose nothing of it.
//
// Thread-safety: pure functions. AllBf16Values uses AVX-512F: call it only after
// CpuSupports(CpuIsa::kAvx512Bf16).
#ifndef DEEPINFER_KERNELS_BF16_PARTS_H_
#define DEEPINFER_KERNELS_BF16_PARTS_H_

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace deepinfer::kernels::bf16_parts {

inline constexpr int kParts = 3;  // bf16 parts of an activation that is not a bf16 value

inline uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

inline float FromBits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

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
  const float r1 = v - FromBits(b & 0xffff0000u);
  const uint32_t b1 = Bits(r1);
  parts[1] = static_cast<uint16_t>(b1 >> 16);
  const float r2 = r1 - FromBits(b1 & 0xffff0000u);
  parts[2] = static_cast<uint16_t>(Bits(r2) >> 16);
}

}  // namespace deepinfer::kernels::bf16_parts

#endif  // defined(__x86_64__)

#endif  // DEEPINFER_KERNELS_BF16_PARTS_H_
