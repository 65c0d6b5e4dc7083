#include "engine/block_manager.h"

#include <map>
#include <random>

#include "engine/block_hash.h"
#include "gtest/gtest.h"

namespace deepinfer::engine {
namespace {

std::vector<int32_t> Tokens(int n, int32_t start = 0) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = start + i;
  return t;
}

// Commits every full block of `tokens` for `seq` (as the engine does once their KV is computed).
void CommitAll(BlockManager& bm, uint64_t seq, const std::vector<uint64_t>& hashes) {
  uint64_t parent = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    ASSERT_TRUE(bm.Commit(seq, i, hashes[i], parent).ok());
    parent = hashes[i];
  }
}

TEST(BlockHashTest, ChainDependsOnEverythingBefore) {
  const uint64_t root = RootBlockHash(1, "");
  const auto a = BlockHashes(root, Tokens(40), 16);
  ASSERT_EQ(a.size(), 2u);  // 40 tokens: two full blocks
  std::vector<int32_t> changed = Tokens(40);
  changed[3] = 999;  // inside block 0: changes both hashes
  const auto b = BlockHashes(root, changed, 16);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  changed = Tokens(40);
  changed[20] = 999;  // inside block 1 only
  const auto c = BlockHashes(root, changed, 16);
  EXPECT_EQ(a[0], c[0]);
  EXPECT_NE(a[1], c[1]);
  // Salt and seed separate tenants.
  EXPECT_NE(BlockHashes(RootBlockHash(1, "tenant-a"), Tokens(16), 16)[0], a[0]);
  EXPECT_NE(BlockHashes(RootBlockHash(2, ""), Tokens(16), 16)[0], a[0]);
  // Extra keys (image hashes) matter.
  const uint64_t img = 42;
  EXPECT_NE(BlockHash(root, Tokens(16).data(), 16, &img, 1), a[0]);
  // Stable across builds and machines (the router relies on it).
  EXPECT_EQ(a[0], BlockHashes(RootBlockHash(1, ""), Tokens(40), 16)[0]);
}

TEST(BlockHashTest, ImagesChangeTheBlocksTheyOverlapAndEverythingAfter) {
  const uint64_t root = RootBlockHash(1, "");
  const std::vector<int32_t> tokens = Tokens(64);
  // No images: the plain chain.
  EXPECT_EQ(PromptBlockHashes(root, tokens, {}, 16), BlockHashes(root, tokens, 16));
  const std::string cat(32, 'c'), dog(32, 'd');
  // An image run over positions [20, 40): blocks 1 and 2.
  const auto with_cat = PromptBlockHashes(root, tokens, {{cat, 20, 20}}, 16);
  const auto plain = BlockHashes(root, tokens, 16);
  ASSERT_EQ(with_cat.size(), 4u);
  EXPECT_EQ(with_cat[0], plain[0]);
  for (int b = 1; b < 4; ++b) EXPECT_NE(with_cat[b], plain[b]) << b;
  // Same tokens, another image: equal before the image's first block only.
  const auto with_dog = PromptBlockHashes(root, tokens, {{dog, 20, 20}}, 16);
  EXPECT_EQ(with_dog[0], with_cat[0]);
  for (int b = 1; b < 4; ++b) EXPECT_NE(with_dog[b], with_cat[b]) << b;
  // Same image: same hashes (a cache hit); the same image elsewhere: different.
  EXPECT_EQ(PromptBlockHashes(root, tokens, {{cat, 20, 20}}, 16), with_cat);
  EXPECT_NE(PromptBlockHashes(root, tokens, {{cat, 21, 19}}, 16)[1], with_cat[1]);
  // Two images in one block keep their order.
  const auto both = PromptBlockHashes(root, tokens, {{cat, 2, 4}, {dog, 8, 4}}, 16);
  const auto swapped = PromptBlockHashes(root, tokens, {{dog, 2, 4}, {cat, 8, 4}}, 16);
  EXPECT_NE(both[0], swapped[0]);
  // The extra keys are exactly (fold, offset, length) per overlapping image: block 3 of a run
  // that ended in block 2 has none, so it differs only through its parent.
  EXPECT_EQ(with_cat[3], BlockHash(with_cat[2], tokens.data() + 48, 16));
  // A trailing partial block has no hash; block_size < 1 gives none.
  EXPECT_EQ(PromptBlockHashes(root, Tokens(70), {{cat, 64, 6}}, 16).size(), 4u);
  EXPECT_TRUE(PromptBlockHashes(root, tokens, {}, 0).empty());
}

