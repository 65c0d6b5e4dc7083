// Helper process for ucx_two_process_test: a UCX target agent.
//
//   ucx_peer <metadata_path> <num_blocks> <block_size> [register|allocate]
//
// Registers num_blocks * block_size bytes of heap memory (or takes them from AllocateMemory),
// writes its metadata blob to <metadata_path> (atomically, via rename), then checks every
// notification it receives: the payload (PatternPayload) names the blocks written and their
// pattern, and the blocks must already hold it (data before notification). Prints "ok <request_id>"
// or "bad <request_id> <block>" per notification on stdout. A notification with request_id 0 makes
// it exit. Exits 3 after 30 s without notifications.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kv_transfer/internal/test_pattern.h"
#include "kv_transfer/ucx_agent.h"

namespace deepinfer::kv_transfer {
namespace {

int Main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr,
                 "usage: ucx_peer <metadata_path> <num_blocks> <block_size> [register|allocate]\n");
    return 2;
  }
  const bool allocate = argc == 5 && std::string(argv[4]) == "allocate";
  const std::string path = argv[1];
  const uint64_t num_blocks = std::strtoull(argv[2], nullptr, 10);
  const uint64_t block_size = std::strtoull(argv[3], nullptr, 10);
  AgentConfig config;
  config.name = "ucx_peer";
  // Wall-clock nanoseconds: a restarted process gets a larger incarnation.
  config.incarnation = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  config.backend = Backend::kUcx;
  auto agent = CreateUcxAgent(config);
  if (!agent.ok()) {
    std::fprintf(stderr, "ucx_peer: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  std::vector<char> heap;
  char* memory = nullptr;
  if (allocate) {
    auto allocated = (*agent)->AllocateMemory(num_blocks * block_size, MemoryKind::kHost);
    if (!allocated.ok()) return 1;
    memory = static_cast<char*>(allocated->base);
  } else {
    heap.resize(num_blocks * block_size);
    memory = heap.data();
    if (!(*agent)->RegisterMemory(memory, heap.size(), MemoryKind::kHost).ok()) return 1;
  }
  if (!(*agent)->Start().ok()) return 1;
  auto blob = (*agent)->ExportMetadata();
  if (!blob.ok()) return 1;
  {
    std::ofstream out(path + ".tmp", std::ios::binary);
    out.write(blob->data(), blob->size());
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
  while (true) {
    if (!(*agent)->WaitForNotifications(absl::Now() + absl::Seconds(30))) return 3;
    for (Notification& n : (*agent)->DrainNotifications()) {
      if (n.request_id == 0) return 0;
      internal::PatternPayload p = internal::PatternPayload::Decode(n.payload);
      int64_t bad = -1;
      for (auto [pattern, index] : p.blocks) {
        if (index >= num_blocks ||
            !internal::CheckPattern(p.seed, pattern, memory + index * block_size, block_size)) {
          bad = index;
          break;
        }
      }
      if (bad < 0) {
        std::printf("ok %llu\n", static_cast<unsigned long long>(n.request_id));
      } else {
        std::printf("bad %llu %lld\n", static_cast<unsigned long long>(n.request_id),
                    static_cast<long long>(bad));
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace deepinfer::kv_transfer

int main(int argc, char** argv) { return deepinfer::kv_transfer::Main(argc, argv); }
