// Worker threads and job bookkeeping for the CPU backend (see copy_pool.h).
#include "copy_pool.h"

#include <cstring>

namespace duplexkv {

CopyJob::CopyJob(const char* src_base, char* dst_base, std::vector<CopyRun> pieces,
                 int num_tasks)
    : src_base_(src_base), dst_base_(dst_base), pieces_(std::move(pieces)),
      pending_(num_tasks) {}

void CopyJob::wait() {
  if (done()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [this] { return done(); });
}

void CopyJob::run_task(size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    const CopyRun& piece = pieces_[i];
    std::memcpy(dst_base_ + piece.dst_offset, src_base_ + piece.src_offset,
                static_cast<size_t>(piece.bytes));
  }
  // Taking the lock before notifying closes the gap between a waiter's check and its sleep.
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.notify_all();
  }
}

CopyPool::CopyPool(int num_threads) {
  const int count = num_threads < 1 ? 1 : num_threads;
  workers_.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    workers_.emplace_back([this, i] { worker_loop(static_cast<size_t>(i)); });
  }
}

CopyPool::~CopyPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

// Splits the pieces into about two tasks per thread of roughly equal bytes.
std::shared_ptr<CopyJob> CopyPool::submit(const char* src_base, char* dst_base,
                                          std::vector<CopyRun> pieces, Lane lane) {
  int64_t total_bytes = 0;
  for (const CopyRun& piece : pieces) total_bytes += piece.bytes;
  const int64_t wanted = static_cast<int64_t>(workers_.size()) * 2;
  const int64_t num_tasks = std::max<int64_t>(1, std::min<int64_t>(wanted, pieces.size()));
  std::vector<Task> tasks;
  auto job = std::make_shared<CopyJob>(src_base, dst_base, std::move(pieces),
                                       static_cast<int>(num_tasks));
  const std::vector<CopyRun>& all = job->pieces();
  size_t begin = 0;
  int64_t cumulative = 0;
  for (int64_t t = 1; t <= num_tasks; ++t) {
    const int64_t target = total_bytes * t / num_tasks;
    size_t end = begin;
    while (end < all.size() && (cumulative < target || t == num_tasks)) {
      cumulative += all[end].bytes;
      ++end;
    }
    tasks.push_back({job, begin, end});
    begin = end;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Task& task : tasks) lanes_[lane].push_back(std::move(task));
  }
  work_ready_.notify_all();
  return job;
}

bool CopyPool::pop_task(size_t& turn, Task& task) {
  std::unique_lock<std::mutex> lock(mutex_);
  work_ready_.wait(lock, [this] {
    return stopping_ || !lanes_[0].empty() || !lanes_[1].empty();
  });
  for (size_t attempt = 0; attempt < 2; ++attempt, ++turn) {
    std::deque<Task>& lane = lanes_[turn % 2];
    if (!lane.empty()) {
      task = std::move(lane.front());
      lane.pop_front();
      ++turn;  // the next pick starts from the other lane
      return true;
    }
  }
  return false;  // stopping and both lanes drained
}

void CopyPool::worker_loop(size_t worker_index) {
  size_t turn = worker_index;
  Task task;
  while (pop_task(turn, task)) {
    task.job->run_task(task.begin, task.end);
    task.job.reset();
  }
}

}  // namespace duplexkv
