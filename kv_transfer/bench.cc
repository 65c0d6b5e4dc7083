// kv_transfer bandwidth/latency benchmark over UCX between two processes.
//
//   UCX_TLS=sm,self bench --role=server --metadata=/tmp/kv.meta &
//   UCX_TLS=sm,self bench --role=client --metadata=/tmp/kv.meta
//       --block_sizes=16384,131072,1048576,2097152 --batches=1,16,256 --iterations=20
//
// The server allocates a pool and publishes its metadata blob in a file; the client writes
// batches of blocks into it (WRITE, each batch one post ending with a notification) and prints
// one line per (block size, batch): GB/s (1e9 bytes/s) and mean post latency. The client tells the
// server to exit with a notification of request_id 0.
//
// Memory footprint: both sides use a pool of --pool_bytes and post i of a batch touches block
// (post * batch + i) mod (pool_bytes / block), so a pool of one block keeps rewriting the same
// cache-resident bytes like ucx_perftest, and a large pool streams through memory like a real KV
// cache. A batch may be larger than the pool (indices wrap). --inflight posts are kept in flight
// on a ring of handles (the layer-wise streaming pattern), each with its own notification.
// --alloc=agent takes both pools from TransferAgent::AllocateMemory; --alloc=malloc registers
// plain heap memory with RegisterMemory (over shared memory UCX then emulates puts, see
// transfer_agent.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kv_transfer/ucx_agent.h"

ABSL_FLAG(std::string, role, "client", "server or client");
ABSL_FLAG(std::string, metadata, "/tmp/kv_transfer_bench.meta", "file the server's blob goes in");
ABSL_FLAG(std::string, block_sizes, "16384,65536,262144,1048576,2097152", "bytes, comma list");
ABSL_FLAG(std::string, batches, "1,16,64,256", "blocks per post, comma list");
ABSL_FLAG(int, iterations, 20, "posts per (block size, batch) after 2 warm-up posts");
ABSL_FLAG(int64_t, pool_bytes, int64_t{512} << 20, "bytes registered on each side");
ABSL_FLAG(std::string, alloc, "agent", "agent (AllocateMemory) or malloc (RegisterMemory)");
ABSL_FLAG(int, inflight, 1, "posts kept in flight (one handle each)");