TEST(BlockManagerTest, SharesCommittedPrefixAndCountsHits) {
  BlockManager bm(10, 4);
  const uint64_t root = RootBlockHash(0, "");
  const auto prompt = Tokens(10);  // 2 full blocks + 2 tokens
  const auto hashes = BlockHashes(root, prompt, 4);
  EXPECT_EQ(bm.AllocateSequence(1, 10, hashes).value(), 0);
  CommitAll(bm, 1, hashes);
  auto events = bm.DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].parent_hash, hashes[0]);
  // Same prompt: both full blocks shared.
  EXPECT_EQ(bm.AllocateSequence(2, 10, hashes).value(), 8);
  EXPECT_EQ((*bm.Table(1))[0], (*bm.Table(2))[0]);
  EXPECT_EQ((*bm.Table(1))[1], (*bm.Table(2))[1]);
  EXPECT_NE((*bm.Table(1))[2], (*bm.Table(2))[2]);
  // A prompt of exactly 8 tokens reuses only the first block: the last token must be computed.
  std::vector<uint64_t> eight(hashes.begin(), hashes.begin() + 2);
  EXPECT_EQ(bm.AllocateSequence(3, 8, eight).value(), 4);
  EXPECT_TRUE(bm.CheckInvariants().ok());
  EXPECT_EQ(bm.stats().used_blocks, 5);
}

