#include "kv_store/kv_store_contract.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "kv_store/testing/test_blocks.h"

namespace deepinfer::kv_store_testing {
namespace {

constexpr absl::Time kNoDeadline = absl::InfiniteFuture();

std::vector<uint8_t> ReadAllOrEmpty(KvStore& store, const KvBlockKey& key) {
  std::vector<uint8_t> out(store.config().layout.payload_bytes());
  if (!store.Read(key, absl::MakeSpan(out), kNoDeadline).ok()) out.clear();
  return out;
}

uint64_t HeaderBytes(const KvStore& store) {
  return store.object_bytes() - store.config().layout.payload_bytes();
}

}  // namespace

std::string KvStoreContractParamName(const testing::TestParamInfo<KvStoreContractParam>& info) {
  return info.param.name;
}

void RunWritersInThreads(KvStore& store, const std::vector<WriterJob>& jobs) {
  std::vector<std::thread> threads;
  for (const WriterJob& job : jobs) {
    threads.emplace_back([&store, job] {
      for (uint64_t i = job.first_key; i < job.first_key + job.count; ++i) {
        const KvBlockKey key = TestKey(i);
        const absl::Status s = store.Write(key, TestPayload(key, job.writer_id), kNoDeadline);
        EXPECT_TRUE(s.ok() || absl::IsAlreadyExists(s) || absl::IsResourceExhausted(s)) << s;
        absl::SleepFor(job.pause);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

void KvStoreContractTest::SetUp() {
  // Near real time, so that backends mixing the fake clock with file times stay consistent.
  clock_.Advance(absl::Now() - clock_.Now());
  env_ = GetParam().make_env();
}

KvStoreConfig KvStoreContractTest::ConfigFor(uint64_t objects) {
  KvStoreConfig config = TestConfig(0);
  // Every backend shares the object format, so this is each one's object size.
  config.capacity_bytes = objects * (4096 + config.layout.payload_bytes());
  config.clock = clock_.AsFunction();
  return config;
}

KvStore* KvStoreContractTest::OpenStore(const KvStoreConfig& config) {
  absl::StatusOr<std::unique_ptr<KvStore>> store = env_->Open(config);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return nullptr;
  EXPECT_EQ((*store)->object_bytes(), 4096 + config.layout.payload_bytes());
  stores_.push_back(*std::move(store));
  return stores_.back().get();
}

TEST_P(KvStoreContractTest, WrittenBlockReadsBackWholeAndLayerByLayer) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(1);
  const std::vector<uint8_t> payload = TestPayload(key, 1);
  ASSERT_TRUE(store->Write(key, payload, kNoDeadline).ok());
  EXPECT_EQ(ReadAllOrEmpty(*store, key), payload);

  // Layers out of order, one at a time, through one reader.
  const KvBlockLayout layout = store->config().layout;
  auto reader = store->OpenForRead(key, kNoDeadline);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> out(layout.payload_bytes());
  for (uint32_t layer : {3u, 0u, 2u, 1u}) {
    ASSERT_TRUE((*reader)
                    ->ReadLayers(layer, 1,
                                 absl::MakeSpan(out).subspan(layer * layout.bytes_per_layer,
                                                             layout.bytes_per_layer),
                                 kNoDeadline)
                    .ok());
  }
  EXPECT_EQ(out, payload);
  // Two middle layers at once, through the store's convenience call.
  std::vector<uint8_t> middle(2 * layout.bytes_per_layer);
  ASSERT_TRUE(store->ReadLayers(key, 1, 2, absl::MakeSpan(middle), kNoDeadline).ok());
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), payload.begin() + layout.bytes_per_layer));

  const KvStoreStats stats = store->stats();
  EXPECT_EQ(stats.hits, 3);
  EXPECT_EQ(stats.misses, 0);
  EXPECT_EQ(stats.errors, 0);
  EXPECT_EQ(stats.commits, 1);
  EXPECT_EQ(stats.write_bytes, static_cast<int64_t>(layout.payload_bytes()));
  EXPECT_EQ(stats.read_bytes,
            static_cast<int64_t>(2 * layout.payload_bytes() + 2 * layout.bytes_per_layer));
  EXPECT_EQ(stats.bytes_held, static_cast<int64_t>(store->object_bytes()));
}

TEST_P(KvStoreContractTest, LookupReturnsTheLongestStoredPrefix) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  for (uint64_t i : {0, 1, 2, 4}) {
    ASSERT_TRUE(store->Write(TestKey(i), TestPayload(TestKey(i), 1), kNoDeadline).ok());
  }
  std::vector<KvBlockKey> keys;
  for (uint64_t i = 0; i < 6; ++i) keys.push_back(TestKey(i));
  EXPECT_EQ(*store->Lookup(keys, kNoDeadline), 3u);
  EXPECT_EQ(*store->Lookup(absl::MakeSpan(keys).subspan(3), kNoDeadline), 0u);
  EXPECT_EQ(*store->Lookup({}, kNoDeadline), 0u);
}

TEST_P(KvStoreContractTest, AbsentKeyIsAMiss) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->OpenForRead(TestKey(9), kNoDeadline).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->stats().misses, 1);
  EXPECT_EQ(store->stats().hits, 0);
}

