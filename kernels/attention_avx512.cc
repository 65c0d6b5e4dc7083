#include "kernels/attention_avx512.h"

// GCC 12 reports its own AVX-512 intrinsics' "__Y = __Y" (an undefined vector on purpose) as
// maybe uninitialized once they are inlined here: a false positive of that GCC release.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/bf16_parts.h"
#include "kernels/simd_avx2.h"
#include "kernels/simd_avx512.h"

namespace deepinfer::kernels {

#if defined(__x86_64__)
namespace {

constexpr int kTaskRows = 24;  // query rows (token, query head) of a task; at least one token's
constexpr int kKeys = 16;      // keys of a score block
constexpr int kOutAcc = 24;    // P . V accumulators of one pass over V
constexpr int kMaxHeadDim = 128;

// What a key outside the task's keys reads: zeros, whose scores and products are masked out.
alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};

int Group(const PagedAttentionParams& p) { return p.num_heads / p.num_kv_heads; }

int64_t TokensPerTask(const PagedAttentionParams& p) {
  return std::max<int64_t>(1, kTaskRows / Group(p));
}

// The lanes of the 16 keys from b (lane + b) that lie in [first, last].
DI_AVX512BF16 inline __mmask16 KeysIn(__m512i lane, int64_t b, int32_t first, int32_t last) {
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(b)), lane);
  return _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(first)) &
         _mm512_cmple_epi32_mask(idx, _mm512_set1_epi32(last));
}