TEST(BlockManagerTest, FreedCommittedBlocksStayCachedUntilEvictedLru) {
  BlockManager bm(4, 2);
  const uint64_t root = RootBlockHash(0, "");
  const auto ha = BlockHashes(root, Tokens(4, 100), 2);
  const auto hb = BlockHashes(root, Tokens(4, 200), 2);
  ASSERT_TRUE(bm.AllocateSequence(1, 4, ha).ok());
  CommitAll(bm, 1, ha);
  ASSERT_TRUE(bm.Free(1).ok());
  EXPECT_EQ(bm.stats().cached_blocks, 2);
  EXPECT_EQ(bm.CountCachedPrefix(ha), 2);
  ASSERT_TRUE(bm.AllocateSequence(2, 4, hb).ok());  // uses the 2 free blocks
  CommitAll(bm, 2, hb);
  ASSERT_TRUE(bm.Free(2).ok());
  bm.DrainEvents();
  // Needs 2 blocks, none free: evicts seq 1's blocks (least recently used), tail first.
  ASSERT_TRUE(bm.AllocateSequence(3, 3, {}).ok());
  auto events = bm.DrainEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].block_hash, ha[1]);  // tail before head
  EXPECT_EQ(bm.CountCachedPrefix(ha), 0);
  EXPECT_EQ(bm.CountCachedPrefix(hb), 2);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, ExhaustionChangesNothing) {
  BlockManager bm(3, 4);
  ASSERT_TRUE(bm.AllocateSequence(1, 8, {}).ok());
  auto r = bm.AllocateSequence(2, 8, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.Table(2), nullptr);
  EXPECT_EQ(bm.Grow(1, 16).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.Table(1)->size(), 2u);
  EXPECT_TRUE(bm.Grow(1, 12).ok());
  EXPECT_EQ(bm.stats().free_blocks, 0);
  EXPECT_EQ(bm.AllocateSequence(1, 1, {}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(bm.Free(9).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, ReleasePrefixLeavesHolesAndKeepsCommittedBlocksCached) {
  BlockManager bm(8, 2);
  const uint64_t root = RootBlockHash(0, "");
  const auto hashes = BlockHashes(root, Tokens(8), 2);
  ASSERT_TRUE(bm.AllocateSequence(1, 8, hashes).ok());
  CommitAll(bm, 1, std::vector<uint64_t>(hashes.begin(), hashes.begin() + 2));
  EXPECT_EQ(bm.ReleasePrefix(1, 3).value(), 3);
  EXPECT_EQ(*bm.Table(1), (std::vector<int32_t>{-1, -1, -1, (*bm.Table(1))[3]}));
  EXPECT_EQ(bm.ReleasePrefix(1, 3).value(), 0);  // idempotent
  EXPECT_EQ(bm.ReleasePrefix(1, 4).value(), 1);
  const BlockManagerStats s = bm.stats();
  EXPECT_EQ(s.cached_blocks, 2);  // the two committed blocks stay reusable
  EXPECT_EQ(s.free_blocks, 6);
  EXPECT_TRUE(bm.Commit(1, 0, 123, 0).ok());  // commit into a hole: no-op
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  ASSERT_TRUE(bm.Free(1).ok());
  EXPECT_TRUE(bm.CheckInvariants().ok());
  EXPECT_EQ(bm.stats().used_blocks, 0);
}

TEST(BlockManagerTest, TruncateReleasesTrailingBlocksToTheFreeList) {
  BlockManager bm(8, 4);
  ASSERT_TRUE(bm.AllocateSequence(1, 5, {}).ok());
  ASSERT_TRUE(bm.Grow(1, 17).ok());  // 5 blocks: speculative positions up to 17
  EXPECT_EQ(bm.Table(1)->size(), 5u);
  EXPECT_EQ(bm.Truncate(1, 9).value(), 2);  // 9 tokens need 3 blocks
  EXPECT_EQ(bm.Table(1)->size(), 3u);
  EXPECT_EQ(bm.Truncate(1, 9).value(), 0);  // idempotent
  EXPECT_EQ(bm.Truncate(1, 12).value(), 0);
  EXPECT_EQ(bm.stats().free_blocks, 5);
  EXPECT_EQ(bm.stats().cached_blocks, 0);
  EXPECT_EQ(bm.Truncate(7, 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  ASSERT_TRUE(bm.Free(1).ok());
  EXPECT_EQ(bm.stats().used_blocks, 0);
}

TEST(BlockManagerTest, RandomizedLoadLeavesEverythingFreeOrCached) {
  std::mt19937 rng(2024);
  const int block_size = 4;
  BlockManager bm(200, block_size);
  const uint64_t root = RootBlockHash(7, "");
  // A few shared prefixes, like agents resending a context.
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 5; ++p) prefixes.push_back(Tokens(4 + rng() % 40, 1000 * p));
  std::map<uint64_t, std::vector<int32_t>> live;
  uint64_t next_id = 1;
  int64_t exhausted = 0;
  for (int step = 0; step < 3000; ++step) {
    const int action = rng() % 10;
    if (action < 5) {
      std::vector<int32_t> prompt = prefixes[rng() % prefixes.size()];
      const int extra = rng() % 20;
      for (int i = 0; i < extra; ++i) prompt.push_back(rng() % 50);
      const auto hashes = BlockHashes(root, prompt, block_size);
      auto cached = bm.AllocateSequence(next_id, prompt.size(), hashes);
      if (!cached.ok()) {
        ASSERT_EQ(cached.status().code(), absl::StatusCode::kResourceExhausted);
        ++exhausted;
        continue;
      }
      ASSERT_EQ(*cached % block_size, 0);
      ASSERT_LT(*cached, static_cast<int64_t>(prompt.size()));
      // "Compute" and commit the prompt's full blocks.
      uint64_t parent = 0;
      for (size_t b = 0; b < hashes.size(); ++b) {
        ASSERT_TRUE(bm.Commit(next_id, b, hashes[b], parent).ok());
        parent = hashes[b];
      }
      live[next_id++] = prompt;
    } else if (action < 8 && !live.empty()) {
      // Decode a few tokens.
      auto it = std::next(live.begin(), rng() % live.size());
      const size_t grow = 1 + rng() % 6;
      absl::Status s = bm.Grow(it->first, it->second.size() + grow);
      if (s.ok()) {
        for (size_t i = 0; i < grow; ++i) it->second.push_back(rng() % 50);
      } else {
        ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
      }
    } else if (!live.empty()) {
      // Finish or abort.
      auto it = std::next(live.begin(), rng() % live.size());
      ASSERT_TRUE(bm.Free(it->first).ok());
      live.erase(it);
    }
    if (step % 100 == 0) {
      ASSERT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
    }
  }
  for (const auto& [id, tokens] : live) ASSERT_TRUE(bm.Free(id).ok());
  ASSERT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  const BlockManagerStats s = bm.stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.free_blocks + s.cached_blocks, 200);
  EXPECT_GT(s.prefix_hit_tokens, 0);
  EXPECT_GT(exhausted + s.evictions, 0);  // the pool was under pressure
  // Events: every stored hash not later removed is exactly the cached set.
  std::map<uint64_t, int> net;
  for (const KvEvent& e : bm.DrainEvents()) net[e.block_hash] += e.kind == KvEvent::Kind::kStored ? 1 : -1;
  int64_t stored = 0;
  for (const auto& [h, n] : net) {
    ASSERT_TRUE(n == 0 || n == 1) << h;
    stored += n;
  }
  EXPECT_EQ(stored, s.cached_blocks);
}

}  // namespace
}  // namespace deepinfer::engine
