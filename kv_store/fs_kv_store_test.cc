#include "kv_store/fs_kv_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fake_clock.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "kv_store/kv_store_contract.h"
#include "kv_store/testing/test_blocks.h"

namespace deepinfer::kv_store_testing {
namespace {

constexpr absl::Time kNoDeadline = absl::InfiniteFuture();

std::string NewRoot() {
  static std::atomic<int> n{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/fs_kv_store_", getpid(), "_", n++);
}

std::string WriterPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(srcdir ? srcdir : ".", "/deepinfer/kv_store/store_writer");
}

// Sum of the sizes of every file under root/objects (objects and reservations).
uint64_t DirectoryBytes(const std::string& root, int* temp_files = nullptr) {
  uint64_t total = 0;
  const std::string objects = root + "/objects";
  DIR* top = opendir(objects.c_str());
  if (top == nullptr) return 0;
  while (const dirent* sub = readdir(top)) {
    if (sub->d_name[0] == '.') continue;
    const std::string dir = absl::StrCat(objects, "/", sub->d_name);
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) continue;
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      struct stat st;
      if (stat(absl::StrCat(dir, "/", e->d_name).c_str(), &st) == 0) {
        total += static_cast<uint64_t>(st.st_size);
        if (temp_files != nullptr && absl::EndsWith(e->d_name, ".tmp")) ++*temp_files;
      }
    }
    closedir(d);
  }
  closedir(top);
  return total;
}

FsKvStoreOptions TestOptions(const std::string& root, const KvStoreConfig& config) {
  FsKvStoreOptions options;
  options.config = config;
  options.root = root;
  options.fsync = false;  // a test directory need not survive a machine crash
  options.touch_interval = absl::ZeroDuration();
  options.rescan_interval = absl::Hours(1);
  return options;
}

class FsEnv : public KvStoreContractEnv {
 public:
  FsEnv() : root_(NewRoot()) {}

  absl::StatusOr<std::unique_ptr<KvStore>> Open(const KvStoreConfig& config) override {
    absl::StatusOr<std::unique_ptr<FsKvStore>> store =
        FsKvStore::Create(TestOptions(root_, config));
    if (!store.ok()) return store.status();
    return std::unique_ptr<KvStore>(*std::move(store));
  }

  absl::Status FlipBit(KvStore& store, const KvBlockKey& key, uint64_t offset) override {
    const std::string path = static_cast<FsKvStore&>(store).ObjectPath(key);
    const int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) return absl::NotFoundError(path);
    uint8_t b = 0;
    const bool ok = pread(fd, &b, 1, static_cast<off_t>(offset)) == 1 &&
                    (b ^= 1, pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
    close(fd);
    return ok ? absl::OkStatus() : absl::InternalError("flip failed");
  }

  uint64_t MeasuredBytes(KvStore&) override { return DirectoryBytes(root_); }

  void AbandonReservation(KvStore&, const KvStoreConfig& config, const KvBlockKey& key) override {
    // The helper writes TestKey(index); find the index of `key`.
    uint64_t index = 0;
    while (index < 10000 && TestKey(index) != key) ++index;
    ASSERT_LT(index, 10000u) << "not a test key: " << key.Hex();
    const std::string log = absl::StrCat(root_, ".hold.log");
    auto child = Start({"hold", std::to_string(index)}, config, log);
    ASSERT_NE(child, nullptr);
    // Wait until it has reserved and written half the layers, then kill it mid-write.
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    std::string out;
    while (!absl::StrContains(out, "reserved") && absl::Now() < give_up && child->Running()) {
      absl::SleepFor(absl::Milliseconds(2));
      std::ifstream in(log);
      out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    ASSERT_TRUE(absl::StrContains(out, "reserved")) << TailFile(log);
    ASSERT_TRUE(child->Signal(SIGKILL).ok());
    absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(10));
    ASSERT_TRUE(status.ok());
    EXPECT_EQ(status->signal, SIGKILL);
    int temp_files = 0;
    DirectoryBytes(root_, &temp_files);
    EXPECT_EQ(temp_files, 1);  // the dead writer's reservation, half written
  }

