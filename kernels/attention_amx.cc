#include "kernels/attention_amx.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/bf16_parts.h"
#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics (shifts, min/max, conversions) pass _mm512_undefined_*() through
// masked built-ins, which -Wmaybe-uninitialized reports wherever they are inlined: a false
// positive of that GCC release.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {

constexpr int kRows = 16;       // query rows (token, query head) of a tile
constexpr int kMaxTiles = 4;    // row tiles of a task: they share its reads of K and V
constexpr int kGroupKeys = 16;  // keys of one score tile (one block holds whole groups)
constexpr int kKeys = 32;       // keys of one P . V tile product (16 pairs)
constexpr int kDims = 32;       // head dims of one score tile product (16 pairs)
constexpr int kTileElems = amx::kOperandElems;

int Group(const PagedAttentionParams& p) { return p.num_heads / p.num_kv_heads; }

int64_t TokensPerTile(const PagedAttentionParams& p) {
  return std::max<int64_t>(1, kRows / Group(p));
}

int64_t TokensPerTask(const PagedAttentionParams& p) { return TokensPerTile(p) * kMaxTiles; }

uint16_t Top(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return static_cast<uint16_t>(b >> 16);
}

// Accumulator c (0-3) += P tile (4) . V tile (5 for even c, 6 for odd c).
DI_AMX inline void AccumulateOut(int c, const uint16_t* v_tile) {
  switch (c) {
    case 0:
      _tile_loadd(5, v_tile, 64);
      _tile_dpbf16ps(0, 4, 5);
      break;
    case 1:
      _tile_loadd(6, v_tile, 64);
      _tile_dpbf16ps(1, 4, 6);
      break;
    case 2:
      _tile_loadd(5, v_tile, 64);
      _tile_dpbf16ps(2, 4, 5);
      break;
    default:
      _tile_loadd(6, v_tile, 64);
      _tile_dpbf16ps(3, 4, 6);
      break;
  }
}

DI_AMX inline void StoreOut(int c, float* out) {
  switch (c) {
    case 0:
      _tile_stored(0, out, 64);
      break;
    case 1:
      _tile_stored(1, out, 64);
      break;
    case 2:
      _tile_stored(2, out, 64);
      break;
    default:
      _tile_stored(3, out, 64);
      break;
  }
}

DI_AMX inline void ZeroAccumulator(int c) {
  switch (c) {
    case 0:
      _tile_zero(0);
      break;
    case 1:
      _tile_zero(1);
      break;
    case 2:
      _tile_zero(2);
      break;
    default:
      _tile_zero(3);
      break;
  }
}

// Accumulator c (0-3) += K tile (4) . Q^T tile q (loaded into 5).
DI_AMX inline void AccumulateScores(int c, const uint16_t* q) {
  _tile_loadd(5, q, 64);
  switch (c) {
    case 0:
      _tile_dpbf16ps(0, 4, 5);
      break;
    case 1:
      _tile_dpbf16ps(1, 4, 5);
      break;
    case 2:
      _tile_dpbf16ps(2, 4, 5);
      break;
    default:
      _tile_dpbf16ps(3, 4, 5);
      break;
  }
}

// Round-to-nearest-even to bf16 and back on 16 lanes, exactly as avx2::RoundBf16 on 8.
DI_AMX inline __m512 RoundBf16x16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                       _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(is_nan, _mm512_castsi512_ps(rounded), v);
}

// exp on 16 lanes: avx2::Exp's operations, one for one, so each lane's result is bit-identical
// to what avx2::Exp gives for it (a row's probabilities then do not depend on the layout below).
DI_AMX inline __m512 Exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.7228f);
  const __m512 lo = _mm512_set1_ps(-87.3365f);
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half1 = _mm512_srai_epi32(ni, 1);
  const __m512i half2 = _mm512_sub_epi32(ni, half1);
  const __m512 s1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half1, _mm512_set1_epi32(127)), 23));
  const __m512 s2 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half2, _mm512_set1_epi32(127)), 23));
  __m512 result = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  result = _mm512_mask_blend_ps(under, result, _mm512_setzero_ps());
  result = _mm512_mask_blend_ps(over, result, _mm512_set1_ps(__builtin_inff()));
  return _mm512_mask_blend_ps(is_nan, result, x);
}

