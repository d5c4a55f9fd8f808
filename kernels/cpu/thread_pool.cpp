#include "kernels/cpu/thread_pool.h"

#include <algorithm>

namespace exl {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t c;
    {
      std::lock_guard lk(mu_);
      if (next_chunk_ >= n_chunks_) return;
      c = next_chunk_++;
    }
    int64_t b = c * chunk_, e = std::min(n_, b + chunk_);
    try {
      (*job_)(b, e);
    } catch (...) {
      std::lock_guard lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunks();
    {
      std::lock_guard lk(mu_);
      if (--active_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = std::max<int64_t>(1, n / grain);
  int64_t n_chunks = std::min<int64_t>(max_chunks, int64_t(size()) * 4);
  if (workers_.empty() || n_chunks <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard lk(mu_);
    job_ = &fn;
    n_ = n;
    chunk_ = (n + n_chunks - 1) / n_chunks;
    n_chunks_ = (n + chunk_ - 1) / chunk_;
    next_chunk_ = 0;
    active_ = int(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  cv_start_.notify_all();
  run_chunks();
  std::exception_ptr err;
  {
    std::unique_lock lk(mu_);
    cv_done_.wait(lk, [&] { return active_ == 0; });
    job_ = nullptr;
    err = error_;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace exl
