#include "runtime/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "runtime/num_threads.h"

namespace anyattn::runtime {
namespace {

thread_local bool t_is_pool_worker = false;

std::atomic<HostParallelFn> g_host_parallel{nullptr};

// A job run through the host's parallel region: each host thread claims tasks from `next` until
// none is left.
struct HostJob {
  std::atomic<int64_t> next{0};
  int64_t tasks = 0;
  TaskFn fn = nullptr;
  void* context = nullptr;

  static void claim_tasks(void* job_pointer, int worker) {
    HostJob& job = *static_cast<HostJob*>(job_pointer);
    for (;;) {
      const int64_t task = job.next.fetch_add(1);
      if (task >= job.tasks) return;
      job.fn(job.context, task, worker);
    }
  }
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Iterations a thread spins (with pause, ~30-140 cycles each) before sleeping: a few tens of
// microseconds. Calls run several phases back to back (pack, attend, merge), so a short spin keeps
// the hand-off cheap; a long one burns the CPU time of oversubscribed machines.
constexpr int kSpinIterations = 2000;

// The job protocol. A job is its descriptor (fn, context, task count, threads) and a ticket, the
// index of the next unclaimed task, or kClosed while the descriptor is being rewritten.
//
// - Tasks are claimed one at a time by fetch-and-add on the ticket, by the caller and by every
//   worker whose index is below the job's thread count. A claim past the last task (or on the
//   closed ticket, a value far above any task count) claims nothing. Each thread adds the tasks
//   it ran to completed_ once, when it finds none left.
// - The caller returns as soon as every task has *completed* (completed_ == task count). It never
//   waits for a worker that has not claimed a task: on a loaded machine a worker that is not
//   scheduled in time simply misses the job, and the caller runs the tasks itself. Waiting for
//   every worker to check in would make a small call wait on a descheduled thread whenever
//   another process holds a core (measured: bench/MEASUREMENTS.md, "The thread pool").
// - A worker touches the ticket only while counted in inside_, and reads the descriptor only
//   after it has seen the ticket open (reopening publishes the descriptor). The next run()
//   closes the ticket, waits for inside_ to drop to 0, rewrites the descriptor and reopens the
//   ticket at 0. Workers enter with inside_.fetch_add before they load the ticket, and the
//   caller closes the ticket before it loads inside_ (all sequentially consistent), so a worker
//   either finds the ticket closed or is seen inside, and the descriptor it reads is stable. The
//   wait is short: a worker is inside across its tasks, which the caller waited for anyway, and one
//   failed claim.
constexpr int64_t kClosed = int64_t{1} << 62;

class Pool {
 public:
  Pool() {
#if defined(__unix__) || defined(__APPLE__)
    pthread_atfork(nullptr, nullptr, [] { instance().reset_after_fork(); });
#endif
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      stopping_ = true;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (std::thread& worker : *workers_) worker.join();
  }

  static Pool& instance() {
    static Pool pool;
    return pool;
  }

  bool try_reserve() {
    return call_mutex_.try_lock();
  }
  void release() {
    call_mutex_.unlock();
  }

  // Requires a reservation. Starts workers so that `threads - 1` exist.
  void ensure_workers(int threads) {
    while (static_cast<int>(workers_->size()) < threads - 1) {
      const int index = static_cast<int>(workers_->size()) + 1;
      // The generation is captured here, not in the new thread: the thread may start running only
      // after the next job has been posted, and must not mistake that job for an old one.
      const uint64_t generation = generation_.load();
      workers_->emplace_back([this, index, generation] { worker_loop(index, generation); });
    }
  }