// Transposes the 16 x 16 matrix of 32-bit elements whose row i is v[i].
DI_AMX inline void Transpose16x16(__m512i* v) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  // s[4 g + c], 128-bit lane L: rows 4 g .. 4 g + 3 of column 4 L + c.
  __m512i s[16];
  for (int g = 0; g < 16; g += 4) {
    s[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    s[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    s[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    s[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  // Row 4 L + c of the result, lane G = s[4 G + c] lane L.
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(s[c], s[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(s[c], s[4 + c], 0xee);
    const __m512i x2 = _mm512_shuffle_i32x4(s[8 + c], s[12 + c], 0x44);
    const __m512i x3 = _mm512_shuffle_i32x4(s[8 + c], s[12 + c], 0xee);
    v[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    v[4 + c] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
    v[8 + c] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
  }
}

// The by-key softmax of one tile (AttentionTasksAmx): scores `st` as [keys][16 rows] (key i =
// base + i), rows 0..n-1 attending to keys [first[c], last[c]] (relative to base, which is a
// multiple of 32); writes the tile's bf16 probabilities as P tiles (one per 32 keys) to `p_out`.
// Each row's result equals the by-row path's bit for bit. Apart from the kernel (not inlined) so
// that its 512-bit code does not shape the by-row path's.
DI_AMX __attribute__((noinline)) void SoftmaxByKey(float* st, int64_t keys, int n,
                                                   const int32_t* first_at, const int32_t* last_at,
                                                   float scale, uint16_t* p_out) {
  const __mmask16 used = static_cast<__mmask16>((1u << n) - 1u);
  // Lanes past the tile's rows keep no key.
  const __m512i first = _mm512_mask_loadu_epi32(_mm512_set1_epi32(1 << 30), used, first_at);
  const __m512i last = _mm512_mask_loadu_epi32(_mm512_set1_epi32(-1), used, last_at);
  const __m512 scale16 = _mm512_set1_ps(scale);
  const __m512 neg_inf16 = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vmax = neg_inf16;
  for (int64_t i = 0; i < keys; ++i) {
    const __m512i idx = _mm512_set1_epi32(static_cast<int32_t>(i));
    const __mmask16 keep = _mm512_cmpge_epi32_mask(idx, first) & _mm512_cmple_epi32_mask(idx, last);
    __m512 v = RoundBf16x16(_mm512_loadu_ps(st + i * 16));
    v = RoundBf16x16(_mm512_mul_ps(v, scale16));
    v = _mm512_mask_blend_ps(keep, neg_inf16, v);
    _mm512_storeu_ps(st + i * 16, v);
    vmax = _mm512_max_ps(vmax, v);
  }
  vmax = _mm512_mask_mov_ps(_mm512_setzero_ps(), used, vmax);  // unused lanes: exp(-inf) = 0
  // Lane c's sum as the by-row path's: 8 partial sums over the keys i = j (mod 8), in order,
  // added as avx2::Hsum adds its 8 lanes.
  __m512 part[8];
  for (__m512& x : part) x = _mm512_setzero_ps();
  for (int64_t i = 0; i < keys; ++i) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(st + i * 16), vmax));
    _mm512_storeu_ps(st + i * 16, e);
    part[i & 7] = _mm512_add_ps(part[i & 7], e);
  }
  const __m512 sum = _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(part[0], part[4]), _mm512_add_ps(part[2], part[6])),
      _mm512_add_ps(_mm512_add_ps(part[1], part[5]), _mm512_add_ps(part[3], part[7])));
  // P tile b, row c = the pairs (keys 32 b + 2 j, + 1) of lane c: a transposition of the key
  // pairs' 16 lanes.
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t b = 0; b < keys / kKeys; ++b) {
    __m512i pairs[16];
    for (int j = 0; j < 16; ++j) {
      const float* at = st + (b * kKeys + 2 * j) * 16;
      const __m512 p0 = RoundBf16x16(_mm512_div_ps(_mm512_loadu_ps(at), sum));
      const __m512 p1 = RoundBf16x16(_mm512_div_ps(_mm512_loadu_ps(at + 16), sum));
      pairs[j] = _mm512_maskz_mov_epi32(
          used, _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(p0), 16),
                                _mm512_and_si512(_mm512_castps_si512(p1), high)));
    }
    Transpose16x16(pairs);
    uint16_t* dst = p_out + b * kTileElems;
    for (int c = 0; c < 16; ++c) {
      _mm512_storeu_si512(reinterpret_cast<__m512i*>(dst + c * kKeys), pairs[c]);
    }
  }
}

}  // namespace

