#include "kernels/linear_cpu.h"

#include <algorithm>
#include <vector>

#include "kernels/linear_amx.h"
#include "kernels/linear_avx512.h"
#include "kernels/linear_units.h"
#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// Reference path.

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

// ---------------------------------------------------------------------------------------------
// AVX2 path.
#if defined(__x86_64__)

// x rows as the kernel reads them. For bf16 weights every full block of 16 is stored as its 8
// even-indexed then its 8 odd-indexed elements: a bf16 weight block then widens with one shift
// (even elements) and one mask (odd elements) instead of two zero-extensions and shifts. The
// tail beyond the last full block keeps its natural order.
struct PackedX {
  const float* data = nullptr;
  int64_t k16 = 0;  // elements covered by full blocks of 16
};

// Rows [begin, end) of x, deinterleaved as PackedX describes.
DI_AVX2 void PackRows(const float* x, int64_t k, int64_t k16, int64_t begin, int64_t end,
                      float* out) {
  for (int64_t i = begin; i < end; ++i) {
    const float* src = x + i * k;
    float* dst = out + i * k;
    for (int64_t b = 0; b < k16; b += 16) {
      const __m256 a = _mm256_loadu_ps(src + b);
      const __m256 c = _mm256_loadu_ps(src + b + 8);
      // [a0 a2 c0 c2 | a4 a6 c4 c6] -> [a0 a2 a4 a6 c0 c2 c4 c6]; likewise the odd elements.
      const __m256 even = _mm256_shuffle_ps(a, c, 0x88);
      const __m256 odd = _mm256_shuffle_ps(a, c, 0xdd);
      _mm256_storeu_ps(dst + b,
                       _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xd8)));
      _mm256_storeu_ps(dst + b + 8,
                       _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xd8)));
    }
    std::copy(src + k16, src + k, dst + k16);
  }
}

// Packs x for p (in parallel for large m); projections sharing an x and k share the packing.
PackedX PackX(const LinearParams& p, std::vector<float>* storage, ThreadPool* pool) {
  PackedX px;
  px.k16 = p.k / 16 * 16;
  if (p.weight_dtype != DType::kBF16) {
    px.data = p.x;
    return px;
  }
  storage->resize(p.m * p.k);
  float* out = storage->data();
  auto work = [&](int64_t begin, int64_t end) { PackRows(p.x, p.k, px.k16, begin, end, out); };
  if (pool != nullptr) {
    pool->ParallelFor(p.m, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, p.k)), work);
  } else {
    work(0, p.m);
  }
  px.data = out;
  return px;
}

// 16 weights at w (in elements of T) widened to f32 in the order PackX stores x.
template <DType T>
DI_AVX2 inline void LoadW16(const void* w, int64_t i, __m256* lo, __m256* hi) {
  if constexpr (T == DType::kBF16) {
    const __m256i a =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + i));
    *lo = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
    *hi =
        _mm256_castsi256_ps(_mm256_and_si256(a, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  } else if constexpr (T == DType::kF16) {
    const uint16_t* h = static_cast<const uint16_t*>(w) + i;
    *lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    *hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 8)));
  } else {
    const float* f = static_cast<const float*>(w) + i;
    *lo = _mm256_loadu_ps(f);
    *hi = _mm256_loadu_ps(f + 8);
  }
}