  // Requires a reservation and ensure_workers(threads).
  void run(int threads, int64_t num_tasks, TaskFn fn, void* context) {
    ticket_.store(kClosed);
    for (int spin = 0; inside_.load() != 0; ++spin) {
      if (spin < kSpinIterations) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    job_fn_ = fn;
    job_context_ = context;
    job_tasks_ = num_tasks;
    job_threads_ = threads;
    completed_.store(0);
    {
      std::lock_guard<std::mutex> lock(state_mutex_);
      ticket_.store(0);
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    claim_tasks(0);
    for (int spin = 0; completed_.load(std::memory_order_acquire) != num_tasks; ++spin) {
      if (spin < kSpinIterations) {
        cpu_relax();
      } else {
        std::unique_lock<std::mutex> lock(state_mutex_);
        done_.wait(lock, [&] { return completed_.load() == num_tasks; });
      }
    }
  }

 private:
  // Claims and runs tasks of the current job until none is left. The caller (worker 0) always
  // may; a worker must be counted in inside_.
  void claim_tasks(int worker) {
    int64_t ran = 0;
    for (;;) {
      const int64_t task = ticket_.fetch_add(1);
      if (task >= job_tasks_) break;
      job_fn_(job_context_, task, worker);
      ++ran;
    }
    if (ran == 0) return;
    // The caller waits only after its own last claim: a worker completing the job wakes it.
    if (completed_.fetch_add(ran, std::memory_order_acq_rel) + ran == job_tasks_ && worker != 0) {
      std::lock_guard<std::mutex> lock(state_mutex_);
      done_.notify_all();
    }
  }

  void worker_loop(int index, uint64_t seen) {
    t_is_pool_worker = true;
    for (;;) {
      int spin = 0;
      while (generation_.load(std::memory_order_acquire) == seen && spin < kSpinIterations) {
        cpu_relax();
        ++spin;
      }
      {
        std::unique_lock<std::mutex> lock(state_mutex_);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        seen = generation_.load();
        if (stopping_) return;
      }
      inside_.fetch_add(1);
      // An open ticket was published after its descriptor: only then may the descriptor be read.
      if (ticket_.load() < kClosed && index < job_threads_) claim_tasks(index);
      inside_.fetch_sub(1);
    }
  }

  // In a forked child only the forking thread exists: forget the parent's workers (their handles
  // are leaked on purpose; joining them would hang) and start afresh. The abandoned handles stay
  // reachable from abandoned_after_fork_ so that LeakSanitizer does not report them at exit.
  void reset_after_fork() {
    abandoned_after_fork_ = new AbandonedWorkers{workers_.release(), abandoned_after_fork_};
    workers_ = std::make_unique<std::vector<std::thread>>();
    new (&call_mutex_) std::mutex();
    new (&state_mutex_) std::mutex();
    new (&wake_) std::condition_variable();
    new (&done_) std::condition_variable();
    inside_.store(0);
    ticket_.store(kClosed);
    job_threads_ = 0;
  }

  struct AbandonedWorkers {
    std::vector<std::thread>* workers;
    AbandonedWorkers* next;
  };
  static inline AbandonedWorkers* abandoned_after_fork_ = nullptr;

  std::mutex call_mutex_;   // held by the lease owner for a whole call
  std::mutex state_mutex_;  // guards stopping_ and the condition variables' predicates
  std::condition_variable wake_;
  std::condition_variable done_;
  std::unique_ptr<std::vector<std::thread>> workers_ = std::make_unique<std::vector<std::thread>>();
  std::atomic<uint64_t> generation_{0};  // bumped per job: wakes the workers
  std::atomic<int64_t> ticket_{kClosed};
  std::atomic<int64_t> completed_{0};
  std::atomic<int> inside_{0};  // workers that may read the descriptor below
  // The descriptor: written by run() only while the ticket is closed and inside_ is 0.
  TaskFn job_fn_ = nullptr;
  void* job_context_ = nullptr;
  int64_t job_tasks_ = 0;
  int job_threads_ = 0;
  bool stopping_ = false;
};

}  // namespace

void set_host_parallel(HostParallelFn parallel) { g_host_parallel.store(parallel); }

PoolLease acquire_pool(int requested_threads) {
  if (t_is_pool_worker) return PoolLease(1, false);
  Pool& pool = Pool::instance();
  if (!pool.try_reserve()) return PoolLease(1, false);
  const int threads = requested_threads < 1             ? 1
                      : requested_threads > kMaxThreads ? kMaxThreads
                                                        : requested_threads;
  if (g_host_parallel.load() != nullptr) return PoolLease(threads, true);
  try {
    pool.ensure_workers(threads);
  } catch (...) {
    pool.release();
    return PoolLease(1, false);
  }
  return PoolLease(threads, true);
}

PoolLease::PoolLease(PoolLease&& other) noexcept
    : num_threads_(other.num_threads_), owns_pool_(other.owns_pool_) {
  other.owns_pool_ = false;
}

PoolLease::~PoolLease() {
  if (owns_pool_) Pool::instance().release();
}

void PoolLease::run(int64_t num_tasks, TaskFn fn, void* context) const {
  if (num_tasks <= 0) return;
  if (num_threads_ <= 1 || num_tasks == 1) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(context, task, 0);
    return;
  }
  if (const HostParallelFn host = g_host_parallel.load()) {
    HostJob job;
    job.tasks = num_tasks;
    job.fn = fn;
    job.context = context;
    host(static_cast<int>(std::min<int64_t>(num_threads_, num_tasks)), &HostJob::claim_tasks,
         &job);
    return;
  }
  Pool::instance().run(num_threads_, num_tasks, fn, context);
}

}  // namespace anyattn::runtime
