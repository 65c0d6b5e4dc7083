// A fixed-size pool for data-parallel kernels: ParallelFor splits [0, n) into contiguous chunks,
// runs them on the workers and the calling thread, and returns when all are done. Sized to the
// cores the caller grants (default: hardware concurrency), never more, so kernels do not
// oversubscribe.
//
// Thread-safety: ParallelFor may be called from one thread at a time per pool (the engine's step
// thread); nested ParallelFor from inside a task runs inline. Threads start in Create() (the
// pool is a leaf utility with no other start-up) and stop in the destructor. Not copyable or
// movable.
#ifndef DEEPINFER_KERNELS_THREAD_POOL_H_
#define DEEPINFER_KERNELS_THREAD_POOL_H_

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
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Current job, guarded by mu_.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_chunk_ = 0;
  int64_t num_chunks_ = 0;
  int64_t chunks_done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace deepinfer::kernels

#endif  // DEEPINFER_KERNELS_THREAD_POOL_H_
