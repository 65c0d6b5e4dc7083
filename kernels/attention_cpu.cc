#include "kernels/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_amx.h"
#include "kernels/attention_avx512.h"
#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

#if defined(__x86_64__)

constexpr int64_t kTileTokens = 8;

int64_t NumTasks(const PagedAttentionParams& p) {
  return (p.num_tokens + kTileTokens - 1) / kTileTokens * p.num_kv_heads;
}

// Tasks [begin, end) of one sequence: one task per (tile of up to kTileTokens new tokens, KV
// head), serving all query heads of the group, so every K and V row is read and widened once
// per task.
DI_AVX2 void AttentionTasksAvx2(const PagedAttentionParams& p, int64_t begin, int64_t end) {
  const int group = p.num_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t total = p.start_position + p.num_tokens;
  const DType rt = p.round_to;
  const __m256 vscale = _mm256_set1_ps(p.scale);
  auto row_offset = [&](int64_t pos, int kvh) {
    const int64_t block = p.block_table[pos / p.block_size];
    return block * p.block_stride + (pos % p.block_size) * slot_stride +
           static_cast<int64_t>(kvh) * hd;
  };
  auto first_key = [&](int64_t q_pos) {
    return p.sliding_window > 0 ? std::max<int64_t>(0, q_pos - p.sliding_window + 1) : int64_t{0};
  };
  {
    thread_local std::vector<float> scores, keys, values;
    const int64_t span_cap = (total + 7) / 8 * 8;
    const int64_t group4 = (group + 3) / 4 * 4;
    if (static_cast<int64_t>(scores.size()) < group4 * span_cap) scores.resize(group4 * span_cap);
    if (static_cast<int64_t>(keys.size()) < (total + 8) * hd) keys.resize((total + 8) * hd);
    if (static_cast<int64_t>(values.size()) < (total + 8) * hd) values.resize((total + 8) * hd);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t tile = task / p.num_kv_heads;
      const int kvh = static_cast<int>(task % p.num_kv_heads);
      const int64_t t_begin = tile * kTileTokens;
      const int64_t t_end = std::min(p.num_tokens, t_begin + kTileTokens);
      const int64_t tile_first = first_key(p.start_position + t_begin);
      const int64_t tile_rows = p.start_position + t_end - tile_first;
      // K and V rows the tile attends to, widened to f32 once; 8 zero rows pad K.
      for (int64_t i = 0; i < tile_rows; ++i) {
        const int64_t elem = row_offset(tile_first + i, kvh);
        for (int d = 0; d < hd; d += 8) {
          _mm256_storeu_ps(keys.data() + i * hd + d, avx2::Load8(p.k_base, p.kv_dtype, elem + d));
          _mm256_storeu_ps(values.data() + i * hd + d, avx2::Load8(p.v_base, p.kv_dtype, elem + d));
        }
      }
      std::fill(keys.data() + tile_rows * hd, keys.data() + (tile_rows + 8) * hd, 0.0f);
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t q_pos = p.start_position + t;
        const int64_t first = first_key(q_pos);
        const int64_t span = q_pos - first + 1;
        const int64_t padded = (span + 7) / 8 * 8;
        const float* q = p.q + (t * p.num_heads + static_cast<int64_t>(kvh) * group) * hd;
        // Rows past the span (later tokens of the tile, or padding) only feed masked lanes.
        const float* kf = keys.data() + (first - tile_first) * hd;
        const float* vf = values.data() + (first - tile_first) * hd;
        // Scores, 8 positions at a time per head (same summation tree for every position).
        for (int j = 0; j < group; ++j) {
          const float* qj = q + static_cast<int64_t>(j) * hd;
          float* sj = scores.data() + j * padded;
          for (int64_t i = 0; i < padded; i += 8) {
            __m256 acc[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_ps();
            for (int d = 0; d < hd; d += 8) {
              const __m256 qv = _mm256_loadu_ps(qj + d);
#pragma GCC unroll 8
              for (int r = 0; r < 8; ++r) {
                acc[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kf + (i + r) * hd + d), acc[r]);
              }
            }
            const __m256 dot = avx2::RoundTo(rt, avx2::Hsum8x8(acc));
            _mm256_storeu_ps(sj + i, avx2::RoundTo(rt, _mm256_mul_ps(dot, vscale)));
          }
        }
        // Softmax in f32 per head; probabilities rounded to the activation type. Pad lanes get 0.
        for (int j = 0; j < group; ++j) {
          float* s = scores.data() + j * padded;
          float max_score = -std::numeric_limits<float>::infinity();
          for (int64_t i = 0; i < span; ++i) max_score = std::max(max_score, s[i]);
          const __m256 vmax = _mm256_set1_ps(max_score);
          __m256 vsum = _mm256_setzero_ps();
          for (int64_t i = 0; i < padded; i += 8) {
            __m256 e = avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmax));
            if (i + 8 > span) {
              const __m256 idx = _mm256_add_ps(_mm256_set1_ps(static_cast<float>(i)),
                                               _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7));
              e = _mm256_and_ps(
                  e, _mm256_cmp_ps(idx, _mm256_set1_ps(static_cast<float>(span)), _CMP_LT_OQ));
            }
            _mm256_storeu_ps(s + i, e);
            vsum = _mm256_add_ps(vsum, e);
          }
          const __m256 vs = _mm256_set1_ps(avx2::Hsum(vsum));
          for (int64_t i = 0; i < padded; i += 8) {
            _mm256_storeu_ps(s + i, avx2::RoundTo(rt, _mm256_div_ps(_mm256_loadu_ps(s + i), vs)));
          }
        }
        // Heads beyond the group (padding to a multiple of 4) get zero probabilities.
        std::fill(scores.data() + group * padded, scores.data() + group4 * padded, 0.0f);
        // Output: 4 heads x 8 dims accumulate in registers over the span, in position order.
        float* out = p.out + (t * p.num_heads + static_cast<int64_t>(kvh) * group) * hd;
        for (int j0 = 0; j0 < group; j0 += 4) {
          const float* s0 = scores.data() + j0 * padded;
          const float* s1 = s0 + padded;
          const float* s2 = s1 + padded;
          const float* s3 = s2 + padded;
          for (int d = 0; d < hd; d += 8) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i < span; ++i) {
              const __m256 v = _mm256_loadu_ps(vf + i * hd + d);
              a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(s0 + i), v, a0);
              a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(s1 + i), v, a1);
              a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(s2 + i), v, a2);
              a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(s3 + i), v, a3);
            }
            const __m256 acc[4] = {a0, a1, a2, a3};
            for (int j = 0; j < std::min(4, group - j0); ++j) {
              _mm256_storeu_ps(out + static_cast<int64_t>(j0 + j) * hd + d,
                               avx2::RoundTo(rt, acc[j]));
            }
          }
        }
      }
    }
  };
}