// Lane r * 4 + c of the result = x row r · W row c for MR (1 or 2) x rows and 4 W rows.
// With kPrefetch, the 4 rows after w_rows[0] are prefetched as the loop goes: on the first pass
// over a panel the weights come from memory, and a GEMV is bound by how many lines are in flight.
template <DType T, int MR, bool kPrefetch>
DI_AVX2 __m256 Tile(const PackedX& px, int64_t k, const float* const* x_rows, const void* w,
                    const int64_t* w_rows) {
  __m256 acc[MR][4];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const int64_t w0 = w_rows[0] * k, w1 = w_rows[1] * k, w2 = w_rows[2] * k, w3 = w_rows[3] * k;
  // The next tile's rows are contiguous after this tile's: 4 * k elements from w_rows[0].
  const char* next = static_cast<const char*>(w) + (w0 + 4 * k) * DTypeSize(T);
  for (int64_t kk = 0; kk < px.k16; kk += 16) {
    if constexpr (kPrefetch) {
      // 4 rows x 16 elements per step: DTypeSize(T) * 64 bytes, in lines of 64.
      for (int l = 0; l < DTypeSize(T); ++l) {
        _mm_prefetch(next + (kk * 4 + l * 32) * DTypeSize(T), _MM_HINT_T0);
      }
    }
    __m256 xl[MR], xh[MR];
    for (int r = 0; r < MR; ++r) {
      xl[r] = _mm256_loadu_ps(x_rows[r] + kk);
      xh[r] = _mm256_loadu_ps(x_rows[r] + kk + 8);
    }
    __m256 lo, hi;
#define DI_TILE_COLUMN(c, off)                         \
  LoadW16<T>(w, off + kk, &lo, &hi);                   \
  for (int r = 0; r < MR; ++r) {                       \
    acc[r][c] = _mm256_fmadd_ps(xl[r], lo, acc[r][c]); \
    acc[r][c] = _mm256_fmadd_ps(xh[r], hi, acc[r][c]); \
  }
    DI_TILE_COLUMN(0, w0)
    DI_TILE_COLUMN(1, w1)
    DI_TILE_COLUMN(2, w2)
    DI_TILE_COLUMN(3, w3)
#undef DI_TILE_COLUMN
  }
  // All 8 sums in one reduction tree (MR = 1 pads with zeros, which leaves sums unchanged), so
  // every output element is summed the same way whatever MR.
  __m256 all[8];
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 4; ++c) all[r * 4 + c] = r < MR ? acc[r][c] : _mm256_setzero_ps();
  }
  __m256 sums = avx2::Hsum8x8(all);
  if (px.k16 < k) {
    const int64_t offs[4] = {w0, w1, w2, w3};
    alignas(32) float tails[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < 4; ++c) {
        float tail = 0.0f;
        for (int64_t kk = px.k16; kk < k; ++kk)
          tail += x_rows[r][kk] * LoadAsF32(w, T, offs[c] + kk);
        tails[r * 4 + c] = tail;
      }
    }
    sums = _mm256_add_ps(sums, _mm256_load_ps(tails));
  }
  return sums;
}

// Rows [j_begin, j_end) of the output for every x row.
template <DType T>
DI_AVX2 void RunRows(const LinearParams& p, const PackedX& px, int64_t j_begin, int64_t j_end) {
  const int64_t ldy = p.ldy == 0 ? p.n : p.ldy;
  // W rows are visited in panels that stay in L2 while every x row pair streams past them.
  constexpr int64_t kPanel = 64;
  // x rows are visited in blocks of about 96 KiB (an even number of rows) that stay in L2 while
  // this call's W rows (a ParallelFor chunk, usually well under L2) pass by: neither operand
  // streams from memory more than once per block.
  const int64_t m_block = std::max<int64_t>(2, (96 * 1024 / (4 * p.k)) / 2 * 2);
  for (int64_t ib = 0; ib < p.m; ib += m_block) {
    const int64_t ie = std::min(p.m, ib + m_block);
    for (int64_t jb = j_begin; jb < j_end; jb += kPanel) {
      const int64_t je = std::min(j_end, jb + kPanel);
      for (int64_t i = ib; i < ie; i += 2) {
        const int rows = ie - i >= 2 ? 2 : 1;
        const float* x_rows[2] = {px.data + i * p.k, px.data + std::min(i + 1, p.m - 1) * p.k};
        for (int64_t j = jb; j < je; j += 4) {
          // Past the end, repeat the last row and drop its results.
          const int64_t w_rows[4] = {j, std::min(j + 1, je - 1), std::min(j + 2, je - 1),
                                     std::min(j + 3, je - 1)};
          __m256 sums;
          if (i == 0) {
            sums = rows == 2 ? Tile<T, 2, true>(px, p.k, x_rows, p.weight, w_rows)
                             : Tile<T, 1, true>(px, p.k, x_rows, p.weight, w_rows);
          } else {
            sums = rows == 2 ? Tile<T, 2, false>(px, p.k, x_rows, p.weight, w_rows)
                             : Tile<T, 1, false>(px, p.k, x_rows, p.weight, w_rows);
          }
          const int cols = static_cast<int>(std::min<int64_t>(4, je - j));
          if (p.bias != nullptr) {
            const __m128 b =
                _mm_setr_ps(LoadAsF32(p.bias, T, w_rows[0]), LoadAsF32(p.bias, T, w_rows[1]),
                            LoadAsF32(p.bias, T, w_rows[2]), LoadAsF32(p.bias, T, w_rows[3]));
            sums = _mm256_add_ps(sums, _mm256_set_m128(b, b));
          }
          sums = avx2::RoundTo(p.round_to, sums);
          float* y0 = p.y + i * ldy + j;
          if (cols == 4) {
            _mm_storeu_ps(y0, _mm256_castps256_ps128(sums));
            if (rows == 2) _mm_storeu_ps(y0 + ldy, _mm256_extractf128_ps(sums, 1));
          } else {
            alignas(32) float out[8];
            _mm256_store_ps(out, sums);
            for (int r = 0; r < rows; ++r) {
              for (int c = 0; c < cols; ++c) y0[r * ldy + c] = out[r * 4 + c];
            }
          }
        }
      }
    }
  }
}

