#include "kernels/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace deepinfer::kernels {

void PagedAttentionCpu(const PagedAttentionParams& p, ThreadPool* pool) {
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