#endif  // defined(__x86_64__)

// Runs every sequence's tasks in one parallel region.
void AttentionBatch(const PagedAttentionParams* ps, int count, ThreadPool* pool, CpuIsa isa) {
#if defined(__x86_64__)
  bool vector = IsaAtLeast(isa, CpuIsa::kAvx2);
  for (int i = 0; i < count; ++i) vector = vector && ps[i].head_dim % 8 == 0;
  if (vector) {
    // Each sequence on tiles when it can, else on bf16 dot products when it can, else AVX2 (the
    // choice depends on the sequence alone).
    enum Path : char { kOnAvx2, kOnTiles, kOnAvx512 };
    thread_local std::vector<int64_t> first_task;
    thread_local std::vector<char> paths;
    first_task.assign(count + 1, 0);
    paths.assign(count, kOnAvx2);
    for (int i = 0; i < count; ++i) {
      int64_t tasks = 0;
      if (isa == CpuIsa::kAmx && AttentionAmxSupports(ps[i])) {
        paths[i] = kOnTiles;
        tasks = AttentionAmxNumTasks(ps[i]);
      } else if (IsaAtLeast(isa, CpuIsa::kAvx512Bf16) && AttentionAvx512Supports(ps[i])) {
        paths[i] = kOnAvx512;
        tasks = AttentionAvx512NumTasks(ps[i]);
      } else {
        tasks = NumTasks(ps[i]);
      }
      first_task[i + 1] = first_task[i] + tasks;
    }
    const int64_t* starts = first_task.data();
    const char* on = paths.data();
    auto work = [&](int64_t begin, int64_t end) {
      int i = static_cast<int>(std::upper_bound(starts, starts + count + 1, begin) - starts) - 1;
      for (; i < count && begin < end; ++i) {
        const int64_t stop = std::min(end, starts[i + 1]);
        if (stop > begin) {
          if (on[i] == kOnTiles) {
            AttentionTasksAmx(ps[i], begin - starts[i], stop - starts[i]);
          } else if (on[i] == kOnAvx512) {
            AttentionTasksAvx512(ps[i], begin - starts[i], stop - starts[i]);
          } else {
            AttentionTasksAvx2(ps[i], begin - starts[i], stop - starts[i]);
          }
        }
        begin = std::max(begin, stop);
      }
    };
    if (pool != nullptr) {
      pool->ParallelFor(first_task[count], 1, work);
    } else {
      work(0, first_task[count]);
    }
    return;
  }
#endif
  for (int i = 0; i < count; ++i) PagedAttentionCpuReference(ps[i], pool);
}

}  // namespace

