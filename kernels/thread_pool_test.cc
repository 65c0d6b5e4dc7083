#include "kernels/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer::kernels {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    auto pool = ThreadPool::Create(threads);
    EXPECT_EQ(pool->num_threads(), threads);
    for (int64_t n : {0, 1, 7, 1000, 12345}) {
      std::vector<std::atomic<int>> hits(n);
      pool->ParallelFor(n, 3, [&](int64_t b, int64_t e) {
        EXPECT_LE(b, e);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPoolTest, ManyJobsInARowAndNestedCallsRunInline) {
  auto pool = ThreadPool::Create(3);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 500; ++job) {
    pool->ParallelFor(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        pool->ParallelFor(2, 1, [&](int64_t b2, int64_t e2) { sum += (e2 - b2); });
      }
    });
  }
  EXPECT_EQ(sum.load(), 500 * 64 * 2);
}

TEST(ThreadPoolTest, DefaultUsesTheMachine) {
  auto pool = ThreadPool::Create(0);
  EXPECT_GE(pool->num_threads(), 1);
}

}  // namespace
}  // namespace deepinfer::kernels
