#include "kernels/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DI_CPU_PAUSE() _mm_pause()
#else
#define DI_CPU_PAUSE() std::this_thread::yield()
#endif

namespace deepinfer::kernels {
namespace {

thread_local bool tls_in_pool_task = false;

// state_ layout: generation (32 bits) | number of chunks (16 bits) | next chunk index (16 bits).
// Keeping the chunk count in the same word makes a claim a single compare-and-swap that cannot
// succeed against a job other than the one it read.
uint32_t GenerationOf(uint64_t state) { return static_cast<uint32_t>(state >> 32); }
int64_t ChunksOf(uint64_t state) { return static_cast<int64_t>((state >> 16) & 0xffffu); }
int64_t IndexOf(uint64_t state) { return static_cast<int64_t>(state & 0xffffu); }
constexpr int64_t kMaxChunks = 0xffff;

}  // namespace

std::unique_ptr<ThreadPool> ThreadPool::Create(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<ThreadPool>(new ThreadPool(num_threads));
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(uint32_t generation) {
  uint64_t s = state_.load(std::memory_order_acquire);
  while (GenerationOf(s) == generation && IndexOf(s) < ChunksOf(s)) {
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;  // s was reloaded
    }
    // The claim pins the job: the caller cannot publish another until this chunk is done.
    const int64_t begin = IndexOf(s) * job_chunk_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    const auto* fn = job_;
    tls_in_pool_task = true;
    (*fn)(begin, end);
    tls_in_pool_task = false;
    chunks_done_.fetch_add(1, std::memory_order_acq_rel);
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = GenerationOf(state_.load(std::memory_order_acquire));
  while (true) {
    // Poll for a new job for a while, then sleep.
    const auto spin_until =
        std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    uint32_t gen = GenerationOf(state_.load(std::memory_order_acquire));
    int polls = 0;
    while (gen == seen && !stop_.load(std::memory_order_relaxed)) {
      DI_CPU_PAUSE();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) break;
      gen = GenerationOf(state_.load(std::memory_order_acquire));
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);  // seq_cst: pairs with the caller's publish-then-check
      work_cv_.wait(lock, [&] { return stop_.load() || GenerationOf(state_.load()) != seen; });
      sleepers_.fetch_sub(1);
      if (stop_.load()) return;
      gen = GenerationOf(state_.load(std::memory_order_acquire));
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    seen = gen;
    RunChunks(gen);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  if (num_threads_ == 1 || tls_in_pool_task || n <= min_chunk) {
    fn(0, n);
    return;
  }
  // Several chunks per thread balance uneven work and threads the OS preempts (a shared
  // machine), at little scheduling cost.
  const int64_t target_chunks =
      std::min<int64_t>(kMaxChunks, static_cast<int64_t>(num_threads_) * 8);
  const int64_t chunk = std::max(min_chunk, (n + target_chunks - 1) / target_chunks);
  // No chunk of the previous job is claimable any more (its generation's index is exhausted and
  // all its chunks completed), so the fields can be rewritten.
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  num_chunks_ = (n + chunk - 1) / chunk;
  chunks_done_.store(0, std::memory_order_relaxed);
  const uint32_t generation = GenerationOf(state_.load(std::memory_order_relaxed)) + 1;
  state_.store((static_cast<uint64_t>(generation) << 32) |
               (static_cast<uint64_t>(num_chunks_) << 16));  // seq_cst publish
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    work_cv_.notify_all();
  }
  RunChunks(generation);  // the caller works too
  // Another worker still runs a chunk; spin, yielding now and then in case it was preempted.
  for (int polls = 1; chunks_done_.load(std::memory_order_acquire) < num_chunks_; ++polls) {
    DI_CPU_PAUSE();
    if (polls % 1024 == 0) std::this_thread::yield();
  }
}

}  // namespace deepinfer::kernels