TEST_P(KvStoreContractTest, SecondWriteOfACommittedKeyIsANoOp) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(1);
  ASSERT_TRUE(store->Write(key, TestPayload(key, 1), kNoDeadline).ok());
  EXPECT_EQ(store->Reserve(key, kNoDeadline).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Write(key, TestPayload(key, 2), kNoDeadline).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadAllOrEmpty(*store, key), TestPayload(key, 1));
  EXPECT_EQ(store->stats().bytes_held, static_cast<int64_t>(store->object_bytes()));
}

TEST_P(KvStoreContractTest, NothingIsVisibleBeforeCommit) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(1);
  const std::vector<uint8_t> payload = TestPayload(key, 1);
  auto writer = store->Reserve(key, kNoDeadline);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteLayers(0, 4, payload).ok());
  EXPECT_EQ(*store->Lookup({key}, kNoDeadline), 0u);
  EXPECT_EQ(store->OpenForRead(key, kNoDeadline).status().code(), absl::StatusCode::kNotFound);
  // Reserved bytes count against capacity.
  EXPECT_EQ(store->stats().bytes_held, static_cast<int64_t>(store->object_bytes()));
  ASSERT_TRUE((*writer)->Commit(kNoDeadline).ok());
  EXPECT_EQ(*store->Lookup({key}, kNoDeadline), 1u);
  EXPECT_EQ(ReadAllOrEmpty(*store, key), payload);
  EXPECT_EQ((*writer)->Commit(kNoDeadline).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(KvStoreContractTest, IncompleteOrAbandonedWriteReleasesItsReservation) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(1);
  const std::vector<uint8_t> payload = TestPayload(key, 1);
  {
    auto writer = store->Reserve(key, kNoDeadline);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->WriteLayers(1, 3, absl::MakeConstSpan(payload).subspan(1024)).ok());
    EXPECT_EQ((*writer)->Commit(kNoDeadline).code(), absl::StatusCode::kFailedPrecondition);
  }  // destroyed without a commit
  EXPECT_EQ(store->stats().bytes_held, 0);
  EXPECT_EQ(env_->MeasuredBytes(*store), 0u);
  EXPECT_EQ(*store->Lookup({key}, kNoDeadline), 0u);
  ASSERT_TRUE(store->Write(key, payload, kNoDeadline).ok());
  EXPECT_EQ(ReadAllOrEmpty(*store, key), payload);
}

TEST_P(KvStoreContractTest, FirstOfTwoRacingCommitsWins) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(1);
  auto a = store->Reserve(key, kNoDeadline);
  auto b = store->Reserve(key, kNoDeadline);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->WriteLayers(0, 4, TestPayload(key, 1)).ok());
  ASSERT_TRUE((*b)->WriteLayers(0, 4, TestPayload(key, 2)).ok());
  ASSERT_TRUE((*b)->Commit(kNoDeadline).ok());
  EXPECT_EQ((*a)->Commit(kNoDeadline).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadAllOrEmpty(*store, key), TestPayload(key, 2));
  EXPECT_EQ(store->stats().bytes_held, static_cast<int64_t>(store->object_bytes()));
  EXPECT_EQ(env_->MeasuredBytes(*store), store->object_bytes());
}

