// A writer process for the fs backend's contract tests: opens an FsKvStore on a shared
// directory and writes test blocks (testing/test_blocks.h) with the real clock.
//
//   store_writer ROOT CAPACITY_BYTES hold KEY_INDEX
//       reserves the key, writes half its layers, prints "reserved" and waits to be killed
//   store_writer ROOT CAPACITY_BYTES write FIRST_INDEX COUNT WRITER_ID [PAUSE_MICROS]
//       writes keys FIRST_INDEX.. FIRST_INDEX+COUNT-1 with WRITER_ID's payload (a key already
//       stored, a lost race or a full store is skipped), pausing after each, then prints "done"
//
// Exit code 0 on success, 1 on a usage error, 2 on a store error other than those skipped.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "kv_store/fs_kv_store.h"
#include "kv_store/testing/test_blocks.h"

namespace deepinfer::kv_store_testing {
namespace {

int Run(int argc, char** argv) {
  uint64_t capacity = 0;
  if (argc < 5 || !absl::SimpleAtoi(argv[2], &capacity)) {
    std::fprintf(stderr, "usage: %s ROOT CAPACITY_BYTES hold|write ...\n", argv[0]);
    return 1;
  }
  FsKvStoreOptions options;
  options.root = argv[1];
  options.config = TestConfig(capacity);
  options.fsync = false;  // the tests' temporary directory need not survive a machine crash
  options.touch_interval = absl::ZeroDuration();
  auto store = FsKvStore::Create(options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 2;
  }
  const std::string mode = argv[3];
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  if (mode == "hold") {
    uint64_t index = 0;
    if (!absl::SimpleAtoi(argv[4], &index)) return 1;
    const KvBlockKey key = TestKey(index);
    auto writer = (*store)->Reserve(key, deadline);
    if (!writer.ok()) {
      std::fprintf(stderr, "%s\n", writer.status().ToString().c_str());
      return 2;
    }
    const std::vector<uint8_t> payload = TestPayload(key, 1);
    const uint32_t half = TestLayout().num_layers / 2;
    if (!(*writer)
             ->WriteLayers(0, half,
                           absl::MakeConstSpan(payload).first(half * TestLayout().bytes_per_layer))
             .ok()) {
      return 2;
    }
    std::printf("reserved\n");
    std::fflush(stdout);
    while (true) pause();
  }
  uint64_t first = 0, count = 0;
  uint32_t writer_id = 0;
  int64_t pause_micros = 0;
  if (mode != "write" || argc < 7 || !absl::SimpleAtoi(argv[4], &first) ||
      !absl::SimpleAtoi(argv[5], &count) || !absl::SimpleAtoi(argv[6], &writer_id) ||
      (argc > 7 && !absl::SimpleAtoi(argv[7], &pause_micros))) {
    std::fprintf(stderr, "bad arguments for %s\n", mode.c_str());
    return 1;
  }
  for (uint64_t i = first; i < first + count; ++i) {
    const KvBlockKey key = TestKey(i);
    const absl::Status s = (*store)->Write(key, TestPayload(key, writer_id), deadline);
    if (!s.ok() && !absl::IsAlreadyExists(s) && !absl::IsResourceExhausted(s)) {
      std::fprintf(stderr, "write %llu: %s\n", static_cast<unsigned long long>(i),
                   s.ToString().c_str());
      return 2;
    }
    absl::SleepFor(absl::Microseconds(pause_micros));
  }
  std::printf("done\n");
  return 0;
}

}  // namespace
}  // namespace deepinfer::kv_store_testing

int main(int argc, char** argv) { return deepinfer::kv_store_testing::Run(argc, argv); }