void PagedAttentionCpuWithIsa(const PagedAttentionParams& p, ThreadPool* pool, CpuIsa isa) {
  AttentionBatch(&p, 1, pool, isa);
}

void PagedAttentionBatchCpu(const PagedAttentionParams* params, int count, ThreadPool* pool) {
  AttentionBatch(params, count, pool, BestCpuIsa());
}

void PagedAttentionCpu(const PagedAttentionParams& p, ThreadPool* pool) {
  PagedAttentionCpuWithIsa(p, pool, BestCpuIsa());
}

void PagedAttentionCpuReference(const PagedAttentionParams& p, ThreadPool* pool) {
  const int group = p.num_heads / p.num_kv_heads;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * p.head_dim;
  const int64_t total = p.start_position + p.num_tokens;
  // One task per (token, head).
  auto work = [&](int64_t begin, int64_t end) {
    std::vector<float> scores(total);
    std::vector<float> kv_row(p.head_dim);
    std::vector<float> acc(p.head_dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / p.num_heads;
      const int h = static_cast<int>(task % p.num_heads);
      const int kvh = h / group;
      const int64_t q_pos = p.start_position + t;
      const int64_t first =
          p.sliding_window > 0 ? std::max<int64_t>(0, q_pos - p.sliding_window + 1) : 0;
      const float* q = p.q + (t * p.num_heads + h) * p.head_dim;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t pos = first; pos <= q_pos; ++pos) {
        const int64_t block = p.block_table[pos / p.block_size];
        const int64_t elem =
            block * p.block_stride + (pos % p.block_size) * slot_stride + kvh * p.head_dim;
        float dot = 0.0f;
        for (int d = 0; d < p.head_dim; ++d)
          dot += q[d] * LoadAsF32(p.k_base, p.kv_dtype, elem + d);
        const float s = RoundTo(p.round_to, RoundTo(p.round_to, dot) * p.scale);
        scores[pos] = s;
        max_score = std::max(max_score, s);
      }
      float sum = 0.0f;
      for (int64_t pos = first; pos <= q_pos; ++pos) {
        scores[pos] = std::exp(scores[pos] - max_score);
        sum += scores[pos];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t pos = first; pos <= q_pos; ++pos) {
        const float prob = RoundTo(p.round_to, scores[pos] / sum);
        const int64_t block = p.block_table[pos / p.block_size];
        const int64_t elem =
            block * p.block_stride + (pos % p.block_size) * slot_stride + kvh * p.head_dim;
        for (int d = 0; d < p.head_dim; ++d)
          acc[d] += prob * LoadAsF32(p.v_base, p.kv_dtype, elem + d);
      }
      float* out = p.out + (t * p.num_heads + h) * p.head_dim;
      for (int d = 0; d < p.head_dim; ++d) out[d] = RoundTo(p.round_to, acc[d]);
    }
  };
  const int64_t tasks = p.num_tokens * p.num_heads;
  if (pool != nullptr) {
    pool->ParallelFor(tasks, 1, work);
  } else {
    work(0, tasks);
  }
}

}  // namespace deepinfer::kernels
