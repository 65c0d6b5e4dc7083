#include "kernels/linear_amx.h"

// GCC 12 reports its own AVX-512 intrinsics' "__Y = __Y" (an undefined vector on purpose) as
// maybe uninitialized once they are inlined here: a false positive, this file's only warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/bf16_parts.h"
#include "kernels/dtype.h"
#include "kernels/linear_units.h"
#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {

#if defined(__x86_64__)
namespace {

constexpr int64_t kTileRows = kAmxRowsPerPass;  // weight rows (outputs), activation rows
constexpr int64_t kTileK = 32;     // k of one tile product: 16 pairs of bf16
constexpr int64_t kTileElems = amx::kOperandElems;  // kTileRows x kTileK
constexpr int kPanelTiles = 4;  // accumulators (tiles 0-3): a panel of 64 outputs per row block
// Weights are prefetched this many tiles ahead.
constexpr int64_t kAheadTiles = 1;
using bf16_parts::Bits;
using bf16_parts::kParts;
using bf16_parts::RoundTo16;
using bf16_parts::Split;

// Activations as the tiles' second operand: for activation block mb (16 rows), part p and k block
// kb, a 1 KiB tile whose row q holds, for each of the 16 activation rows r, the pair
// (x[r][32 kb + 2q], x[r][32 kb + 2q + 1]) as bf16. Rows past m and k past k are zero.
struct PackedAmx {
  const uint16_t* data = nullptr;
  int parts = 1;
  int64_t m_blocks = 0;
  int64_t k_blocks = 0;
  const uint16_t* Tile(int64_t mb, int part, int64_t kb) const {
    return data + ((mb * parts + part) * k_blocks + kb) * kTileElems;
  }
};

PackedAmx PackX(const LinearParams& p, std::vector<uint16_t>* storage) {
  PackedAmx px;
  px.parts = bf16_parts::AllBf16Values(p.x, p.m * p.k) ? 1 : kParts;
  px.m_blocks = (p.m + kTileRows - 1) / kTileRows;
  px.k_blocks = (p.k + kTileK - 1) / kTileK;
  storage->assign(px.m_blocks * px.parts * px.k_blocks * kTileElems, 0);
  uint16_t* out = storage->data();
  const int64_t k_pairs = p.k / 2;
  for (int64_t i = 0; i < p.m; ++i) {
    const int64_t mb = i / kTileRows, r = i % kTileRows;
    const float* row = p.x + i * p.k;
    if (px.parts == 1) {
      // A pair of bf16 values is the top halves of two f32s (bits 16-31 and 48-63 of the pair as
      // a 64-bit word). It lands in 32-bit column r of tile row (pair % 16).
      uint32_t* tiles = reinterpret_cast<uint32_t*>(out + mb * px.k_blocks * kTileElems);
      for (int64_t q = 0; q < k_pairs; ++q) {
        uint64_t pair;
        std::memcpy(&pair, row + 2 * q, 8);
        tiles[(q / 16) * (kTileElems / 2) + (q % 16) * kTileRows + r] =
            static_cast<uint32_t>((pair >> 16) & 0xffffu) |
            static_cast<uint32_t>((pair >> 32) & 0xffff0000u);
      }
      if (p.k % 2 != 0) {
        const int64_t l = p.k - 1;
        out[(mb * px.k_blocks + l / kTileK) * kTileElems + ((l % kTileK) / 2) * kTileK + 2 * r] =
            static_cast<uint16_t>(Bits(row[l]) >> 16);
      }
      continue;
    }
    for (int64_t l = 0; l < p.k; ++l) {
      const int64_t kb = l / kTileK, kk = l % kTileK;
      // Element (row kk / 2, column 2 r + kk % 2) of the tile.
      const int64_t at = (kk / 2) * kTileK + 2 * r + (kk % 2);
      uint16_t parts[kParts];
      Split(row[l], parts);
      for (int q = 0; q < kParts; ++q) {
        out[((mb * kParts + q) * px.k_blocks + kb) * kTileElems + at] = parts[q];
      }
    }
  }
  px.data = out;
  return px;
}

// Tile numbers are immediates (the intrinsics paste them into the instruction): accumulator t
// (tiles 0-3) += A tile (5 for even t, 6 for odd t, so consecutive loads do not wait on each
// other's products) . activation tile 4.
DI_AMX inline void MultiplyInto(int t, const uint16_t* a, int64_t stride_bytes) {
  switch (t) {
    case 0:
      _tile_loadd(5, a, stride_bytes);
      _tile_dpbf16ps(0, 5, 4);
      break;
    case 1:
      _tile_loadd(6, a, stride_bytes);
      _tile_dpbf16ps(1, 6, 4);
      break;
    case 2:
      _tile_loadd(5, a, stride_bytes);
      _tile_dpbf16ps(2, 5, 4);
      break;
    default:
      _tile_loadd(6, a, stride_bytes);
      _tile_dpbf16ps(3, 6, 4);
      break;
  }
}

DI_AMX inline void StoreAccumulator(int t, float* out) {
  switch (t) {
    case 0:
      _tile_stored(0, out, kTileRows * 4);
      break;
    case 1:
      _tile_stored(1, out, kTileRows * 4);
      break;
    case 2:
      _tile_stored(2, out, kTileRows * 4);
      break;
    default:
      _tile_stored(3, out, kTileRows * 4);
      break;
  }
}

// Output rows [j_begin, j_end) for every activation row.
DI_AMX void RunRows(const LinearParams& p, const PackedAmx& px, int64_t j_begin, int64_t j_end) {
  const uint16_t* w = static_cast<const uint16_t*>(p.weight);
  const int64_t ldy = p.ldy == 0 ? p.n : p.ldy;
  const int64_t k_full = p.k / kTileK;  // k blocks whose weights are read in place
  const char* w_end = reinterpret_cast<const char*>(w + p.n * p.k);
  alignas(64) uint16_t a_scratch[kTileElems];
  alignas(64) float c_out[kTileRows * kTileRows];
  for (int64_t jb = j_begin; jb < j_end; jb += kPanelTiles * kTileRows) {
    const int tiles =
        static_cast<int>(std::min<int64_t>(kPanelTiles, (j_end - jb + kTileRows - 1) / kTileRows));
    for (int64_t mb = 0; mb < px.m_blocks; ++mb) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int t = 0; t < tiles; ++t) {
        const int64_t row0 = jb + t * kTileRows;
        // The next tile's weights (its 16 rows are contiguous), a 1/k_blocks share of them per k
        // block, so they arrive while this tile is multiplied: a small m is bound by these reads.
        const char* next =
            reinterpret_cast<const char*>(w + (row0 + kAheadTiles * kTileRows) * p.k);
        const int64_t share = (kTileRows * p.k * 2 + px.k_blocks - 1) / px.k_blocks;
        for (int64_t kb = 0; kb < px.k_blocks; ++kb) {
          if (mb == 0) {
            for (int64_t off = kb * share; off < (kb + 1) * share; off += 64) {
              if (next + off >= w_end) break;
              _mm_prefetch(next + off, _MM_HINT_T0);
            }
          }
          const bool in_place = row0 + kTileRows <= p.n && kb < k_full;
          const uint16_t* a = w + row0 * p.k + kb * kTileK;
          if (!in_place) {
            // The matrix's last rows or last k: zero-padded so nothing past the weights is read.
            std::memset(a_scratch, 0, sizeof(a_scratch));
            const int64_t rows = std::min<int64_t>(kTileRows, p.n - row0);
            const int64_t cols = std::min<int64_t>(kTileK, p.k - kb * kTileK);
            for (int64_t r = 0; r < rows; ++r) {
              std::memcpy(a_scratch + r * kTileK, w + (row0 + r) * p.k + kb * kTileK, cols * 2);
            }
            a = a_scratch;
          }
          for (int part = 0; part < px.parts; ++part) {
            _tile_loadd(4, px.Tile(mb, part, kb), kTileK * 2);
            MultiplyInto(t, a, in_place ? p.k * 2 : kTileK * 2);
          }
        }
      }
      const int64_t act_rows = std::min<int64_t>(kTileRows, p.m - mb * kTileRows);
      for (int t = 0; t < tiles; ++t) {
        StoreAccumulator(t, c_out);
        const int64_t row0 = jb + t * kTileRows;
        const int64_t outs = std::min<int64_t>(kTileRows, j_end - row0);
        const __mmask16 mask = static_cast<__mmask16>((1u << outs) - 1);
        __m512 bias = _mm512_setzero_ps();
        if (p.bias != nullptr) {
          const __m256i b =
              _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(p.bias) + row0);
          bias = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
        }
        // Column r of the accumulator (weight rows are its rows) is activation row r's outputs.
        const __m512i column = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(kTileRows));
        float* y = p.y + (mb * kTileRows) * ldy + row0;
        for (int64_t r = 0; r < act_rows; ++r) {
          __m512 v = _mm512_i32gather_ps(column, c_out + r, 4);
          // As the other paths: the bias joins the f32 sum before the one rounding.
          if (p.bias != nullptr) v = _mm512_add_ps(v, bias);
          _mm512_mask_storeu_ps(y + r * ldy, mask, RoundTo16(p.round_to, v));
        }
      }
    }
  }
}

