// The persistent thread pool (src/runtime/thread_pool.h): every task of every job runs exactly
// once, on a worker index below the lease's thread count, and a job's tasks have all completed
// when run() returns, however the workers are scheduled. The tests are named Reliability* so that
// the TSan stage (`ctest --preset tsan -R Reliability`) runs them: they stress the hand-off of one
// job to the next, where a late worker must neither run an old job's task nor read a job that is
// being rewritten.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "runtime/thread_pool.h"

namespace anyattn::runtime {
namespace {

// Runs `tasks` tasks on `lease` and checks that each ran once, on a valid worker index, and had
// finished (its side effect visible) when run() returned.
void expect_each_task_once(const PoolLease& lease, int64_t tasks) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
  std::vector<int> written(static_cast<size_t>(tasks), 0);
  std::atomic<bool> bad_worker{false};
  lease.run_each(tasks, [&](int64_t task, int worker) {
    if (worker < 0 || worker >= lease.num_threads()) bad_worker = true;
    runs[static_cast<size_t>(task)].fetch_add(1);
    written[static_cast<size_t>(task)] = static_cast<int>(task) + 1;  // plain write: run() joins it
  });
  EXPECT_FALSE(bad_worker.load());
  for (int64_t task = 0; task < tasks; ++task) {
    ASSERT_EQ(runs[static_cast<size_t>(task)].load(), 1) << "task " << task << " of " << tasks;
    ASSERT_EQ(written[static_cast<size_t>(task)], task + 1) << "task " << task << " of " << tasks;
  }
}

TEST(ReliabilityThreadPool, EveryTaskRunsExactlyOnceForAnyThreadAndTaskCount) {
  for (int threads : {1, 2, 3, 8}) {
    const PoolLease lease = acquire_pool(threads);
    ASSERT_EQ(lease.num_threads(), threads);
    for (int64_t tasks : {0, 1, 2, 3, 7, 64, 1000}) {
      SCOPED_TRACE(testing::Message() << threads << " threads, " << tasks << " tasks");
      expect_each_task_once(lease, tasks);
    }
  }
}

// Thousands of tiny jobs back to back: workers routinely wake for a job that is already done, or
// enter while the next one is being posted.
TEST(ReliabilityThreadPool, ManyTinyJobsBackToBack) {
  const PoolLease lease = acquire_pool(4);
  for (int job = 0; job < 5000; ++job) {
    expect_each_task_once(lease, 2 + job % 5);
  }
}

// A lease of fewer threads than the pool has workers: the others stay out of its jobs. Each task
// sleeps a little, so that the other workers, woken by every job, are running while tasks are
// still unclaimed (with instant tasks the two leased threads would finish before they wake).
TEST(ReliabilityThreadPool, WorkersBeyondTheLeaseStayOut) {
  { const PoolLease wide = acquire_pool(6); }
  const PoolLease narrow = acquire_pool(2);
  ASSERT_EQ(narrow.num_threads(), 2);
  std::atomic<int> highest{0};
  for (int job = 0; job < 100; ++job) {
    narrow.run_each(16, [&](int64_t, int worker) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      int seen = highest.load();
      while (worker > seen && !highest.compare_exchange_weak(seen, worker)) {
      }
    });
  }
  EXPECT_LT(highest.load(), 2);
}

// While one caller holds the pool, another caller (and a task asking from inside the pool) gets a
// one-thread lease that runs inline, and both callers' results are complete.
TEST(ReliabilityThreadPool, BusyPoolAndNestedCallsRunInline) {
  const PoolLease lease = acquire_pool(3);
  std::atomic<int> nested_threads{0};
  lease.run_each(8, [&](int64_t, int) {
    const PoolLease inner = acquire_pool(3);
    nested_threads.fetch_add(inner.num_threads());
    expect_each_task_once(inner, 5);
  });
  EXPECT_EQ(nested_threads.load(), 8);

  std::thread other([] {
    const PoolLease second = acquire_pool(4);
    EXPECT_EQ(second.num_threads(), 1);
    expect_each_task_once(second, 33);
  });
  expect_each_task_once(lease, 100);
  other.join();
}

}  // namespace
}  // namespace anyattn::runtime