TEST_P(KvStoreContractTest, RejectsBadRangesSizesAndPassedDeadlines) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(1);
  ASSERT_TRUE(store->Write(key, TestPayload(key, 1), kNoDeadline).ok());
  auto reader = store->OpenForRead(key, kNoDeadline);
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> one(1024), two(2048);
  EXPECT_EQ((*reader)->ReadLayers(3, 2, absl::MakeSpan(two), kNoDeadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->ReadLayers(0, 1, absl::MakeSpan(two), kNoDeadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->ReadLayers(0, 0, absl::Span<uint8_t>(), kNoDeadline).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Time past = clock_.Now() - absl::Seconds(1);
  EXPECT_EQ((*reader)->ReadLayers(0, 1, absl::MakeSpan(one), past).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->OpenForRead(key, past).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->Reserve(TestKey(2), past).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(store->Lookup({key}, past).status().code(), absl::StatusCode::kDeadlineExceeded);
  auto writer = store->Reserve(TestKey(2), kNoDeadline);
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->WriteLayers(4, 1, one).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*writer)->WriteLayers(0, 1, two).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(KvStoreContractTest, FullStoreEvictsTheLeastRecentlyUsedInOneBatch) {
  // 10 objects' capacity: the high watermark (0.8) holds 8, eviction goes down to 5 (0.5).
  KvStore* store = OpenStore(ConfigFor(10));
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < 8; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(store->Write(TestKey(i), TestPayload(TestKey(i), 1), kNoDeadline).ok());
  }
  EXPECT_EQ(store->stats().evictions, 0);
  clock_.Advance(absl::Seconds(1));
  ASSERT_FALSE(ReadAllOrEmpty(*store, TestKey(0)).empty());  // 0 is now the most recent
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(store->Write(TestKey(8), TestPayload(TestKey(8), 1), kNoDeadline).ok());
  // 4 evicted so that 4 + the new one fit under the low watermark: 1, 2, 3, 4.
  EXPECT_EQ(store->stats().evictions, 4);
  for (uint64_t i = 0; i <= 8; ++i) {
    const bool expect_stored = i == 0 || i >= 5;
    EXPECT_EQ(*store->Lookup({TestKey(i)}, kNoDeadline), expect_stored ? 1u : 0u) << i;
  }
  EXPECT_EQ(store->stats().bytes_held, static_cast<int64_t>(5 * store->object_bytes()));
  EXPECT_EQ(env_->MeasuredBytes(*store), 5 * store->object_bytes());
}

TEST_P(KvStoreContractTest, WriterThatDiesBeforeCommitIsInvisibleAndReclaimed) {
  const KvStoreConfig config = ConfigFor(16);
  KvStore* store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Write(TestKey(0), TestPayload(TestKey(0), 1), kNoDeadline).ok());
  const int64_t held_before = store->stats().bytes_held;
  const uint64_t measured_before = env_->MeasuredBytes(*store);
  const KvBlockKey key = TestKey(1);

  env_->AbandonReservation(*store, config, key);
  EXPECT_EQ(*store->Lookup({key}, kNoDeadline), 0u);
  EXPECT_EQ(store->OpenForRead(key, kNoDeadline).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->stats().bytes_held, held_before + static_cast<int64_t>(store->object_bytes()));
  // Not yet old enough to be reclaimed.
  ASSERT_TRUE(store->Collect(kNoDeadline).ok());
  EXPECT_EQ(store->stats().bytes_held, held_before + static_cast<int64_t>(store->object_bytes()));

  clock_.Advance(config.reservation_timeout + absl::Seconds(1));
  ASSERT_TRUE(store->Collect(kNoDeadline).ok());
  EXPECT_EQ(store->stats().bytes_held, held_before);
  EXPECT_EQ(env_->MeasuredBytes(*store), measured_before);
  EXPECT_EQ(store->stats().reclaimed, 1);
  EXPECT_EQ(ReadAllOrEmpty(*store, TestKey(0)), TestPayload(TestKey(0), 1));
  // The key can be written again, whole.
  ASSERT_TRUE(store->Write(key, TestPayload(key, 2), kNoDeadline).ok());
  EXPECT_EQ(ReadAllOrEmpty(*store, key), TestPayload(key, 2));
}

TEST_P(KvStoreContractTest, ConcurrentWritersOfOneKeyLeaveOneIntactObject) {
  const KvStoreConfig config = ConfigFor(16);
  KvStore* store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(3);
  env_->RunWriters(*store, config, {{3, 1, 1}, {3, 1, 2}, {3, 1, 3}, {3, 1, 4}});
  const std::vector<uint8_t> stored = ReadAllOrEmpty(*store, key);
  bool from_one_writer = false;
  for (uint32_t w = 1; w <= 4; ++w) from_one_writer |= stored == TestPayload(key, w);
  EXPECT_TRUE(from_one_writer);
  EXPECT_EQ(env_->MeasuredBytes(*store), store->object_bytes());
  EXPECT_EQ(store->stats().bytes_held, static_cast<int64_t>(store->object_bytes()));
}

TEST_P(KvStoreContractTest, EvictionStormDuringSlowReadsNeverReturnsWrongBytes) {
  // Room for 12 objects under the high watermark; 60 keys are written while readers read slowly.
  const KvStoreConfig config = ConfigFor(16);
  KvStore* store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  for (uint64_t i = 0; i < 12; ++i) {
    ASSERT_TRUE(store->Write(TestKey(i), TestPayload(TestKey(i), 0), kNoDeadline).ok());
  }
  const KvBlockLayout layout = config.layout;
  std::atomic<bool> writers_done{false};
  std::atomic<int> good{0}, missed{0}, corrupt{0}, other{0};
  auto read_loop = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out(layout.payload_bytes());
    for (int n = 0; n < 20 || !writers_done.load(); ++n) {
      const KvBlockKey key = TestKey(rng() % 60);
      auto reader = store->OpenForRead(key, kNoDeadline);
      if (!reader.ok()) {
        (absl::IsNotFound(reader.status()) ? missed : other)++;
        continue;
      }
      absl::Status s;
      for (uint32_t layer = 0; layer < layout.num_layers && s.ok(); ++layer) {
        s = (*reader)->ReadLayers(
            layer, 1,
            absl::MakeSpan(out).subspan(layer * layout.bytes_per_layer, layout.bytes_per_layer),
            kNoDeadline);
        absl::SleepFor(absl::Microseconds(300));  // a slow reader: writers evict meanwhile
      }
      if (absl::IsNotFound(s)) {
        ++missed;
      } else if (!s.ok()) {
        ++other;
      } else if (out == TestPayload(key, 0) || out == TestPayload(key, 1) ||
                 out == TestPayload(key, 2)) {
        ++good;
      } else {
        ++corrupt;
      }
    }
  };
  std::thread r1(read_loop, 1), r2(read_loop, 2);
  // Writers pace themselves so that the readers' slow reads overlap many evictions.
  const absl::Duration pause = absl::Microseconds(500);
  env_->RunWriters(*store, config, {{12, 48, 1, pause}, {0, 60, 2, pause}});
  writers_done = true;
  r1.join();
  r2.join();
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(good.load(), 0);
  // 60 keys went through a store that holds 12: evictions happened under the readers.
  size_t stored = 0;
  for (uint64_t i = 0; i < 60; ++i) stored += *store->Lookup({TestKey(i)}, kNoDeadline);
  EXPECT_LE(stored, 12u);
  EXPECT_GE(stored, 1u);
}