// One task: the query rows of tokens [t_begin, t_end) (token-major, then the group's heads)
// against KV head kvh. C = head_dim / 32.
template <int C>
DI_AVX512BF16 void RunTask(const PagedAttentionParams& p, int64_t t_begin, int64_t t_end,
                           int kvh) {
  constexpr int kHd = 32 * C;
  constexpr int kRowsPerPass = kOutAcc / (2 * C);
  const int group = Group(p);
  const int rows = static_cast<int>(t_end - t_begin) * group;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * kHd;
  auto first_key = [&](int64_t q_pos) {
    return p.sliding_window > 0 ? std::max<int64_t>(0, q_pos - p.sliding_window + 1) : int64_t{0};
  };
  // Keys some row attends to: [lo, hi]. Score blocks start at `base`, a multiple of kKeys, so
  // blocks and key pairs sit at absolute positions whatever the task.
  const int64_t lo = first_key(p.start_position + t_begin);
  const int64_t hi = p.start_position + t_end - 1;
  const int64_t base = lo / kKeys * kKeys;
  const int64_t span = (hi + 1 - base + kKeys - 1) / kKeys * kKeys;
  const uint16_t* k_cache = static_cast<const uint16_t*>(p.k_base);
  const uint16_t* v_cache = static_cast<const uint16_t*>(p.v_base);
  auto row_at = [&](const uint16_t* cache, int64_t pos) -> const uint16_t* {
    if (pos < lo || pos > hi) return kZeroRow;
    const int64_t block = p.block_table[pos / p.block_size];
    return cache + block * p.block_stride + (pos % p.block_size) * slot_stride +
           static_cast<int64_t>(kvh) * kHd;
  };
  thread_local std::vector<uint16_t> q16;     // [rows][kHd]
  thread_local std::vector<float> scores;     // [rows][span], keys from base
  thread_local std::vector<uint16_t> probs;   // [rows][span], bf16
  const size_t need = static_cast<size_t>(rows) * span;
  if (q16.size() < static_cast<size_t>(rows) * kHd) q16.resize(static_cast<size_t>(rows) * kHd);
  if (scores.size() < need) scores.resize(need);
  if (probs.size() < need) probs.resize(need);
  auto q_pos_of = [&](int r) { return p.start_position + t_begin + r / group; };

  // Query rows as bf16 (they hold bf16 values: AttentionAvx512Supports).
  for (int r = 0; r < rows; ++r) {
    const float* src =
        p.q + ((t_begin + r / group) * p.num_heads + static_cast<int64_t>(kvh) * group +
               r % group) * kHd;
    uint16_t* dst = q16.data() + static_cast<size_t>(r) * kHd;
    for (int d = 0; d < kHd; d += 16) {
      const __m512i bits = _mm512_srli_epi32(_mm512_loadu_si512(src + d), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), _mm512_cvtepi32_epi16(bits));
    }
  }

  // Scores: per block of 16 keys (read once, then from L1 for every row), each (row, key) one
  // accumulator over head_dim; the reduction leaves lane 4 c + r = key 4 r + c, reordered.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 scale16 = _mm512_set1_ps(p.scale);
  for (int64_t b = 0; b < span; b += kKeys) {
    const uint16_t* keys[kKeys];
    for (int i = 0; i < kKeys; ++i) keys[i] = row_at(k_cache, base + b + i);
    for (int r = 0; r < rows; ++r) {
      __m512 acc[kKeys];
#pragma GCC unroll 16
      for (int i = 0; i < kKeys; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(q16.data() + r * kHd + 32 * c);
#pragma GCC unroll 16
        for (int i = 0; i < kKeys; ++i) {
          acc[i] = _mm512_dpbf16_ps(acc[i], qv, (__m512bh)_mm512_loadu_si512(keys[i] + 32 * c));
        }
      }
      const __m512 dot = _mm512_permutexvar_ps(order, avx512::Reduce16(acc));
      // As the other paths: the dot rounded, times the scale, rounded again.
      float* s = scores.data() + static_cast<size_t>(r) * span + b;
      _mm512_storeu_ps(s, bf16_parts::RoundTo16(
                              DType::kBF16,
                              _mm512_mul_ps(bf16_parts::RoundTo16(DType::kBF16, dot), scale16)));
    }
  }

  // Softmax per row over its keys [first, q_pos], in the 16-key blocks that hold them; the
  // probabilities as bf16, zero for every other key of the span.
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int r = 0; r < rows; ++r) {
    const int64_t q_pos = q_pos_of(r);
    const int32_t first = static_cast<int32_t>(first_key(q_pos) - base);
    const int32_t last = static_cast<int32_t>(q_pos - base);
    const int64_t b0 = first / kKeys * kKeys, b1 = last / kKeys * kKeys;
    float* s = scores.data() + static_cast<size_t>(r) * span;
    uint16_t* pr = probs.data() + static_cast<size_t>(r) * span;
    __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t b = b0; b <= b1; b += kKeys) {
      vmax = _mm512_mask_max_ps(vmax, KeysIn(lane, b, first, last), vmax, _mm512_loadu_ps(s + b));
    }
    const __m256 max8 = _mm256_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t b = b0; b <= b1; b += kKeys) {
      const __m256 e0 = avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(s + b), max8));
      const __m256 e1 = avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(s + b + 8), max8));
      const __m512 e = _mm512_maskz_mov_ps(
          KeysIn(lane, b, first, last), _mm512_insertf32x8(_mm512_castps256_ps512(e0), e1, 1));
      _mm512_storeu_ps(s + b, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    const __m512 sum = _mm512_set1_ps(_mm512_reduce_add_ps(vsum));
    std::fill(pr, pr + b0, uint16_t{0});
    std::fill(pr + b1 + kKeys, pr + span, uint16_t{0});
    for (int64_t b = b0; b <= b1; b += kKeys) {
      const __m512 prob =
          bf16_parts::RoundTo16(DType::kBF16, _mm512_div_ps(_mm512_loadu_ps(s + b), sum));
      const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(prob), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + b), _mm512_cvtepi32_epi16(bits));
    }
  }

  // P . V: key pairs (even, odd positions) in order; V rows interleaved once per pair into
  // dword pairs (lanes of the low half: dims 8 L + 0..3 of 128-bit lane L; high half: 8 L +
  // 4..7), each row's two probabilities broadcast as one dword.
  const __m512i idx_lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i idx_hi =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int r0 = 0; r0 < rows; r0 += kRowsPerPass) {
    const int nr = std::min(kRowsPerPass, rows - r0);
    // The pairs these rows attend to; a pair outside one row's keys adds exact zeros to it.
    const int64_t i0 = (first_key(q_pos_of(r0)) - base) / 2 * 2;
    const int64_t i1 = q_pos_of(r0 + nr - 1) - base;
    __m512 acc[kRowsPerPass][2 * C];
#pragma GCC unroll 24
    for (int rr = 0; rr < kRowsPerPass; ++rr) {
#pragma GCC unroll 8
      for (int c = 0; c < 2 * C; ++c) acc[rr][c] = _mm512_setzero_ps();
    }
    for (int64_t i = i0; i <= i1; i += 2) {
      const uint16_t* va = row_at(v_cache, base + i);
      const uint16_t* vb = row_at(v_cache, base + i + 1);
      __m512i vlo[C], vhi[C];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const __m512i a = _mm512_loadu_si512(va + 32 * c);
        const __m512i bb = _mm512_loadu_si512(vb + 32 * c);
        vlo[c] = _mm512_unpacklo_epi16(a, bb);
        vhi[c] = _mm512_unpackhi_epi16(a, bb);
      }
#pragma GCC unroll 24
      for (int rr = 0; rr < kRowsPerPass; ++rr) {
        if (rr >= nr) break;
        int32_t pair;
        std::memcpy(&pair, probs.data() + static_cast<size_t>(r0 + rr) * span + i, 4);
        const __m512bh pp = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          acc[rr][2 * c] = _mm512_dpbf16_ps(acc[rr][2 * c], (__m512bh)vlo[c], pp);
          acc[rr][2 * c + 1] = _mm512_dpbf16_ps(acc[rr][2 * c + 1], (__m512bh)vhi[c], pp);
        }
      }
    }
    for (int rr = 0; rr < nr; ++rr) {
      const int r = r0 + rr;
      float* out = p.out + ((t_begin + r / group) * p.num_heads +
                            static_cast<int64_t>(kvh) * group + r % group) * kHd;
      for (int c = 0; c < C; ++c) {
        for (int h = 0; h < 2; ++h) {
          const __m512 dims =
              _mm512_permutex2var_ps(acc[rr][2 * c], h == 0 ? idx_lo : idx_hi, acc[rr][2 * c + 1]);
          _mm512_storeu_ps(out + 32 * c + 16 * h, bf16_parts::RoundTo16(DType::kBF16, dims));
        }
      }
    }
  }
}

}  // namespace

