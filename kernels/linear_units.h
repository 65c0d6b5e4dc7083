// The driver the optimised paths of LinearCpuMulti (kernels/linear_cpu.h) share: each
// projection's activations are packed once (and shared by projections with the same input), and
// the projections' output rows are handed to the pool in units of kLinearUnitRows, so one parallel
// region covers them all.
//
// Thread-safety: as the paths (thread-compatible).
#ifndef DEEPINFER_KERNELS_LINEAR_UNITS_H_
#define DEEPINFER_KERNELS_LINEAR_UNITS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/linear_cpu.h"
#include "kernels/thread_pool.h"

namespace deepinfer::kernels {

// Output rows per unit: a multiple of every path's tiles (AVX2 and AVX-512 BF16: 4 rows; AMX: 16).
inline constexpr int64_t kLinearUnitRows = 16;

// Units [begin(i), begin(i + 1)) are projection i's.
class LinearUnits {
 public:
  LinearUnits(const LinearParams* params, int count) : params_(params), begin_(count + 1, 0) {
    for (int i = 0; i < count; ++i) {
      begin_[i + 1] = begin_[i] + (params[i].n + kLinearUnitRows - 1) / kLinearUnitRows;
    }
  }
  int64_t total() const { return begin_.back(); }
  // fn(i, row_begin, row_end) for every projection's output rows within units [u_begin, u_end).
  template <typename Fn>
  void ForRows(int64_t u_begin, int64_t u_end, Fn&& fn) const {
    const int count = static_cast<int>(begin_.size()) - 1;
    for (int i = 0; i < count && u_begin < u_end; ++i) {
      if (u_begin >= begin_[i + 1]) continue;
      const int64_t first = u_begin - begin_[i];
      const int64_t last = std::min(u_end, begin_[i + 1]) - begin_[i];
      fn(i, first * kLinearUnitRows, std::min(params_[i].n, last * kLinearUnitRows));
      u_begin = begin_[i] + last;
    }
  }

 private:
  const LinearParams* params_;
  std::vector<int64_t> begin_;
};

// pack(i) -> Packed: projection i's packed activations (called once per distinct x, m, k and
// weight type); chunk(packed, units, u_begin, u_end): runs a range of units on one thread.
template <typename Packed, typename Pack, typename Chunk>
void RunLinearUnits(const LinearParams* params, int count, ThreadPool* pool, Pack&& pack,
                    Chunk&& chunk) {
  std::vector<Packed> packed(count);
  int64_t work_per_unit = 0;
  for (int i = 0; i < count; ++i) {
    bool shared = false;
    for (int j = 0; j < i && !shared; ++j) {
      if (params[j].x == params[i].x && params[j].k == params[i].k && params[j].m == params[i].m &&
          params[j].weight_dtype == params[i].weight_dtype) {
        packed[i] = packed[j];
        shared = true;
      }
    }
    if (!shared) packed[i] = pack(i);
    work_per_unit = std::max(work_per_unit, params[i].m * params[i].k * kLinearUnitRows);
  }
  const LinearUnits units(params, count);
  auto work = [&](int64_t u_begin, int64_t u_end) {
    chunk(static_cast<const Packed*>(packed.data()), units, u_begin, u_end);
  };
  // Below ~32k multiply-adds per chunk the hand-off costs more than it saves.
  const int64_t min_chunk = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, work_per_unit));
  if (pool != nullptr) {
    pool->ParallelFor(units.total(), min_chunk, work);
  } else {
    work(0, units.total());
  }
}

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_LINEAR_UNITS_H_
