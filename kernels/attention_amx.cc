#include "kernels/attention_amx.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/amx_tiles.h"
#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {

#if defined(__x86_64__)
namespace {

constexpr int kRows = 16;       // query rows (token, query head) of a task
constexpr int kGroupKeys = 16;  // keys of one score tile (one block holds whole groups)
constexpr int kKeys = 32;       // keys of one P . V tile product (16 pairs)
constexpr int kDims = 32;       // head dims of one score tile product (16 pairs)
constexpr int kTileElems = amx::kOperandElems;

int Group(const PagedAttentionParams& p) { return p.num_heads / p.num_kv_heads; }

int64_t TokensPerTask(const PagedAttentionParams& p) {
  return std::max<int64_t>(1, kRows / Group(p));
}

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

}  // namespace

bool AttentionAmxSupports(const PagedAttentionParams& p) {
  if (p.kv_dtype != DType::kBF16 || p.round_to != DType::kBF16 || p.head_dim % kDims != 0 ||
      p.block_size % kGroupKeys != 0 || p.num_kv_heads <= 0 || Group(p) > kRows) {
    return false;
  }
  // q must hold bf16 values (the model rounds it after RoPE): the tiles multiply bf16.
  const int64_t n = p.num_tokens * p.num_heads * p.head_dim;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, p.q + i, 4);
    if ((b & 0xffffu) != 0) return false;
  }
  return true;
}

int64_t AttentionAmxNumTasks(const PagedAttentionParams& p) {
  const int64_t tpt = TokensPerTask(p);
  return (p.num_tokens + tpt - 1) / tpt * p.num_kv_heads;
}

