// A fixed team of threads that runs one task on every member and waits for all of them: the
// parallel loops of the unfused baseline (softmax rows, dtype conversion) between its BLAS calls.
// Written by hand because the baseline needs nothing more than this, and an OpenMP runtime in the
// process would spin between regions and disturb the other implementation's timings; idle
// members here sleep on a condition variable.
#ifndef ANYATTN_BENCH_THREAD_TEAM_H_
#define ANYATTN_BENCH_THREAD_TEAM_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anyattn_bench {

class ThreadTeam {
 public:
  // A team of `size` members (at least 1): the calling thread plus size - 1 workers.
  explicit ThreadTeam(int size);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return size_; }

  // Runs task(member, size()) on every member, the caller being member 0, and returns when all
  // have returned. Not reentrant; call from one thread at a time.
  void Run(const std::function<void(int member, int size)>& task);

  // Runs body(begin, end) over [0, count) split into size() contiguous ranges, one per member.
  void ParallelFor(int64_t count, const std::function<void(int64_t begin, int64_t end)>& body);

 private:
  // Body of worker `member`: waits for each new task, runs it, reports completion.
  void WorkerLoop(int member);

  const int size_;
  std::mutex mutex_;
  std::condition_variable task_ready_;
  std::condition_variable task_done_;
  const std::function<void(int, int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_THREAD_TEAM_H_
