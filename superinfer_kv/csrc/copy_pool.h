// A fixed pool of worker threads that memcpy runs between two CPU buffers. Two lanes (swap-out,
// swap-in) with workers alternating between them, so both directions progress at once even
// when one submit is much larger than the other. The pool owns its threads; a CopyJob is
// shared between the caller (who polls or waits) and the workers (who count it down).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "copy_runs.h"

namespace duplexkv {

class CopyJob {
 public:
  CopyJob(const char* src_base, char* dst_base, std::vector<CopyRun> pieces, int num_tasks);

  bool done() const { return pending_.load(std::memory_order_acquire) == 0; }
  void wait();
  // Copies pieces [begin, end); the last task to finish wakes the waiters.
  void run_task(size_t begin, size_t end);
  const std::vector<CopyRun>& pieces() const { return pieces_; }

 private:
  const char* src_base_;
  char* dst_base_;
  std::vector<CopyRun> pieces_;
  std::atomic<int> pending_;
  std::mutex mutex_;
  std::condition_variable finished_;
};

class CopyPool {
 public:
  enum Lane { kSwapOut = 0, kSwapIn = 1 };

  explicit CopyPool(int num_threads);
  // Drains every queued task, then joins: callers' buffers stay valid until their jobs end.
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  std::shared_ptr<CopyJob> submit(const char* src_base, char* dst_base,
                                  std::vector<CopyRun> pieces, Lane lane);
  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  struct Task {
    std::shared_ptr<CopyJob> job;
    size_t begin;
    size_t end;
  };
  void worker_loop(size_t worker_index);
  bool pop_task(size_t& turn, Task& task);

  std::array<std::deque<Task>, 2> lanes_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace duplexkv
