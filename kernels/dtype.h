// Element types of tensors and the scalar conversions the CPU kernels use. Plain C++ (no Abseil)
// so that nvcc-compiled files can include it too.
#ifndef DEEPINFER_KERNELS_DTYPE_H_
#define DEEPINFER_KERNELS_DTYPE_H_

#include <cstdint>
#include <cstring>

namespace deepinfer::kernels {

enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline constexpr int DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }
inline constexpr const char* DTypeName(DType t) {
  return t == DType::kF32 ? "f32" : (t == DType::kBF16 ? "bf16" : "f16");
}

inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays a (quiet) NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // overflow (after rounding) -> inf
  if (abs < 0x38800000u) {                       // subnormal or zero in f16
    if (abs < 0x33000000u) return sign;          // rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 13 - 1 + 1
    const uint32_t half = 1u << (shift - 1);
    uint32_t value = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    if (rest > half || (rest == half && (value & 1u))) ++value;
    return sign | static_cast<uint16_t>(value);
  }
  uint32_t value = abs - ((127 - 15) << 23);
  const uint32_t rest = value & 0x1fffu;
  value >>= 13;
  if (rest > 0x1000u || (rest == 0x1000u && (value & 1u))) ++value;
  return sign | static_cast<uint16_t>(value);
}

// Loads element i of a buffer of type t as f32.
inline float LoadAsF32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

// Rounds v to type t and stores it as element i.
inline void StoreFromF32(void* data, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(data)[i] = F32ToBf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(data)[i] = F32ToF16(v);
      return;
  }
}

// v rounded to type t and back (the value a tensor of type t would hold).
inline float RoundTo(DType t, float v) {
  switch (t) {
    case DType::kF32:
      return v;
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(v));
    case DType::kF16:
      return F16ToF32(F32ToF16(v));
  }
  return v;
}

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_DTYPE_H_
