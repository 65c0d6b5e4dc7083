#include "kernels/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/simd_avx2.h"

namespace deepinfer::kernels {
namespace {

#if defined(__x86_64__)

DI_AVX2 void PagedAttentionAvx2(const PagedAttentionParams& p, ThreadPool* pool) {
  const int group = p.num_heads / p.num_kv_heads;
  const int hd = p.head_dim;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * hd;
  const int64_t total = p.start_position + p.num_tokens;
  const DType rt = p.round_to;
  auto row_offset = [&](int64_t pos, int kvh) {
    const int64_t block = p.block_table[pos / p.block_size];
    return block * p.block_stride + (pos % p.block_size) * slot_stride +
           static_cast<int64_t>(kvh) * hd;
  };
  // One task per (token, KV head), serving the group's query heads.
  auto work = [&](int64_t begin, int64_t end) DI_AVX2 {
    thread_local std::vector<float> scores, row, acc;
    scores.resize(group * total);
    row.resize(hd);
    acc.resize(static_cast<size_t>(group) * hd);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / p.num_kv_heads;
      const int kvh = static_cast<int>(task % p.num_kv_heads);
      const int64_t q_pos = p.start_position + t;
      const int64_t first =
          p.sliding_window > 0 ? std::max<int64_t>(0, q_pos - p.sliding_window + 1) : 0;
      const int64_t span = q_pos - first + 1;
      const float* q = p.q + (t * p.num_heads + static_cast<int64_t>(kvh) * group) * hd;
      // Scores: K row widened once, dotted with every head of the group.
      for (int64_t pos = first; pos <= q_pos; ++pos) {
        const int64_t elem = row_offset(pos, kvh);
        const float* k;
        if (p.kv_dtype == DType::kF32) {
          k = static_cast<const float*>(p.k_base) + elem;
        } else {
          for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(row.data() + d, avx2::Load8(p.k_base, p.kv_dtype, elem + d));
          k = row.data();
        }
        for (int j = 0; j < group; ++j) {
          const float* qj = q + static_cast<int64_t>(j) * hd;
          __m256 dot = _mm256_mul_ps(_mm256_loadu_ps(qj), _mm256_loadu_ps(k));
          for (int d = 8; d < hd; d += 8) {
            dot = _mm256_fmadd_ps(_mm256_loadu_ps(qj + d), _mm256_loadu_ps(k + d), dot);
          }
          scores[j * span + (pos - first)] =
              kernels::RoundTo(rt, kernels::RoundTo(rt, avx2::Hsum(dot)) * p.scale);
        }
      }
      // Softmax in f32 per head; probabilities rounded to the activation type.
      for (int j = 0; j < group; ++j) {
        float* s = scores.data() + j * span;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < span; ++i) max_score = std::max(max_score, s[i]);
        const __m256 vmax = _mm256_set1_ps(max_score);
        __m256 vsum = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= span; i += 8) {
          const __m256 e = avx2::Exp(_mm256_sub_ps(_mm256_loadu_ps(s + i), vmax));
          _mm256_storeu_ps(s + i, e);
          vsum = _mm256_add_ps(vsum, e);
        }
        float sum = avx2::Hsum(vsum);
        for (; i < span; ++i) {
          s[i] = std::exp(s[i] - max_score);
          sum += s[i];
        }
        const __m256 vs = _mm256_set1_ps(sum);
        i = 0;
        for (; i + 8 <= span; i += 8) {
          _mm256_storeu_ps(s + i, avx2::RoundTo(rt, _mm256_div_ps(_mm256_loadu_ps(s + i), vs)));
        }
        for (; i < span; ++i) s[i] = kernels::RoundTo(rt, s[i] / sum);
      }
      // Output: V row widened once, accumulated into every head of the group.
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t pos = first; pos <= q_pos; ++pos) {
        const int64_t elem = row_offset(pos, kvh);
        const float* v;
        if (p.kv_dtype == DType::kF32) {
          v = static_cast<const float*>(p.v_base) + elem;
        } else {
          for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(row.data() + d, avx2::Load8(p.v_base, p.kv_dtype, elem + d));
          v = row.data();
        }
        for (int j = 0; j < group; ++j) {
          const __m256 prob = _mm256_set1_ps(scores[j * span + (pos - first)]);
          float* a = acc.data() + static_cast<int64_t>(j) * hd;
          for (int d = 0; d < hd; d += 8) {
            _mm256_storeu_ps(a + d, _mm256_fmadd_ps(prob, _mm256_loadu_ps(v + d), _mm256_loadu_ps(a + d)));
          }
        }
      }
      float* out = p.out + (t * p.num_heads + static_cast<int64_t>(kvh) * group) * hd;
      for (int64_t d = 0; d < static_cast<int64_t>(group) * hd; d += 8) {
        _mm256_storeu_ps(out + d, avx2::RoundTo(rt, _mm256_loadu_ps(acc.data() + d)));
      }
    }
  };
  const int64_t tasks = p.num_tokens * p.num_kv_heads;
  if (pool != nullptr) {
    pool->ParallelFor(tasks, 1, work);
  } else {
    work(0, tasks);
  }
}

#endif  // defined(__x86_64__)

}  // namespace

void PagedAttentionCpuWithIsa(const PagedAttentionParams& p, ThreadPool* pool, CpuIsa isa) {
#if defined(__x86_64__)
  if (isa == CpuIsa::kAvx2 && p.head_dim % 8 == 0) {
    PagedAttentionAvx2(p, pool);
    return;
  }
#endif
  PagedAttentionCpuReference(p, pool);
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
      const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, q_pos - p.sliding_window + 1)
                                                 : 0;
      const float* q = p.q + (t * p.num_heads + h) * p.head_dim;
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t pos = first; pos <= q_pos; ++pos) {
        const int64_t block = p.block_table[pos / p.block_size];
        const int64_t elem =
            block * p.block_stride + (pos % p.block_size) * slot_stride + kvh * p.head_dim;
        float dot = 0.0f;
        for (int d = 0; d < p.head_dim; ++d) dot += q[d] * LoadAsF32(p.k_base, p.kv_dtype, elem + d);
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
        for (int d = 0; d < p.head_dim; ++d) acc[d] += prob * LoadAsF32(p.v_base, p.kv_dtype, elem + d);
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
