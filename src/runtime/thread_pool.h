// A persistent pool of worker threads shared by every anyattn call in the process.
//
// Written by hand rather than taken from a library because the contract is narrow and unusual:
// no thread creation per call; a call that finds the pool busy (another caller thread) or that runs
// on a pool worker runs inline on its own thread instead of oversubscribing cores; the pool
// survives fork() (the child recreates workers on first use); and it coexists with OpenMP (PyTorch)
// and rayon (candle) pools, which it knows nothing about. A host may instead run the library's
// parallel phases on its own threads (set_host_parallel below).
//
// Work is handed out as task indices from one atomic counter, so the mapping of tasks to threads
// varies from run to run. Kernels make results independent of that mapping: every output element
// is produced by exactly one task, in a fixed order. A job returns when its last task is done,
// without waiting for workers that never took one (a worker the OS has not scheduled yet simply
// misses the job).
#ifndef ANYATTN_RUNTIME_THREAD_POOL_H_
#define ANYATTN_RUNTIME_THREAD_POOL_H_

#include <cstdint>

namespace anyattn::runtime {

// A task body: called as fn(context, task_index, worker_index).
using TaskFn = void (*)(void* context, int64_t task_index, int worker_index);

// A host runtime's parallel region (anyattn_host_parallel_fn, anyattn.h): runs body(context,
// worker) once on each of up to `threads` of the host's threads, worker indices distinct and below
// `threads`, and returns when all have returned; possibly just once, on the caller, as worker 0.
using HostParallelFn = void (*)(int threads, void (*body)(void* context, int worker),
                                void* context);

// Runs every later PoolLease::run of more than one thread through `parallel` instead of the pool's
// workers (null: the pool again; anyattn_set_host_parallel). Leases keep their meaning: one caller
// at a time holds the threads (others run inline), and worker indices stay below num_threads().
// Tasks are still claimed one at a time from one counter, so the bodies the host runs complete
// them whatever their number.
void set_host_parallel(HostParallelFn parallel);

class PoolLease;

// Reserves up to `requested_threads` threads (the caller's own included) for one call. The lease
// has fewer threads, possibly 1, when the pool is busy with another call or when called from a
// pool worker. Never blocks on another caller.
PoolLease acquire_pool(int requested_threads);

// Exclusive use of the pool's workers for the lifetime of the object. Move-only.
class PoolLease {
 public:
  PoolLease(PoolLease&& other) noexcept;
  PoolLease& operator=(PoolLease&&) = delete;
  PoolLease(const PoolLease&) = delete;
  ~PoolLease();

  // Threads that run() uses, the caller included; worker_index is always < num_threads().
  int num_threads() const { return num_threads_; }
  // True when this lease holds the pool exclusively, so state guarded by the pool (such as a
  // workspace kept between calls) may be used.
  bool owns_pool() const { return owns_pool_; }

  // Runs fn(context, i, worker) for every i in [0, num_tasks), lowest indices first, and returns
  // when all have finished. fn must not throw.
  void run(int64_t num_tasks, TaskFn fn, void* context) const;

  // Convenience overload for a callable `body(int64_t task_index, int worker_index)`.
  template <class Body>
  void run_each(int64_t num_tasks, const Body& body) const {
    run(
        num_tasks,
        [](void* context, int64_t task, int worker) {
          (*static_cast<const Body*>(context))(task, worker);
        },
        const_cast<Body*>(&body));
  }

 private:
  friend PoolLease acquire_pool(int requested_threads);
  PoolLease(int num_threads, bool owns_pool) : num_threads_(num_threads), owns_pool_(owns_pool) {}

  int num_threads_;
  bool owns_pool_;
};

}  // namespace anyattn::runtime

#endif  // ANYATTN_RUNTIME_THREAD_POOL_H_
