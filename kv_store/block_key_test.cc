#include "kv_store/block_key.h"

#include <set>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

KvNamespace BaseNamespace() {
  KvNamespace ns;
  ns.model_id = "m";
  ns.model_revision = "rev";
  ns.kv_dtype = "bf16";
  ns.kv_layout = "paged";
  ns.block_size = 2;
  ns.cache_salt = "tenant-a";
  return ns;
}

TEST(BlockKeyTest, SameInputsGiveTheSameKey) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  auto a = PrefixKeys(BaseNamespace(), tokens);
  auto b = PrefixKeys(BaseNamespace(), tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 2u);  // the partial third block has no key
  EXPECT_EQ(*a, *b);
  EXPECT_EQ((*a)[0], ChainKey(RootKey(BaseNamespace()), {1, 2}));
  EXPECT_EQ((*a)[1], ChainKey((*a)[0], {3, 4}));
}

TEST(BlockKeyTest, EveryNamespaceFieldChangesTheKey) {
  const std::vector<int32_t> tokens = {7, 8};
  std::vector<KvNamespace> variants(7, BaseNamespace());
  variants[1].model_id = "m2";
  variants[2].model_revision = "rev2";
  variants[3].kv_dtype = "fp8";
  variants[4].kv_layout = "paged2";
  variants[5].block_size = 3;
  variants[6].cache_salt = "tenant-b";
  std::set<KvBlockKey> keys;
  for (const KvNamespace& ns : variants) {
    // Block size 3 would leave no full block, so key the block directly.
    keys.insert(ChainKey(RootKey(ns), tokens));
  }
  EXPECT_EQ(keys.size(), variants.size());
  // The salt changes the chain root but not the model digest stored in objects.
  EXPECT_EQ(ModelDigest(variants[0]), ModelDigest(variants[6]));
  EXPECT_NE(ModelDigest(variants[0]), ModelDigest(variants[1]));
}

TEST(BlockKeyTest, ParentTokensAndExtraKeysChangeTheKey) {
  const KvBlockKey root = RootKey(BaseNamespace());
  const KvBlockKey other_parent = ChainKey(root, {9, 9});
  std::set<KvBlockKey> keys = {
      ChainKey(root, {1, 2}),
      ChainKey(other_parent, {1, 2}),
      ChainKey(root, {2, 1}),
      ChainKey(root, {1, 2, 3}),
      ChainKey(root, {1, 2}, {"image-a"}),
      ChainKey(root, {1, 2}, {"image-b"}),
      ChainKey(root, {1, 2}, {"image-a", "image-b"}),
      // Length prefixes: splitting the same bytes differently is a different key.
      ChainKey(root, {1, 2}, {"ab", "c"}),
      ChainKey(root, {1, 2}, {"a", "bc"}),
  };
  EXPECT_EQ(keys.size(), 9u);
}

TEST(BlockKeyTest, ExtraKeysPerBlockMustMatchTheBlocks) {
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  const std::vector<std::vector<std::string>> one = {{"img"}};
  EXPECT_EQ(PrefixKeys(BaseNamespace(), tokens, one).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<std::vector<std::string>> two = {{"img"}, {}};
  auto keys = PrefixKeys(BaseNamespace(), tokens, two);
  ASSERT_TRUE(keys.ok());
  EXPECT_NE((*keys)[0], (*PrefixKeys(BaseNamespace(), tokens))[0]);
  KvNamespace zero = BaseNamespace();
  zero.block_size = 0;
  EXPECT_EQ(PrefixKeys(zero, tokens).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockKeyTest, HexRoundTrips) {
  const KvBlockKey key = RootKey(BaseNamespace());
  const std::string hex = key.Hex();
  EXPECT_EQ(hex.size(), 64u);
  auto back = KvBlockKey::FromHex(hex);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, key);
  EXPECT_FALSE(KvBlockKey::FromHex("abc").ok());
  EXPECT_FALSE(KvBlockKey::FromHex(std::string(64, 'g')).ok());
}

}  // namespace
}  // namespace deepinfer