TEST_P(KvStoreContractTest, ObjectOpenDuringItsEvictionReadsWholeOrMisses) {
  const KvStoreConfig config = ConfigFor(16);
  KvStore* store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  const KvBlockKey key = TestKey(0);
  ASSERT_TRUE(store->Write(key, TestPayload(key, 1), kNoDeadline).ok());
  const KvBlockLayout layout = config.layout;
  std::vector<uint8_t> out(layout.payload_bytes());
  auto reader = store->OpenForRead(key, kNoDeadline);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)
                  ->ReadLayers(0, 1, absl::MakeSpan(out).first(layout.bytes_per_layer), kNoDeadline)
                  .ok());
  // Three times the capacity written while the reader holds the object, then the same key
  // rewritten with other bytes if it was evicted.
  env_->RunWriters(*store, config, {{1, 48, 1}});
  (void)store->Write(key, TestPayload(key, 2), kNoDeadline);
  const absl::Status s =
      (*reader)->ReadLayers(1, 3, absl::MakeSpan(out).subspan(layout.bytes_per_layer), kNoDeadline);
  if (s.ok()) {
    EXPECT_EQ(out, TestPayload(key, 1));  // all layers from the object that was opened
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }
}

TEST_P(KvStoreContractTest, SustainedWritePressureStaysUnderTheWatermark) {
  const KvStoreConfig config = ConfigFor(20);
  KvStore* store = OpenStore(config);
  ASSERT_NE(store, nullptr);
  const uint64_t high = WatermarkBytes(config.capacity_bytes, config.high_watermark);
  std::atomic<bool> done{false};
  uint64_t max_measured = 0;
  int samples = 0;
  std::thread sampler([&] {
    while (!done.load()) {
      max_measured = std::max(max_measured, env_->MeasuredBytes(*store));
      ++samples;
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  env_->RunWriters(*store, config, {{0, 40, 1}, {100, 40, 2}, {200, 40, 3}});
  done = true;
  sampler.join();
  EXPECT_GT(samples, 0);
  EXPECT_LE(max_measured, high + store->object_bytes());
  EXPECT_LE(env_->MeasuredBytes(*store), high);
  EXPECT_LE(store->stats().bytes_held, static_cast<int64_t>(high));
  EXPECT_GT(store->stats().bytes_held, 0);
}

TEST_P(KvStoreContractTest, FlippedByteIsDetectedAndReadAsAMiss) {
  KvStore* store = OpenStore(ConfigFor(16));
  ASSERT_NE(store, nullptr);
  const KvBlockLayout layout = store->config().layout;
  const KvBlockKey payload_key = TestKey(1), header_key = TestKey(2), intact = TestKey(3);
  for (const KvBlockKey& key : {payload_key, header_key, intact}) {
    ASSERT_TRUE(store->Write(key, TestPayload(key, 1), kNoDeadline).ok());
  }
  // One bit in layer 2's bytes: the header is fine, layer 2 is not.
  ASSERT_TRUE(
      env_->FlipBit(*store, payload_key, HeaderBytes(*store) + 2 * layout.bytes_per_layer + 77)
          .ok());
  auto reader = store->OpenForRead(payload_key, kNoDeadline);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> layer(layout.bytes_per_layer);
  EXPECT_TRUE((*reader)->ReadLayers(1, 1, absl::MakeSpan(layer), kNoDeadline).ok());
  EXPECT_EQ((*reader)->ReadLayers(2, 1, absl::MakeSpan(layer), kNoDeadline).code(),
            absl::StatusCode::kNotFound);
  reader->reset();
  EXPECT_EQ(store->stats().errors, 1);
  // The corrupt object is gone, so it will be written again.
  EXPECT_EQ(*store->Lookup({payload_key}, kNoDeadline), 0u);

  // One bit of the header (inside the key).
  ASSERT_TRUE(env_->FlipBit(*store, header_key, 20).ok());
  EXPECT_EQ(store->OpenForRead(header_key, kNoDeadline).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->stats().errors, 2);
  EXPECT_EQ(ReadAllOrEmpty(*store, intact), TestPayload(intact, 1));
}

}  // namespace deepinfer::kv_store_testing