DI_AMX void AttentionTasksAmx(const PagedAttentionParams& p, int64_t begin, int64_t end) {
  const int group = Group(p);
  const int hd = p.head_dim;
  const int64_t tpt = TokensPerTask(p);
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
  const int64_t keys_cap = (total + 2 * kKeys) / kKeys * kKeys;
  thread_local std::vector<float> scores;  // [kRows][keys]
  thread_local std::vector<uint16_t> q_tiles, p_tiles, v_tiles;
  if (static_cast<int64_t>(scores.size()) < kRows * keys_cap) scores.resize(kRows * keys_cap);
  q_tiles.resize(static_cast<size_t>(d_tiles) * kTileElems);
  if (static_cast<int64_t>(p_tiles.size()) < keys_cap / kKeys * kTileElems) {
    p_tiles.resize(keys_cap / kKeys * kTileElems);
  }
  if (static_cast<int64_t>(v_tiles.size()) < keys_cap / kKeys * v_chunks * kTileElems) {
    v_tiles.resize(keys_cap / kKeys * v_chunks * kTileElems);
  }
  alignas(64) float c_tile[16 * 16];
  const amx::ScopedTiles tiles;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t tile = task / p.num_kv_heads;
    const int kvh = static_cast<int>(task % p.num_kv_heads);
    const int64_t t_begin = tile * tpt;
    const int64_t t_end = std::min(p.num_tokens, t_begin + tpt);
    const int rows = static_cast<int>((t_end - t_begin) * group);
    // Row r: token t_begin + r / group, query head kvh * group + r % group.
    int64_t row_first[kRows], row_last[kRows];
    for (int r = 0; r < rows; ++r) {
      row_last[r] = p.start_position + t_begin + r / group;
      row_first[r] = first_key(row_last[r]);
    }
    const int64_t lo = row_first[0], hi = row_last[rows - 1];
    const int64_t base = lo / kKeys * kKeys;  // key blocks aligned to absolute positions
    const int64_t key_blocks = (hi - base) / kKeys + 1;
    const int64_t keys = key_blocks * kKeys;

    // Q^T as the score products' second operand: tile d, row i, column r = dims (32 d + 2 i,
    // 32 d + 2 i + 1) of row r.
    std::fill(q_tiles.begin(), q_tiles.end(), 0);
    for (int r = 0; r < rows; ++r) {
      const float* q =
          p.q + ((t_begin + r / group) * p.num_heads + kvh * group + r % group) * int64_t{hd};
      for (int d = 0; d < hd; d += 2) {
        uint16_t* at =
            q_tiles.data() + (d / kDims) * kTileElems + ((d % kDims) / 2) * kKeys + 2 * r;
        at[0] = Top(q[d]);
        at[1] = Top(q[d + 1]);
      }
    }

    // Scores: per group of 16 keys, K (read in place) . Q^T, transposed into rows of `scores`.
    float* s = scores.data();
    for (int64_t g = 0; g < keys / kGroupKeys; ++g) {
      const int64_t key0 = base + g * kGroupKeys;
      float* s_group = s + g * kGroupKeys;
      if (key0 + kGroupKeys <= lo || key0 > hi) {
        // No row attends to these keys (and their block may be gone): masked below.
        for (int r = 0; r < rows; ++r) std::fill(s_group + r * keys, s_group + r * keys + 16, 0.0f);
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
      _tile_zero(0);
      for (int d = 0; d < d_tiles; ++d) {
        _tile_loadd(4, k + d * kDims, slot_stride * 2);
        _tile_loadd(5, q_tiles.data() + d * kTileElems, 64);
        _tile_dpbf16ps(0, 4, 5);
      }
      _tile_stored(0, c_tile, 64);
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < kGroupKeys; ++i) s_group[r * keys + i] = c_tile[i * 16 + r];
      }
    }

    // Softmax per row over its keys [row_first, row_last]; probabilities (bf16 values) go to the
    // P tiles: tile b, row r, column i = key base + 32 b + i. Rows past `rows` stay zero.
    std::fill(p_tiles.begin(), p_tiles.begin() + key_blocks * kTileElems, 0);
    const __m256 vscale = _mm256_set1_ps(p.scale);
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int r = 0; r < rows; ++r) {
      float* sr = s + r * keys;
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
        uint16_t* dst = p_tiles.data() + (i / kKeys) * kTileElems + r * kKeys + (i % kKeys);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
      }
    }

    // V as the output products' second operand: tile (b, c), row i = keys (base + 32 b + 2 i,
    // + 1) interleaved over dims 16 c .. 16 c + 15. Keys outside [lo, hi] are zero (past hi the
    // slots hold no value yet; before lo the block may be gone).
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
          uint16_t* dst = v_tiles.data() + (b * v_chunks + c) * kTileElems + i * kKeys;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                              _mm256_permute2x128_si256(lo8, hi8, 0x20));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16),
                              _mm256_permute2x128_si256(lo8, hi8, 0x31));
        }
      }
    }

    // out = P . V, four 16-dim chunks at a time over the key blocks in order.
    for (int c0 = 0; c0 < v_chunks; c0 += 4) {
      const int chunks = std::min(4, v_chunks - c0);
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t b = 0; b < key_blocks; ++b) {
        _tile_loadd(4, p_tiles.data() + b * kTileElems, 64);
        for (int c = 0; c < chunks; ++c) {
          AccumulateOut(c, v_tiles.data() + (b * v_chunks + c0 + c) * kTileElems);
        }
      }
      for (int c = 0; c < chunks; ++c) {
        StoreOut(c, c_tile);
        for (int r = 0; r < rows; ++r) {
          float* out =
              p.out +
              ((t_begin + r / group) * p.num_heads + kvh * group + r % group) * int64_t{hd} +
              (c0 + c) * 16;
          _mm256_storeu_ps(out, avx2::RoundTo(rt, _mm256_load_ps(c_tile + r * 16)));
          _mm256_storeu_ps(out + 8, avx2::RoundTo(rt, _mm256_load_ps(c_tile + r * 16 + 8)));
        }
      }
    }
  }
}

#else

bool AttentionAmxSupports(const PagedAttentionParams&) { return false; }
int64_t AttentionAmxNumTasks(const PagedAttentionParams&) { return 0; }
void AttentionTasksAmx(const PagedAttentionParams&, int64_t, int64_t) {}

#endif  // defined(__x86_64__)

}  // namespace deepinfer::kernels