void RunRowsAvx2(const LinearParams& p, const PackedX& px, int64_t j_begin, int64_t j_end) {
  switch (p.weight_dtype) {
    case DType::kF32:
      return RunRows<DType::kF32>(p, px, j_begin, j_end);
    case DType::kBF16:
      return RunRows<DType::kBF16>(p, px, j_begin, j_end);
    case DType::kF16:
      return RunRows<DType::kF16>(p, px, j_begin, j_end);
  }
}

void LinearMultiAvx2(const LinearParams* params, int count, ThreadPool* pool) {
  // Per-thread scratch for packed x, reused across calls.
  thread_local std::vector<std::vector<float>> storage;
  if (static_cast<int>(storage.size()) < count) storage.resize(count);
  RunLinearUnits<PackedX>(
      params, count, pool, [&](int i) { return PackX(params[i], &storage[i], pool); },
      [&](const PackedX* packed, const LinearUnits& units, int64_t u_begin, int64_t u_end) {
        units.ForRows(u_begin, u_end, [&](int i, int64_t row_begin, int64_t row_end) {
          RunRowsAvx2(params[i], packed[i], row_begin, row_end);
        });
      });
}

#endif  // defined(__x86_64__)

}  // namespace

void LinearCpuReference(const LinearParams& p, ThreadPool* pool) {
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

void LinearCpuWithIsa(const LinearParams& p, ThreadPool* pool, CpuIsa isa) {
  LinearMultiWithIsa(&p, 1, pool, isa);
}

void LinearCpu(const LinearParams& p, ThreadPool* pool) { LinearCpuWithIsa(p, pool, BestCpuIsa()); }

void LinearCpuMulti(const LinearParams* params, int count, ThreadPool* pool) {
  LinearMultiWithIsa(params, count, pool, BestCpuIsa());
}

int LinearRowsPerPass(DType weight_dtype, CpuIsa isa) {
#if defined(__x86_64__)
  if (weight_dtype == DType::kBF16 && isa == CpuIsa::kAmx) return kAmxRowsPerPass;
  if (weight_dtype == DType::kBF16 && isa == CpuIsa::kAvx512Bf16) return kAvx512RowsPerPass;
  if (IsaAtLeast(isa, CpuIsa::kAvx2)) return 2;  // RunRows: pairs of rows
#endif
  return 1;
}

void LinearMultiWithIsa(const LinearParams* params, int count, ThreadPool* pool, CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAmx || isa == CpuIsa::kAvx512Bf16) {
    // bf16 weights on tiles (or bf16 dot products), the others on the AVX2 path; each projection
    // as a single call would. A bf16 model's projections all take the bf16 path: no split (and no
    // copies) on that path.
    auto bf16 = isa == CpuIsa::kAmx ? LinearMultiAmx : LinearMultiAvx512Bf16;
    bool all_bf16 = true;
    for (int i = 0; i < count; ++i) all_bf16 = all_bf16 && params[i].weight_dtype == DType::kBF16;
    if (all_bf16) {
      bf16(params, count, pool);
      return;
    }
    std::vector<LinearParams> tiles, vectors;
    for (int i = 0; i < count; ++i) {
      (params[i].weight_dtype == DType::kBF16 ? tiles : vectors).push_back(params[i]);
    }
    if (!tiles.empty()) bf16(tiles.data(), static_cast<int>(tiles.size()), pool);
    if (!vectors.empty()) LinearMultiAvx2(vectors.data(), static_cast<int>(vectors.size()), pool);
    return;
  }
  if (isa == CpuIsa::kAvx2) {
    LinearMultiAvx2(params, count, pool);
    return;
  }
#endif
  for (int i = 0; i < count; ++i) LinearCpuReference(params[i], pool);
}

}  // namespace deepinfer::kernels