  void RunWriters(KvStore&, const KvStoreConfig& config,
                  const std::vector<WriterJob>& jobs) override {
    std::vector<std::unique_ptr<Subprocess>> children;
    for (size_t i = 0; i < jobs.size(); ++i) {
      children.push_back(Start({"write", std::to_string(jobs[i].first_key),
                                std::to_string(jobs[i].count), std::to_string(jobs[i].writer_id),
                                std::to_string(absl::ToInt64Microseconds(jobs[i].pause))},
                               config, absl::StrCat(root_, ".writer", i, ".log")));
      ASSERT_NE(children.back(), nullptr);
    }
    for (const auto& child : children) {
      absl::StatusOr<ExitStatus> status = child->Wait(absl::Seconds(60));
      ASSERT_TRUE(status.ok()) << status.status();
      EXPECT_TRUE(status->ok()) << status->ToString() << ": " << TailFile(child->log_path());
    }
  }

 private:
  std::unique_ptr<Subprocess> Start(std::vector<std::string> args, const KvStoreConfig& config,
                                    const std::string& log) {
    // The helper builds the same TestConfig; only the capacity varies between tests.
    EXPECT_EQ(config.high_watermark, TestConfig(0).high_watermark);
    SubprocessOptions options;
    options.argv = {WriterPath(), root_, std::to_string(config.capacity_bytes)};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.log_path = log;
    absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Start(std::move(options));
    EXPECT_TRUE(child.ok()) << child.status();
    return child.ok() ? *std::move(child) : nullptr;
  }

  const std::string root_;
};

std::unique_ptr<KvStoreContractEnv> MakeFsEnv() { return std::make_unique<FsEnv>(); }

INSTANTIATE_TEST_SUITE_P(Fs, KvStoreContractTest,
                         testing::Values(KvStoreContractParam{"fs", &MakeFsEnv}),
                         KvStoreContractParamName);

TEST(FsKvStoreTest, TwoStoresOnOneDirectoryShareObjectsAndAccounting) {
  const std::string root = NewRoot();
  const KvStoreConfig config = TestConfig(1 << 20);
  auto a = FsKvStore::Create(TestOptions(root, config));
  auto b = FsKvStore::Create(TestOptions(root, config));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Write(TestKey(1), TestPayload(TestKey(1), 1), kNoDeadline).ok());
  std::vector<uint8_t> out(config.layout.payload_bytes());
  ASSERT_TRUE((*b)->Read(TestKey(1), absl::MakeSpan(out), kNoDeadline).ok());
  EXPECT_EQ(out, TestPayload(TestKey(1), 1));
  EXPECT_EQ((*b)->Write(TestKey(1), TestPayload(TestKey(1), 2), kNoDeadline).code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE((*b)->Write(TestKey(2), TestPayload(TestKey(2), 2), kNoDeadline).ok());
  EXPECT_EQ((*a)->stats().bytes_held, static_cast<int64_t>(2 * (*a)->object_bytes()));
}

TEST(FsKvStoreTest, ObjectIsOneFileInItsFanoutDirectoryWithTheFormatHeader) {
  const std::string root = NewRoot();
  const KvStoreConfig config = TestConfig(1 << 20);
  auto store = FsKvStore::Create(TestOptions(root, config));
  ASSERT_TRUE(store.ok());
  const KvBlockKey key = TestKey(5);
  ASSERT_TRUE((*store)->Write(key, TestPayload(key, 1), kNoDeadline).ok());
  const std::string path = (*store)->ObjectPath(key);
  EXPECT_EQ(path, absl::StrCat(root, "/objects/", key.Hex().substr(0, 2), "/", key.Hex(), ".kv"));
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), (*store)->object_bytes());
  EXPECT_EQ(bytes.substr(0, 8), "DIKVOBJ1");
  EXPECT_EQ(bytes.substr(16, 32), std::string(reinterpret_cast<const char*>(key.bytes.data()), 32));
  const std::vector<uint8_t> payload = TestPayload(key, 1);
  EXPECT_EQ(bytes.substr(4096), std::string(payload.begin(), payload.end()));
}

TEST(FsKvStoreTest, ObjectOfAnotherModelOrLayoutIsAMiss) {
  const std::string root = NewRoot();
  const KvStoreConfig config = TestConfig(1 << 20);
  auto writer = FsKvStore::Create(TestOptions(root, config));
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Write(TestKey(1), TestPayload(TestKey(1), 1), kNoDeadline).ok());

  KvStoreConfig other_model = config;
  KvNamespace ns = TestNamespace();
  ns.model_revision = "r2";
  other_model.model_digest = ModelDigest(ns);
  auto a = FsKvStore::Create(TestOptions(root, other_model));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->OpenForRead(TestKey(1), kNoDeadline).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*a)->stats().errors, 1);
}