bool AttentionAmxSupports(const PagedAttentionParams& p) {
  if (p.kv_dtype != DType::kBF16 || p.round_to != DType::kBF16 || p.head_dim % kDims != 0 ||
      p.block_size % kGroupKeys != 0 || p.num_kv_heads <= 0 || Group(p) > kRows) {
    return false;
  }
  // q must hold bf16 values (the model rounds it after RoPE): the tiles multiply bf16.
  return bf16_parts::AllBf16Values(p.q, p.num_tokens * p.num_heads * p.head_dim);
}

int64_t AttentionAmxNumTasks(const PagedAttentionParams& p) {
  const int64_t tpt = TokensPerTask(p);
  return (p.num_tokens + tpt - 1) / tpt * p.num_kv_heads;
}

DI_AMX void AttentionTasksAmx(const PagedAttentionParams& p, int64_t begin, int64_t end) {
  const int group = Group(p);
  const int hd = p.head_dim;
  const int64_t tpt = TokensPerTask(p);
  const int tile_rows = static_cast<int>(TokensPerTile(p)) * group;  // rows of a full tile
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t total = p.start_position + p.num_tokens;
  const DType rt = p.round_to;
  const int d_tiles = hd / kDims;  // score products per key group
  const int v_chunks = hd / 16;    // output tiles (16 dims each) per row block
  const uint16_t* k_cache = static_cast<const uint16_t*>(p.k_base);
  const uint16_t* v_cache = static_cast<const uint16_t*>(p.v_base);
  auto first_key = [&](int64_t q_pos) {
    return p.sliding_window > 0 ? std::max<int64_t>(0, q_pos - p.sliding_window + 1) : int64_t{0};
  };
  auto slot = [&](const uint16_t* base, int64_t pos, int kvh) {
    return base + static_cast<int64_t>(p.block_table[pos / p.block_size]) * p.block_stride +
           (pos % p.block_size) * slot_stride + static_cast<int64_t>(kvh) * hd;
  };
  // Keys a task may span: its rows' range plus the alignment below, whatever the window.
  const int64_t keys_cap = (total + 2 * kKeys) / kKeys * kKeys;
  // Scratch per thread: scores per tile, keys x 16 floats ([tile row][keys], or by key (below)
  // [keys][16 tile rows]); Q^T, P and packed V tiles. Tasks of one tile (a decode step's token,
  // drafts of up to 4) have their own, sized for one tile: sharing the larger buffers of tasks of
  // several tiles (a prefill chunk, a long draft) measured them 11-12% slower at 32 sequences and
  // 1024 cached tokens (attention_bench).
  struct Scratch {
    std::vector<float> scores;
    std::vector<uint16_t> q, p, v;
    void Reserve(int tiles, int64_t keys_cap, int d_tiles, int v_chunks) {
      auto grow = [](auto& buffer, int64_t n) {
        if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
      };
      grow(scores, kRows * tiles * keys_cap);
      grow(q, tiles * d_tiles * kTileElems);
      grow(p, tiles * keys_cap / kKeys * kTileElems);
      grow(v, keys_cap / kKeys * v_chunks * kTileElems);
    }
  };
  thread_local Scratch one_tile, many_tiles;
  // Tiles a task of this call can have.
  const int max_tiles = static_cast<int>(
      std::min<int64_t>(kMaxTiles, (p.num_tokens * group + tile_rows - 1) / tile_rows));
  Scratch& scratch = max_tiles == 1 ? one_tile : many_tiles;
  scratch.Reserve(max_tiles, keys_cap, d_tiles, v_chunks);
  uint16_t* const q_at = scratch.q.data();
  float* const s_at = scratch.scores.data();
  uint16_t* const p_at = scratch.p.data();
  uint16_t* const v_at = scratch.v.data();
  alignas(64) float c_tile[16 * 16];
  const amx::ScopedTiles tiles;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t chunk = task / p.num_kv_heads;
    const int kvh = static_cast<int>(task % p.num_kv_heads);
    const int64_t t_begin = chunk * tpt;
    const int64_t t_end = std::min(p.num_tokens, t_begin + tpt);
    const int rows = static_cast<int>((t_end - t_begin) * group);
    const int num_tiles = (rows + tile_rows - 1) / tile_rows;
    // Row r: token t_begin + r / group, query head kvh * group + r % group; it is row r %
    // tile_rows of tile r / tile_rows.
    auto tile_rows_of = [&](int t) { return std::min(tile_rows, rows - t * tile_rows); };
    // A tile's softmax runs by row (vectors of 8 keys of one row) for a few rows, as a decode
    // step's one token has, and by key (vectors of the tile's 16 rows for one key: no
    // transposition of the score tiles, twice the lanes) for more. Both give every row the same
    // result.
    auto by_key = [&](int t) { return tile_rows_of(t) > 8; };
    int64_t row_first[kRows * kMaxTiles], row_last[kRows * kMaxTiles];
    for (int r = 0; r < rows; ++r) {
      row_last[r] = p.start_position + t_begin + r / group;
      row_first[r] = first_key(row_last[r]);
    }
    const int64_t lo = row_first[0], hi = row_last[rows - 1];
    const int64_t base = lo / kKeys * kKeys;  // key blocks aligned to absolute positions
    const int64_t key_blocks = (hi - base) / kKeys + 1;
    const int64_t keys = key_blocks * kKeys;

    // Q^T per tile as the score products' second operand: tile (t, d), row i, column c = dims
    // (32 d + 2 i, 32 d + 2 i + 1) of the tile's row c.
    std::fill(q_at, q_at + num_tiles * d_tiles * kTileElems, 0);
    for (int r = 0; r < rows; ++r) {
      const float* q =
          p.q + ((t_begin + r / group) * p.num_heads + kvh * group + r % group) * int64_t{hd};
      const int t = r / tile_rows, c = r % tile_rows;
      for (int d = 0; d < hd; d += 2) {
        uint16_t* at =
            q_at + (t * d_tiles + d / kDims) * kTileElems + ((d % kDims) / 2) * kKeys + 2 * c;
        at[0] = Top(q[d]);
        at[1] = Top(q[d + 1]);
      }
    }

    // Scores: per group of 16 keys, K (read in place, once for all the task's tiles: the later
    // tiles' loads hit L1) . Q^T of each tile, transposed into rows of `scores`.
    float* s = s_at;
    for (int64_t g = 0; g < keys / kGroupKeys; ++g) {
      const int64_t key0 = base + g * kGroupKeys;
      if (key0 + kGroupKeys <= lo || key0 > hi) {
        // No row attends to these keys (and their block may be gone): masked below.
        for (int t = 0; t < num_tiles; ++t) {
          float* st = s + static_cast<int64_t>(t) * keys * 16;
          if (by_key(t)) {
            std::fill(st + g * kGroupKeys * 16, st + (g + 1) * kGroupKeys * 16, 0.0f);
          } else {
            for (int c = 0; c < tile_rows_of(t); ++c) {
              std::fill(st + c * keys + g * kGroupKeys, st + c * keys + (g + 1) * kGroupKeys, 0.0f);
            }
          }
        }
        continue;
      }
      const uint16_t* k = slot(k_cache, key0, kvh);
      // The rows come from memory (a long context's cache is far larger than L2): the keys two
      // groups on, and this group's values (packed below), are fetched while this group runs.
      const int64_t ahead = key0 + 2 * kGroupKeys;
      if (ahead + kGroupKeys <= hi + 1) {
        const char* k_ahead = reinterpret_cast<const char*>(slot(k_cache, ahead, kvh));
        for (int i = 0; i < kGroupKeys; ++i) {
          for (int line = 0; line < hd * 2; line += 64) {
            _mm_prefetch(k_ahead + i * slot_stride * 2 + line, _MM_HINT_T0);
          }
        }
      }
      const char* v_here = reinterpret_cast<const char*>(slot(v_cache, key0, kvh));
      for (int i = 0; i < kGroupKeys; ++i) {
        for (int line = 0; line < hd * 2; line += 64) {
          _mm_prefetch(v_here + i * slot_stride * 2 + line, _MM_HINT_T1);
        }
      }
      // Accumulator t (0-3) for tile t: each K tile is loaded once for all of them, and their
      // products are independent (no tile waits for the previous one's).
      for (int t = 0; t < num_tiles; ++t) ZeroAccumulator(t);
      for (int d = 0; d < d_tiles; ++d) {
        _tile_loadd(4, k + d * kDims, slot_stride * 2);
        for (int t = 0; t < num_tiles; ++t) {
          AccumulateScores(t, q_at + (t * d_tiles + d) * kTileElems);
        }
      }
      for (int t = 0; t < num_tiles; ++t) {
        float* st = s + static_cast<int64_t>(t) * keys * 16;
        if (by_key(t)) {
          StoreOut(t, st + g * kGroupKeys * 16);
          continue;
        }
        StoreOut(t, c_tile);
        const int n = tile_rows_of(t);
        for (int c = 0; c < n; ++c) {
          float* sr = st + c * keys + g * kGroupKeys;
          for (int i = 0; i < kGroupKeys; ++i) sr[i] = c_tile[i * 16 + c];
        }
      }
    }

    // Softmax per row over its keys [row_first, row_last]; probabilities (bf16 values) go to the
    // P tiles: tile (t, b), row c, column i = key base + 32 b + i of the tile's row c. Rows past
    // a tile's rows stay zero.
    std::fill(p_at, p_at + num_tiles * key_blocks * kTileElems, 0);
    const __m256 vscale = _mm256_set1_ps(p.scale);
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int r = 0; r < rows; ++r) {
      const int t = r / tile_rows;
      if (by_key(t)) continue;
      float* sr = s + static_cast<int64_t>(t) * keys * 16 + (r % tile_rows) * keys;
      uint16_t* p_row = p_at + (r / tile_rows) * key_blocks * kTileElems + (r % tile_rows) * kKeys;
      const __m256 first = _mm256_set1_ps(static_cast<float>(row_first[r] - base));
      const __m256 last = _mm256_set1_ps(static_cast<float>(row_last[r] - base));
      __m256 vmax = neg_inf;
      for (int64_t i = 0; i < keys; i += 8) {
        const __m256 idx = _mm256_add_ps(_mm256_set1_ps(static_cast<float>(i)), lane);
        const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(idx, first, _CMP_GE_OQ),
                                          _mm256_cmp_ps(idx, last, _CMP_LE_OQ));
        __m256 v = avx2::RoundTo(rt, _mm256_loadu_ps(sr + i));
        v = avx2::RoundTo(rt, _mm256_mul_ps(v, vscale));
        v = _mm256_blendv_ps(neg_inf, v, keep);
        _mm256_storeu_ps(sr + i, v);
        vmax = _mm256_max_ps(vmax, v);
      }
      alignas(32) float m8[8];
      _mm256_store_ps(m8, vmax);
      float max_score = m8[0];
      for (int i = 1; i < 8; ++i) max_score = std::max(max_score, m8[i]);
      const __m256 vm = _mm256_set1_ps(max_score);
      __m256 vsum = _mm256_setzero_ps();
      for (int64_t i = 0; i < keys; i += 8) {
        // exp(-inf) is 0: keys outside the row add nothing, wherever its task's keys start.
        const __m256 e = avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(sr + i), vm));
        _mm256_storeu_ps(sr + i, e);
        vsum = _mm256_add_ps(vsum, e);
      }
      const __m256 vs = _mm256_set1_ps(avx2::Hsum(vsum));
      for (int64_t i = 0; i < keys; i += 8) {
        const __m256 prob = avx2::RoundTo(rt, _mm256_div_ps(_mm256_loadu_ps(sr + i), vs));
        // Top halves of the 8 values (exact: they are bf16 values).
        const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(prob), 16);
        const __m128i packed =
            _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
        uint16_t* dst = p_row + (i / kKeys) * kTileElems + (i % kKeys);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
      }
    }

    for (int t = 0; t < num_tiles; ++t) {
      if (!by_key(t)) continue;
      const int n = tile_rows_of(t);
      int32_t first_at[16], last_at[16];
      for (int c = 0; c < n; ++c) {
        first_at[c] = static_cast<int32_t>(row_first[t * tile_rows + c] - base);
        last_at[c] = static_cast<int32_t>(row_last[t * tile_rows + c] - base);
      }
      SoftmaxByKey(s + static_cast<int64_t>(t) * keys * 16, keys, n, first_at, last_at, p.scale,
                   p_at + static_cast<int64_t>(t) * key_blocks * kTileElems);
    }

    // V as the output products' second operand, packed once for all the task's tiles: tile
    // (b, c), row i = keys (base + 32 b + 2 i, + 1) interleaved over dims 16 c .. 16 c + 15. Keys
    // outside [lo, hi] are zero (past hi the slots hold no value yet; before lo the block may be
    // gone).
    const __m256i zero = _mm256_setzero_si256();
    for (int64_t b = 0; b < key_blocks; ++b) {
      for (int i = 0; i < kKeys / 2; ++i) {
        const int64_t ka = base + b * kKeys + 2 * i, kb = ka + 1;
        const uint16_t* va = ka >= lo && ka <= hi ? slot(v_cache, ka, kvh) : nullptr;
        const uint16_t* vb = kb >= lo && kb <= hi ? slot(v_cache, kb, kvh) : nullptr;
        for (int c = 0; c < v_chunks; ++c) {
          const __m256i a = va != nullptr
                                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(va + c * 16))
                                : zero;
          const __m256i bv = vb != nullptr
                                 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + c * 16))
                                 : zero;
          const __m256i lo8 = _mm256_unpacklo_epi16(a, bv);  // pairs of dims 0-3 | 8-11
          const __m256i hi8 = _mm256_unpackhi_epi16(a, bv);  // pairs of dims 4-7 | 12-15
          uint16_t* dst = v_at + (b * v_chunks + c) * kTileElems + i * kKeys;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                              _mm256_permute2x128_si256(lo8, hi8, 0x20));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16),
                              _mm256_permute2x128_si256(lo8, hi8, 0x31));
        }
      }
    }

    // out = P . V per tile, four 16-dim chunks at a time over the key blocks in order.
    for (int t = 0; t < num_tiles; ++t) {
      const uint16_t* p_tile = p_at + static_cast<int64_t>(t) * key_blocks * kTileElems;
      const int n = tile_rows_of(t);
      for (int c0 = 0; c0 < v_chunks; c0 += 4) {
        const int chunks = std::min(4, v_chunks - c0);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t b = 0; b < key_blocks; ++b) {
          _tile_loadd(4, p_tile + b * kTileElems, 64);
          for (int c = 0; c < chunks; ++c) {
            AccumulateOut(c, v_at + (b * v_chunks + c0 + c) * kTileElems);
          }
        }
        for (int c = 0; c < chunks; ++c) {
          StoreOut(c, c_tile);
          for (int rr = 0; rr < n; ++rr) {
            const int r = t * tile_rows + rr;
            float* out =
                p.out +
                ((t_begin + r / group) * p.num_heads + kvh * group + r % group) * int64_t{hd} +
                (c0 + c) * 16;
            _mm256_storeu_ps(out, avx2::RoundTo(rt, _mm256_load_ps(c_tile + rr * 16)));
            _mm256_storeu_ps(out + 8, avx2::RoundTo(rt, _mm256_load_ps(c_tile + rr * 16 + 8)));
          }
        }
      }
    }
  }
}

#pragma GCC diagnostic pop
#else

bool AttentionAmxSupports(const PagedAttentionParams&) { return false; }
int64_t AttentionAmxNumTasks(const PagedAttentionParams&) { return 0; }
void AttentionTasksAmx(const PagedAttentionParams&, int64_t, int64_t) {}

#endif  // defined(__x86_64__)

}  // namespace deepinfer::kernels
