#include "kernels/linear_avx512.h"

// GCC 12 reports its own AVX-512 intrinsics' "__Y = __Y" (an undefined vector on purpose) as
// maybe uninitialized once they are inlined here: a false positive, this file's only warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/bf16_parts.h"
#include "kernels/dtype.h"
#include "kernels/linear_units.h"
#include "kernels/simd_avx2.h"
#include "kernels/simd_avx512.h"

namespace deepinfer::kernels {

#if defined(__x86_64__)
namespace {


constexpr int64_t kStep = 32;  // bf16 elements of k per 512-bit load
constexpr int kMaxRows = kAvx512RowsPerPass;
constexpr int kCols = 4;       // weight rows (outputs) per tile
// Weight rows visited in panels that stay in L2 while every group of activation rows passes.
constexpr int64_t kPanel = 64;
using bf16_parts::Bits;
using bf16_parts::kParts;
using bf16_parts::RoundTo16;
using bf16_parts::Split;

// Activations as bf16: row i, part q at data + (i * parts + q) * k_pad, zero past k.
struct PackedBf16 {
  const uint16_t* data = nullptr;
  int parts = 1;
  int64_t k_pad = 0;  // k rounded up to kStep
  const uint16_t* Row(int64_t i, int part) const { return data + (i * parts + part) * k_pad; }
};

DI_AVX512BF16 PackedBf16 PackX(const LinearParams& p, std::vector<uint16_t>* storage) {
  PackedBf16 px;
  px.parts = bf16_parts::AllBf16Values(p.x, p.m * p.k) ? 1 : kParts;
  px.k_pad = (p.k + kStep - 1) / kStep * kStep;
  storage->assign(p.m * px.parts * px.k_pad, 0);
  px.data = storage->data();
  for (int64_t i = 0; i < p.m; ++i) {
    const float* row = p.x + i * p.k;
    if (px.parts == 1) {
      // The top halves of the f32s: 16 at a time.
      uint16_t* out = storage->data() + i * px.k_pad;
      int64_t l = 0;
      for (; l + 16 <= p.k; l += 16) {
        const __m512i bits = _mm512_srli_epi32(_mm512_loadu_si512(row + l), 16);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + l), _mm512_cvtepi32_epi16(bits));
      }
      for (; l < p.k; ++l) out[l] = static_cast<uint16_t>(Bits(row[l]) >> 16);
      continue;
    }
    for (int64_t l = 0; l < p.k; ++l) {
      uint16_t parts[kParts];
      Split(row[l], parts);
      for (int q = 0; q < kParts; ++q) storage->data()[(i * kParts + q) * px.k_pad + l] = parts[q];
    }
  }
  return px;
}

// One k step of a tile: acc[4 r + c] += activation row r's parts . weights wv[c], parts in order.
template <int MR, int PARTS>
DI_INLINE_AVX512BF16 void Step(__m512* acc, int64_t k_pad, const uint16_t* const* x_rows,
                               int64_t kk, const __m512i* wv) {
#pragma GCC unroll 3
  for (int q = 0; q < PARTS; ++q) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x_rows[r] + q * k_pad + kk);
#pragma GCC unroll 4
      for (int c = 0; c < kCols; ++c) {
        acc[r * kCols + c] = _mm512_dpbf16_ps(acc[r * kCols + c], xv, (__m512bh)wv[c]);
      }
    }
  }
}

// Lane 4 r + c of the result = activation row r . weight row w_rows[c], for MR activation rows
// (lanes of rows >= MR are zero). With kPrefetch, the next tile's weights (the kCols rows after
// w_rows[0], contiguous) are prefetched as the loop goes: a small m is bound by these reads.
template <int MR, int PARTS, bool kPrefetch>
DI_INLINE_AVX512BF16 __m512 Tile(const PackedBf16& px, int64_t k, const uint16_t* const* x_rows,
                                 const uint16_t* w, const int64_t* w_rows) {
  __m512 acc[kMaxRows * kCols];
#pragma GCC unroll 16
  for (auto& a : acc) a = _mm512_setzero_ps();
  const uint16_t* wr[kCols];
#pragma GCC unroll 4
  for (int c = 0; c < kCols; ++c) wr[c] = w + w_rows[c] * k;
  const char* next = reinterpret_cast<const char*>(w + (w_rows[0] + kCols) * k);
  const int64_t k_full = k / kStep * kStep;
  for (int64_t kk = 0; kk < k_full; kk += kStep) {
    if constexpr (kPrefetch) {
      // kCols rows x 32 elements of 2 bytes per step: kCols lines of 64 bytes.
#pragma GCC unroll 4
      for (int l = 0; l < kCols; ++l) _mm_prefetch(next + kk * 2 * kCols + l * 64, _MM_HINT_T0);
    }
    __m512i wv[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) wv[c] = _mm512_loadu_si512(wr[c] + kk);
    Step<MR, PARTS>(acc, px.k_pad, x_rows, kk, wv);
  }
  if (k_full < k) {
    // The last k: masked loads read nothing past the row (the activations are zero-padded).
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (k - k_full)) - 1);
    __m512i wv[kCols];
