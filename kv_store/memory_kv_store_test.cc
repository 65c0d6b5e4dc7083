#include "kv_store/memory_kv_store.h"

#include "gtest/gtest.h"
#include "kv_store/kv_store_contract.h"
#include "kv_store/testing/test_blocks.h"

namespace deepinfer::kv_store_testing {
namespace {

class MemoryEnv : public KvStoreContractEnv {
 public:
  absl::StatusOr<std::unique_ptr<KvStore>> Open(const KvStoreConfig& config) override {
    absl::StatusOr<std::unique_ptr<MemoryKvStore>> store = MemoryKvStore::Create(config);
    if (!store.ok()) return store.status();
    return std::unique_ptr<KvStore>(*std::move(store));
  }
  absl::Status FlipBit(KvStore& store, const KvBlockKey& key, uint64_t offset) override {
    return static_cast<MemoryKvStore&>(store).FlipBitForTesting(key, offset);
  }
  uint64_t MeasuredBytes(KvStore& store) override { return store.stats().bytes_held; }
  void AbandonReservation(KvStore& store, const KvStoreConfig& config,
                          const KvBlockKey& key) override {
    auto writer = store.Reserve(key, absl::InfiniteFuture());
    ASSERT_TRUE(writer.ok()) << writer.status();
    const std::vector<uint8_t> payload = TestPayload(key, 1);
    ASSERT_TRUE((*writer)
                    ->WriteLayers(
                        0, 2, absl::MakeConstSpan(payload).first(2 * config.layout.bytes_per_layer))
                    .ok());
    // The in-process equivalent of a writer that died: never committed, and not destroyed
    // (which would release the reservation) before the test ends.
    abandoned_.push_back(*std::move(writer));
  }
  void RunWriters(KvStore& store, const KvStoreConfig&,
                  const std::vector<WriterJob>& jobs) override {
    RunWritersInThreads(store, jobs);
  }

 private:
  std::vector<std::unique_ptr<KvBlockWriter>> abandoned_;
};

std::unique_ptr<KvStoreContractEnv> MakeMemoryEnv() { return std::make_unique<MemoryEnv>(); }

INSTANTIATE_TEST_SUITE_P(Memory, KvStoreContractTest,
                         testing::Values(KvStoreContractParam{"memory", &MakeMemoryEnv}),
                         KvStoreContractParamName);

TEST(MemoryKvStoreTest, RejectsBadConfigs) {
  KvStoreConfig config = TestConfig(1 << 20);
  EXPECT_TRUE(MemoryKvStore::Create(config).ok());
  KvStoreConfig no_layers = config;
  no_layers.layout.num_layers = 0;
  EXPECT_EQ(MemoryKvStore::Create(no_layers).status().code(), absl::StatusCode::kInvalidArgument);
  KvStoreConfig inverted = config;
  inverted.low_watermark = 0.9;
  inverted.high_watermark = 0.5;
  EXPECT_EQ(MemoryKvStore::Create(inverted).status().code(), absl::StatusCode::kInvalidArgument);
  KvStoreConfig tiny = config;
  tiny.capacity_bytes = 4096;
  EXPECT_EQ(MemoryKvStore::Create(tiny).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryKvStoreTest, PinnedObjectsAreNotEvictedAndAFullPinnedStoreRefusesWrites) {
  KvStoreConfig config = TestConfig(0);
  config.capacity_bytes = 4 * (4096 + config.layout.payload_bytes());
  config.high_watermark = 0.5;  // 2 objects
  config.low_watermark = 0.5;
  auto store = MemoryKvStore::Create(config);
  ASSERT_TRUE(store.ok());
  const absl::Time never = absl::InfiniteFuture();
  for (uint64_t i : {0, 1}) {
    ASSERT_TRUE((*store)->Write(TestKey(i), TestPayload(TestKey(i), 1), never).ok());
  }
  auto r0 = (*store)->OpenForRead(TestKey(0), never);
  auto r1 = (*store)->OpenForRead(TestKey(1), never);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ((*store)->Reserve(TestKey(2), never).status().code(),
            absl::StatusCode::kResourceExhausted);
  r0->reset();
  EXPECT_TRUE((*store)->Write(TestKey(2), TestPayload(TestKey(2), 1), never).ok());
  std::vector<uint8_t> out(config.layout.payload_bytes());
  ASSERT_TRUE((*r1)->ReadAll(absl::MakeSpan(out), never).ok());
  EXPECT_EQ(out, TestPayload(TestKey(1), 1));
  EXPECT_EQ(*(*store)->Lookup({TestKey(0)}, never), 0u);
}

TEST(MemoryKvStoreTest, CommitAfterTheReservationWasReclaimedIsAborted) {
  FakeClock clock;
  KvStoreConfig config = TestConfig(1 << 20);
  config.clock = clock.AsFunction();
  auto store = MemoryKvStore::Create(config);
  ASSERT_TRUE(store.ok());
  auto writer = (*store)->Reserve(TestKey(1), absl::InfiniteFuture());
  ASSERT_TRUE(writer.ok());
  clock.Advance(config.reservation_timeout + absl::Seconds(1));
  ASSERT_TRUE((*store)->Collect(absl::InfiniteFuture()).ok());
  EXPECT_EQ((*writer)->WriteLayers(0, 4, TestPayload(TestKey(1), 1)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ((*store)->stats().bytes_held, 0);
}

}  // namespace
}  // namespace deepinfer::kv_store_testing
