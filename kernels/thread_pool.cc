#include "kernels/thread_pool.h"

#include <algorithm>

namespace deepinfer::kernels {
namespace {
thread_local bool tls_in_pool_task = false;
}  // namespace

std::unique_ptr<ThreadPool> ThreadPool::Create(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  return std::unique_ptr<ThreadPool>(new ThreadPool(num_threads));
}

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int /*index*/) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && next_chunk_ < num_chunks_); });
    if (stop_) return;
    seen = generation_;
    while (next_chunk_ < num_chunks_) {
      const int64_t c = next_chunk_++;
      const auto* fn = job_;
      const int64_t begin = c * job_chunk_;
      const int64_t end = std::min(job_n_, begin + job_chunk_);
      lock.unlock();
      tls_in_pool_task = true;
      (*fn)(begin, end);
      tls_in_pool_task = false;
      lock.lock();
      if (++chunks_done_ == num_chunks_) done_cv_.notify_all();
    }
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
  // A few chunks per thread balances uneven work without much scheduling overhead.
  const int64_t target_chunks = static_cast<int64_t>(num_threads_) * 4;
  const int64_t chunk = std::max(min_chunk, (n + target_chunks - 1) / target_chunks);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_chunk_ = 0;
  num_chunks_ = (n + chunk - 1) / chunk;
  chunks_done_ = 0;
  ++generation_;
  work_cv_.notify_all();
  // The caller works too.
  while (next_chunk_ < num_chunks_) {
    const int64_t c = next_chunk_++;
    const int64_t begin = c * chunk;
    const int64_t end = std::min(n, begin + chunk);
    lock.unlock();
    tls_in_pool_task = true;
    fn(begin, end);
    tls_in_pool_task = false;
    lock.lock();
    ++chunks_done_;
  }
  done_cv_.wait(lock, [&] { return chunks_done_ == num_chunks_; });
  job_ = nullptr;
  num_chunks_ = 0;
}

}  // namespace deepinfer::kernels
