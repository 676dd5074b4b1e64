#include "thread_team.h"

#include <algorithm>

namespace anyattn_bench {

ThreadTeam::ThreadTeam(int size) : size_(std::max(1, size)) {
  workers_.reserve(size_ - 1);
  for (int member = 1; member < size_; ++member) {
    workers_.emplace_back([this, member] { WorkerLoop(member); });
  }
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  task_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadTeam::Run(const std::function<void(int, int)>& task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    running_ = size_ - 1;
    ++generation_;
  }
  task_ready_.notify_all();
  task(0, size_);
  std::unique_lock<std::mutex> lock(mutex_);
  task_done_.wait(lock, [this] { return running_ == 0; });
  task_ = nullptr;
}

void ThreadTeam::ParallelFor(int64_t count,
                             const std::function<void(int64_t begin, int64_t end)>& body) {
  Run([&](int member, int size) {
    const int64_t begin = count * member / size;
    const int64_t end = count * (member + 1) / size;
    if (begin < end) body(begin, end);
  });
}

void ThreadTeam::WorkerLoop(int member) {
  uint64_t seen_generation = 0;
  while (true) {
    const std::function<void(int, int)>* task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      task_ready_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      task = task_;
    }
    (*task)(member, size_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --running_;
    }
    task_done_.notify_one();
  }
}

}  // namespace anyattn_bench
