// A fixed pool of worker threads for data-parallel loops in the CPU backend. parallel_for may be
// called from one thread at a time (the engine thread); it blocks until every chunk has run.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace exl {

class ThreadPool {
 public:
  // n_threads <= 0 picks std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Runs fn(begin, end) over [0, n) split into chunks of at least `grain` items, on all threads
  // (the caller included). Exceptions from fn are rethrown in the caller (the first one).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0, chunk_ = 0, n_chunks_ = 0;
  int64_t next_chunk_ = 0;   // guarded by mu_
  int active_ = 0;           // workers still in the current job, guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace exl