namespace deepinfer::kv_transfer {
namespace {

std::vector<uint64_t> ParseList(const std::string& s) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    uint64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

std::unique_ptr<TransferAgent> MakeAgent(const char* name) {
  AgentConfig config;
  config.name = name;
  config.incarnation = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  config.backend = Backend::kUcx;
  auto agent = CreateUcxAgent(config);
  if (!agent.ok() || !(*agent)->Start().ok()) {
    std::fprintf(stderr, "bench: %s\n", agent.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(agent);
}

// A pool of --pool_bytes registered with `agent` as --alloc says; `fill` is written into it.
struct Pool {
  RegionId region = 0;
  char* base = nullptr;
  std::vector<char> heap;  // --alloc=malloc only
};

Pool MakePool(TransferAgent& agent, size_t bytes, char fill) {
  Pool pool;
  if (absl::GetFlag(FLAGS_alloc) == "malloc") {
    pool.heap.assign(bytes, fill);
    pool.base = pool.heap.data();
    absl::StatusOr<RegionId> region = agent.RegisterMemory(pool.base, bytes, MemoryKind::kHost);
    if (!region.ok()) {
      std::fprintf(stderr, "bench: %s\n", region.status().ToString().c_str());
      std::exit(1);
    }
    pool.region = *region;
    return pool;
  }
  absl::StatusOr<AllocatedRegion> allocated = agent.AllocateMemory(bytes, MemoryKind::kHost);
  if (!allocated.ok()) {
    std::fprintf(stderr, "bench: %s\n", allocated.status().ToString().c_str());
    std::exit(1);
  }
  pool.region = allocated->region;
  pool.base = static_cast<char*>(allocated->base);
  std::memset(pool.base, fill, bytes);  // fault the pages in before timing
  return pool;
}

int Server() {
  auto agent = MakeAgent("bench_server");
  Pool pool = MakePool(*agent, absl::GetFlag(FLAGS_pool_bytes), 0);
  const std::string path = absl::GetFlag(FLAGS_metadata);
  {
    std::ofstream out(path + ".tmp", std::ios::binary);
    std::string blob = *agent->ExportMetadata();
    out.write(blob.data(), blob.size());
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
  while (true) {
    if (!agent->WaitForNotifications(absl::Now() + absl::Seconds(600))) return 3;
    for (const Notification& n : agent->DrainNotifications()) {
      if (n.request_id == 0) return 0;
    }
  }
}

bool WaitDone(TransferAgent& agent, HandleId h) {
  absl::StatusOr<TransferStatus> st = agent.Wait(h, absl::Now() + absl::Seconds(60));
  if (!st.ok() || st->state != TransferState::kDone) {
    std::fprintf(stderr, "bench: post failed: %s\n",
                 st.ok() ? st->status.ToString().c_str() : st.status().ToString().c_str());
    return false;
  }
  return true;
}

int Client() {
  auto agent = MakeAgent("bench_client");
  const size_t bytes = absl::GetFlag(FLAGS_pool_bytes);
  Pool pool = MakePool(*agent, bytes, 1);
  std::string blob;
  for (int i = 0; i < 2000 && blob.empty(); ++i) {
    std::ifstream in(absl::GetFlag(FLAGS_metadata), std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      blob = ss.str();
    } else {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  auto peer = agent->ImportPeer(blob);
  if (!peer.ok()) {
    std::fprintf(stderr, "bench: %s\n", peer.status().ToString().c_str());
    return 1;
  }
  const int inflight = std::max(1, absl::GetFlag(FLAGS_inflight));
  const int iterations = absl::GetFlag(FLAGS_iterations);
  std::printf("%10s %6s %10s %12s\n", "block_B", "batch", "GB/s", "post_us");
  HandleId last = 0;
  for (uint64_t block : ParseList(absl::GetFlag(FLAGS_block_sizes))) {
    const uint32_t n = bytes / block;
    if (n == 0) continue;
    std::vector<BlockDesc> blocks;
    for (uint32_t i = 0; i < n; ++i) blocks.push_back({pool.region, i * block, block});
    DescListId local = *agent->PrepareLocalDescriptors(blocks);
    for (BlockDesc& b : blocks) b.region = 1;  // the server's only region
    DescListId remote = *agent->PrepareRemoteDescriptors(*peer, blocks);
    std::vector<HandleId> handles;
    for (int i = 0; i < inflight; ++i) handles.push_back(*agent->CreateHandle(local, remote));
    // One untimed pass over the whole pool: the first write to each page of a peer's mapping
    // costs a page fault in this process (once per connection), which is not transfer speed.
    for (uint32_t first = 0; first < n; first += 256) {
      std::vector<uint32_t> all;
      for (uint32_t i = first; i < std::min(n, first + 256); ++i) all.push_back(i);
      if (!agent
               ->Post(handles[0], TransferOp::kWrite, all, all, nullptr,
                      absl::Now() + absl::Seconds(60))
               .ok() ||
          !WaitDone(*agent, handles[0])) {
        return 1;
      }
    }
    for (uint64_t batch : ParseList(absl::GetFlag(FLAGS_batches))) {
      std::vector<std::vector<uint32_t>> idx(inflight, std::vector<uint32_t>(batch));
      std::vector<bool> posted(inflight, false);
      absl::Time start;
      const int warmup = 2 * inflight;
      for (int it = -warmup; it < iterations; ++it) {
        if (it == 0) {
          // Drain the warm-up posts so the timed ones start from an idle pipe.
          for (int k = 0; k < inflight; ++k) {
            if (posted[k] && !WaitDone(*agent, handles[k])) return 1;
            posted[k] = false;
          }
          start = absl::Now();
        }
        const int k = (it + warmup) % inflight;
        if (posted[k] && !WaitDone(*agent, handles[k])) return 1;
        for (uint32_t i = 0; i < batch; ++i) {
          idx[k][i] = static_cast<uint32_t>((static_cast<uint64_t>(it + warmup) * batch + i) % n);
        }
        Notification note{1, static_cast<uint32_t>(it + warmup), 0, ""};
        absl::Status s = agent->Post(handles[k], TransferOp::kWrite, idx[k], idx[k], &note,
                                     absl::Now() + absl::Seconds(60));
        if (!s.ok()) {
          std::fprintf(stderr, "bench: post refused: %s\n", s.ToString().c_str());
          return 1;
        }
        posted[k] = true;
      }
      for (int k = 0; k < inflight; ++k) {
        if (posted[k] && !WaitDone(*agent, handles[k])) return 1;
      }
      const double secs = absl::ToDoubleSeconds(absl::Now() - start);
      const double total = static_cast<double>(block) * batch * iterations;
      std::printf("%10llu %6llu %10.3f %12.1f\n", static_cast<unsigned long long>(block),
                  static_cast<unsigned long long>(batch), total / secs / 1e9,
                  secs / iterations * 1e6);
      std::fflush(stdout);
    }
    last = handles[0];
  }
  Notification bye{0, 0, 0, ""};
  (void)agent->Post(last, TransferOp::kWrite, {}, {}, &bye, absl::Now() + absl::Seconds(10));
  (void)agent->Wait(last, absl::Now() + absl::Seconds(10));
  return 0;
}

}  // namespace
}  // namespace deepinfer::kv_transfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return absl::GetFlag(FLAGS_role) == "server" ? deepinfer::kv_transfer::Server()
                                               : deepinfer::kv_transfer::Client();
}
