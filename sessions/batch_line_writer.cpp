#include "sessions/batch_line_writer.h"

#include <exception>

namespace exl {

BatchLineWriter::BatchLineWriter(BatchOutputFile& out) : out_(out), thread_([this] { run(); }) {}

BatchLineWriter::~BatchLineWriter() { finish(); }

bool BatchLineWriter::push(std::string line, std::function<void()> written) {
  {
    std::lock_guard lk(mu_);
    if (closing_ || !failure_.empty()) return false;
    queue_.push_back({std::move(line), std::move(written)});
  }
  cv_.notify_one();
  return true;
}

void BatchLineWriter::finish() {
  {
    std::lock_guard lk(mu_);
    closing_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::string BatchLineWriter::failure() const {
  std::lock_guard lk(mu_);
  return failure_;
}

void BatchLineWriter::run() {
  for (;;) {
    Entry e;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;
      e = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      out_.append(e.line);
    } catch (const std::exception& ex) {
      std::lock_guard lk(mu_);
      failure_ = ex.what();
      queue_.clear();
      return;
    }
    if (e.written) e.written();
  }
}

}  // namespace exl
