#include "vision_encoder/embedding_cache.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace deepinfer::vision_encoder {
namespace {

Embedding Make(int64_t rows, float value) {
  Embedding e;
  e.rows = rows;
  e.cols = 4;
  e.data.assign(static_cast<size_t>(rows * 4), value);
  return e;
}

TEST(EmbeddingCacheTest, SecondLookupHitsWithoutComputing) {
  EmbeddingCache cache(1 << 20);
  int computed = 0;
  auto compute = [&]() -> absl::StatusOr<Embedding> {
    ++computed;
    return Make(2, 1.5f);
  };
  auto first = cache.GetOrCompute("a", compute);
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->hit);
  auto second = cache.GetOrCompute("a", compute);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->hit);
  EXPECT_EQ(computed, 1);
  EXPECT_EQ(second->embedding.get(), first->embedding.get());
  EXPECT_EQ(second->embedding->data[7], 1.5f);
  EmbeddingCache::Stats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.bytes, 2 * 4 * 4);
}

TEST(EmbeddingCacheTest, EvictsLeastRecentlyUsedByBytes) {
  // Room for exactly two 32-byte entries.
  EmbeddingCache cache(64);
  auto put = [&](const std::string& key) {
    return cache.GetOrCompute(key, [] { return absl::StatusOr<Embedding>(Make(2, 0)); });
  };
  ASSERT_TRUE(put("a").ok());
  ASSERT_TRUE(put("b").ok());
  ASSERT_NE(cache.Peek("a"), nullptr);  // a is now the most recent
  ASSERT_TRUE(put("c").ok());           // evicts b
  EXPECT_NE(cache.Peek("a"), nullptr);
  EXPECT_EQ(cache.Peek("b"), nullptr);
  EXPECT_NE(cache.Peek("c"), nullptr);
  EmbeddingCache::Stats s = cache.stats();
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.bytes, 64);
  EXPECT_EQ(s.entries, 2);
}

TEST(EmbeddingCacheTest, TooLargeOrDisabledIsReturnedButNotCached) {
  EmbeddingCache small(16);
  auto r = small.GetOrCompute("big", [] { return absl::StatusOr<Embedding>(Make(2, 3)); });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->embedding->data.size(), 8u);
  EXPECT_EQ(small.Peek("big"), nullptr);

  EmbeddingCache off(0);
  int computed = 0;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(off.GetOrCompute("k", [&] {
                     ++computed;
                     return absl::StatusOr<Embedding>(Make(1, 0));
                   }).ok());
  }
  EXPECT_EQ(computed, 2);
}

TEST(EmbeddingCacheTest, ErrorsAreReturnedAndNotCached) {
  EmbeddingCache cache(1 << 20);
  auto bad = cache.GetOrCompute(
      "x", [] { return absl::StatusOr<Embedding>(absl::InvalidArgumentError("not a PNG")); });
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "not a PNG");
  auto good = cache.GetOrCompute("x", [] { return absl::StatusOr<Embedding>(Make(1, 2)); });
  ASSERT_TRUE(good.ok());
  EXPECT_FALSE(good->hit);
}

TEST(EmbeddingCacheTest, ConcurrentLookupsComputeOnce) {
  EmbeddingCache cache(1 << 20);
  std::atomic<int> computed{0};
  absl::Notification release;
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = cache.GetOrCompute("same", [&]() -> absl::StatusOr<Embedding> {
        ++computed;
        release.WaitForNotification();
        return Make(3, 7);
      });
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(r->embedding->rows, 3);
      if (r->hit) ++hits;
    });
  }
  // Let every thread reach the cache before the computation finishes.
  absl::SleepFor(absl::Milliseconds(100));
  release.Notify();
  for (auto& t : threads) t.join();
  EXPECT_EQ(computed.load(), 1);
  EXPECT_EQ(hits.load(), 7);
}

}  // namespace
}  // namespace deepinfer::vision_encoder