TEST(FsKvStoreTest, LostUsageRecordIsRebuiltByAScan) {
  const std::string root = NewRoot();
  const KvStoreConfig config = TestConfig(1 << 20);
  auto store = FsKvStore::Create(TestOptions(root, config));
  ASSERT_TRUE(store.ok());
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE((*store)->Write(TestKey(i), TestPayload(TestKey(i), 1), kNoDeadline).ok());
  }
  ASSERT_EQ(truncate((root + "/usage").c_str(), 0), 0);
  ASSERT_TRUE((*store)->Collect(kNoDeadline).ok());
  EXPECT_EQ((*store)->stats().bytes_held, static_cast<int64_t>(3 * (*store)->object_bytes()));
  EXPECT_EQ((*store)->stats().objects, 3);
}

TEST(FsKvStoreTest, CommitAfterTheReservationWasReclaimedIsAborted) {
  FakeClock clock;
  clock.Advance(absl::Now() - clock.Now());
  KvStoreConfig config = TestConfig(1 << 20);
  config.clock = clock.AsFunction();
  const std::string root = NewRoot();
  auto store = FsKvStore::Create(TestOptions(root, config));
  ASSERT_TRUE(store.ok());
  auto writer = (*store)->Reserve(TestKey(1), kNoDeadline);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->WriteLayers(0, 4, TestPayload(TestKey(1), 1)).ok());
  clock.Advance(config.reservation_timeout + absl::Seconds(1));
  ASSERT_TRUE((*store)->Collect(kNoDeadline).ok());
  EXPECT_EQ((*writer)->Commit(kNoDeadline).code(), absl::StatusCode::kAborted);
  writer->reset();
  EXPECT_EQ((*store)->stats().bytes_held, 0);
  EXPECT_EQ(DirectoryBytes(root), 0u);
  EXPECT_EQ(*(*store)->Lookup({TestKey(1)}, kNoDeadline), 0u);
}

TEST(FsKvStoreTest, WaitForTheDirectoryLockEndsAtTheDeadline) {
  const std::string root = NewRoot();
  auto store = FsKvStore::Create(TestOptions(root, TestConfig(1 << 20)));  // real clock
  ASSERT_TRUE(store.ok());
  // Another process's lock, as far as flock() is concerned: a separate open file description.
  const int fd = open((root + "/usage").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  EXPECT_EQ((*store)->Reserve(TestKey(1), absl::Now() + absl::Milliseconds(30)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*store)->Collect(absl::Now() + absl::Milliseconds(30)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(DirectoryBytes(root), 0u);  // nothing left behind
  flock(fd, LOCK_UN);
  close(fd);
  EXPECT_TRUE((*store)->Write(TestKey(1), TestPayload(TestKey(1), 1), kNoDeadline).ok());
}

TEST(FsKvStoreTest, ThreadsOfOneProcessShareTheStore) {
  const std::string root = NewRoot();
  KvStoreConfig config = TestConfig(0);
  config.capacity_bytes = 20 * (4096 + config.layout.payload_bytes());
  auto store = FsKvStore::Create(TestOptions(root, config));
  ASSERT_TRUE(store.ok());
  RunWritersInThreads(**store, {{0, 30, 1}, {10, 30, 2}, {20, 30, 3}, {0, 50, 4}});
  const uint64_t high = WatermarkBytes(config.capacity_bytes, config.high_watermark);
  EXPECT_LE(DirectoryBytes(root), high);
  EXPECT_EQ((*store)->stats().bytes_held, static_cast<int64_t>(DirectoryBytes(root)));
  int verified = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    std::vector<uint8_t> out(config.layout.payload_bytes());
    if (!(*store)->Read(TestKey(i), absl::MakeSpan(out), kNoDeadline).ok()) continue;
    bool from_one_writer = false;
    for (uint32_t w = 1; w <= 4; ++w) from_one_writer |= out == TestPayload(TestKey(i), w);
    EXPECT_TRUE(from_one_writer) << i;
    ++verified;
  }
  EXPECT_GT(verified, 0);
}

TEST(FsKvStoreTest, UnwritableDirectoryIsUnavailable) {
  auto store = FsKvStore::Create(TestOptions("/proc/no_such_dir/kv", TestConfig(1 << 20)));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deepinfer::kv_store_testing
