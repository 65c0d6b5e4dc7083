// A fixed-size pool for data-parallel kernels: ParallelFor splits [0, n) into contiguous chunks,
// runs them on the workers and the calling thread, and returns when all are done. Sized to the
// cores the caller grants (default: hardware concurrency), never more, so kernels do not
// oversubscribe.
//
// Latency: a forward pass issues hundreds of small ParallelFor calls per step, so hand-off must
// cost microseconds, not a futex round trip. Workers spin (with a pause instruction) for a short
// while after each job and only then sleep on a condition variable; chunks are claimed with one
// atomic compare-and-swap. The spin is bounded (kSpinMicros) so an idle pool costs no CPU.
//
// Thread-safety: ParallelFor may be called from one thread at a time per pool (the engine's step
// thread); nested ParallelFor from inside a task runs inline. Threads start in Create() (the
// pool is a leaf utility with no other start-up) and stop in the destructor. Not copyable or
// movable.
#ifndef DEEPINFER_KERNELS_THREAD_POOL_H_
#define DEEPINFER_KERNELS_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace deepinfer::kernels {

class ThreadPool {
 public:
  // How long an idle worker keeps polling for the next job before it sleeps.
  static constexpr int kSpinMicros = 200;

  // num_threads <= 0: std::thread::hardware_concurrency(). num_threads == 1: no worker threads.
  static std::unique_ptr<ThreadPool> Create(int num_threads);

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at least `min_chunk` long
  // (except possibly the last).
  void ParallelFor(int64_t n, int64_t min_chunk,
                   const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  explicit ThreadPool(int num_threads);
  void WorkerLoop();
  // Claims and runs chunks of job `generation` until none are left (or a newer job started).
  void RunChunks(uint32_t generation);

  const int num_threads_;
  std::vector<std::thread> workers_;

  // The current job. Written by the caller only while no chunk of a job is claimable, published
  // by the release store to state_ and read by workers after an acquiring claim.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t num_chunks_ = 0;  // caller's copy; workers read the count from state_
  // Generation, chunk count and next unclaimed chunk, packed (see thread_pool.cc).
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> chunks_done_{0};

  // Sleeping workers wait on work_cv_ under mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_THREAD_POOL_H_