// Units [u_begin, u_end) of the projections, with this thread's tiles configured meanwhile.
DI_AMX void RunUnits(const LinearParams* params, const PackedAmx* packed, const LinearUnits& units,
                     int64_t u_begin, int64_t u_end) {
  const amx::ScopedTiles tiles;
  units.ForRows(u_begin, u_end, [&](int i, int64_t row_begin, int64_t row_end) {
    RunRows(params[i], packed[i], row_begin, row_end);
  });
}

}  // namespace

void LinearMultiAmx(const LinearParams* params, int count, ThreadPool* pool) {
  // Per-thread scratch for packed activations, reused across calls.
  thread_local std::vector<std::vector<uint16_t>> storage;
  if (static_cast<int>(storage.size()) < count) storage.resize(count);
  RunLinearUnits<PackedAmx>(
      params, count, pool, [&](int i) { return PackX(params[i], &storage[i]); },
      [&](const PackedAmx* packed, const LinearUnits& units, int64_t u_begin, int64_t u_end) {
        RunUnits(params, packed, units, u_begin, u_end);
      });
}

#else

void LinearMultiAmx(const LinearParams* params, int count, ThreadPool* pool) {
  // Never reached: CpuSupports(CpuIsa::kAmx) is false off x86-64.
  (void)params;
  (void)count;
  (void)pool;
}

#endif  // defined(__x86_64__)

}  // namespace deepinfer::kernels