bool AttentionAvx512Supports(const PagedAttentionParams& p) {
  if (p.kv_dtype != DType::kBF16 || p.round_to != DType::kBF16 || p.num_kv_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0 ||
      (p.head_dim != 32 && p.head_dim != 64 && p.head_dim != kMaxHeadDim)) {
    return false;
  }
  // q must hold bf16 values (the model rounds it after RoPE): the products are of bf16.
  return bf16_parts::AllBf16Values(p.q, p.num_tokens * p.num_heads * p.head_dim);
}

int64_t AttentionAvx512NumTasks(const PagedAttentionParams& p) {
  const int64_t per_task = TokensPerTask(p);
  return (p.num_tokens + per_task - 1) / per_task * p.num_kv_heads;
}

void AttentionTasksAvx512(const PagedAttentionParams& p, int64_t begin, int64_t end) {
  const int64_t per_task = TokensPerTask(p);
  for (int64_t task = begin; task < end; ++task) {
    const int64_t t_begin = task / p.num_kv_heads * per_task;
    const int64_t t_end = std::min(p.num_tokens, t_begin + per_task);
    const int kvh = static_cast<int>(task % p.num_kv_heads);
    switch (p.head_dim) {
      case 32:
        RunTask<1>(p, t_begin, t_end, kvh);
        break;
      case 64:
        RunTask<2>(p, t_begin, t_end, kvh);
        break;
      default:
        RunTask<4>(p, t_begin, t_end, kvh);
        break;
    }
  }
}

#else

bool AttentionAvx512Supports(const PagedAttentionParams&) { return false; }
int64_t AttentionAvx512NumTasks(const PagedAttentionParams&) { return 0; }
void AttentionTasksAvx512(const PagedAttentionParams&, int64_t, int64_t) {}

#endif  // defined(__x86_64__)

}  // namespace deepinfer::kernels
