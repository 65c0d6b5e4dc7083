#include "kernels/linear_cpu.h"

#include <algorithm>
#include <vector>

namespace deepinfer::kernels {
namespace {

// Widens one weight row to f32.
void WidenRow(const void* w, DType t, int64_t row, int64_t k, float* out) {
  switch (t) {
    case DType::kF32: {
      const float* src = static_cast<const float*>(w) + row * k;
      std::copy(src, src + k, out);
      return;
    }
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w) + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = Bf16ToF32(src[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w) + row * k;
      for (int64_t i = 0; i < k; ++i) out[i] = F16ToF32(src[i]);
      return;
    }
  }
}

inline float Dot(const float* __restrict a, const float* __restrict b, int64_t k) {
  // Eight partial sums let the compiler vectorise without -ffast-math.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0.0f;
  for (; i < k; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

}  // namespace

void LinearCpu(const LinearParams& p, ThreadPool* pool) {
  const int64_t ldy = p.ldy == 0 ? p.n : p.ldy;
  auto work = [&](int64_t n_begin, int64_t n_end) {
    std::vector<float> wrow(p.k);
    for (int64_t j = n_begin; j < n_end; ++j) {
      const float* w = nullptr;
      if (p.weight_dtype == DType::kF32) {
        w = static_cast<const float*>(p.weight) + j * p.k;
      } else {
        WidenRow(p.weight, p.weight_dtype, j, p.k, wrow.data());
        w = wrow.data();
      }
      const float b = p.bias != nullptr ? LoadAsF32(p.bias, p.weight_dtype, j) : 0.0f;
      for (int64_t i = 0; i < p.m; ++i) {
        // Bias joins the f32 accumulator before the single rounding, as a fused addmm does.
        p.y[i * ldy + j] = RoundTo(p.round_to, Dot(p.x + i * p.k, w, p.k) + b);
      }
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(p.n, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, p.k)), work);
  } else {
    work(0, p.n);
  }
}

}  // namespace deepinfer::kernels
