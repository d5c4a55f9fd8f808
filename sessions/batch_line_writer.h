// Appends a batch job's result lines to its BatchOutputFile on a thread of its own, in the order
// they are pushed, so that the thread that generates (the caller of push) does not wait for each
// line's write and fsync. Every line is still written and synced on its own, so the file keeps
// BatchOutputFile's invariants; a line pushed but not yet written when the process dies is lost
// as a job still running would be, and resuming runs its request again. After an append fails
// the writer drops what is queued and writes nothing more: failure() says why, push() refuses.
// Thread-safety: push(), failure() and finish() are called by one owner thread; each line's
// `written` callback runs on the writer's thread after its append, never concurrently with
// another.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "sessions/batch_output.h"

namespace exl {

class BatchLineWriter {
 public:
  // `out` must outlive the writer.
  explicit BatchLineWriter(BatchOutputFile& out);
  // finish().
  ~BatchLineWriter();
  BatchLineWriter(const BatchLineWriter&) = delete;
  BatchLineWriter& operator=(const BatchLineWriter&) = delete;

  // Queues `line` (no newline); `written` runs once it is durably in the file. False, queueing
  // nothing, once an append has failed or after finish().
  bool push(std::string line, std::function<void()> written = {});
  // Waits until every queued line is written or the writer has failed, and stops the thread.
  void finish();
  // The failed append's error (BatchOutputFile's message), empty while appends succeed.
  std::string failure() const;

 private:
  struct Entry {
    std::string line;
    std::function<void()> written;
  };
  void run();

  BatchOutputFile& out_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool closing_ = false;
  std::string failure_;
  std::thread thread_;
};

}  // namespace exl