#pragma GCC unroll 4
    for (int c = 0; c < kCols; ++c) wv[c] = _mm512_maskz_loadu_epi16(mask, wr[c] + k_full);
    Step<MR, PARTS>(acc, px.k_pad, x_rows, k_full, wv);
  }
  // Lane 4 c + r of the reduction holds (r, c); reorder to 4 r + c.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, avx512::Reduce16(acc));
}

template <int PARTS>
DI_AVX512BF16 void RunRows(const LinearParams& p, const PackedBf16& px, int64_t j_begin,
                           int64_t j_end) {
  const uint16_t* w = static_cast<const uint16_t*>(p.weight);
  const int64_t ldy = p.ldy == 0 ? p.n : p.ldy;
  // Activation rows in blocks of about 96 KiB that stay in L2 while this call's weight rows pass.
  const int64_t m_block =
      std::max<int64_t>(kMaxRows, (96 * 1024 / (2 * px.k_pad * PARTS)) / kMaxRows * kMaxRows);
  alignas(64) float out[kMaxRows * kCols];
  for (int64_t ib = 0; ib < p.m; ib += m_block) {
    const int64_t ie = std::min(p.m, ib + m_block);
    for (int64_t jb = j_begin; jb < j_end; jb += kPanel) {
      const int64_t je = std::min(j_end, jb + kPanel);
      for (int64_t i = ib; i < ie; i += kMaxRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kMaxRows, ie - i));
        const uint16_t* x_rows[kMaxRows];
        for (int r = 0; r < kMaxRows; ++r) x_rows[r] = px.Row(std::min(i + r, p.m - 1), 0);
        const bool first = i == 0;
        for (int64_t j = jb; j < je; j += kCols) {
          // Past the end, repeat the last row and drop its results.
          int64_t w_rows[kCols];
          for (int c = 0; c < kCols; ++c) w_rows[c] = std::min(j + c, je - 1);
          __m512 sums;
#define DI_TILE(MR)                                                \
  sums = first ? Tile<MR, PARTS, true>(px, p.k, x_rows, w, w_rows) \
               : Tile<MR, PARTS, false>(px, p.k, x_rows, w, w_rows)
          switch (rows) {
            case 1:
              DI_TILE(1);
              break;
            case 2:
              DI_TILE(2);
              break;
            case 3:
              DI_TILE(3);
              break;
            default:
              DI_TILE(4);
              break;
          }
#undef DI_TILE
          const int cols = static_cast<int>(std::min<int64_t>(kCols, je - j));
          if (p.bias != nullptr) {
            const uint16_t* b = static_cast<const uint16_t*>(p.bias);
            const __m128 b4 = _mm_setr_ps(Bf16ToF32(b[w_rows[0]]), Bf16ToF32(b[w_rows[1]]),
                                          Bf16ToF32(b[w_rows[2]]), Bf16ToF32(b[w_rows[3]]));
            // As the other paths: the bias joins the f32 sum before the one rounding.
            sums = _mm512_add_ps(sums, _mm512_broadcast_f32x4(b4));
          }
          _mm512_store_ps(out, RoundTo16(p.round_to, sums));
          for (int r = 0; r < rows; ++r) {
            std::memcpy(p.y + (i + r) * ldy + j, out + r * kCols, cols * sizeof(float));
          }
        }
      }
    }
  }
}

DI_AVX512BF16 void RunUnits(const LinearParams* params, const PackedBf16* packed,
                            const LinearUnits& units, int64_t u_begin, int64_t u_end) {
  units.ForRows(u_begin, u_end, [&](int i, int64_t row_begin, int64_t row_end) {
    if (packed[i].parts == 1) {
      RunRows<1>(params[i], packed[i], row_begin, row_end);
    } else {
      RunRows<kParts>(params[i], packed[i], row_begin, row_end);
    }
  });
}

}  // namespace

void LinearMultiAvx512Bf16(const LinearParams* params, int count, ThreadPool* pool) {
  // Per-thread scratch for packed activations, reused across calls.
  thread_local std::vector<std::vector<uint16_t>> storage;
  if (static_cast<int>(storage.size()) < count) storage.resize(count);
  RunLinearUnits<PackedBf16>(
      params, count, pool, [&](int i) { return PackX(params[i], &storage[i]); },
      [&](const PackedBf16* packed, const LinearUnits& units, int64_t u_begin, int64_t u_end) {
        RunUnits(params, packed, units, u_begin, u_end);
      });
}

#else

void LinearMultiAvx512Bf16(const LinearParams* params, int count, ThreadPool* pool) {
  // Never reached: CpuSupports(CpuIsa::kAvx512Bf16) is false off x86-64.
  (void)params;
  (void)count;
  (void)pool;
}

#endif  // defined(__x86_64__)

}  // namespace deepinfer::kernels
