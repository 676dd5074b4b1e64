// Threads released together on disjoint slices of one buffer, timed from the release to the
// last thread's end: the streaming reads of anyattn_bench (read_bandwidth.cc).
#ifndef ANYATTN_BENCH_RELEASED_THREADS_H_
#define ANYATTN_BENCH_RELEASED_THREADS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace anyattn_bench {

// Runs body(thread_index) on `threads` threads released together; returns the wall-clock seconds
// from release to the last thread's end.
template <typename Body>
double TimeOnThreads(int threads, const Body& body) {
  using Clock = std::chrono::steady_clock;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<Clock::time_point> ends(threads);
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(t);
      ends[t] = Clock::now();
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const Clock::time_point start = Clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& worker : workers) worker.join();
  // To the last thread's end, not to the joins: exiting and joining the threads takes tens of
  // microseconds, which a pass over a few MiB would count.
  return std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - start).count();
}

// Floats [begin, end) of a count-float buffer that thread t of `threads` reads: whole 64-float
// chunks, the last thread taking the remainder.
struct ThreadSlice {
  size_t begin;
  size_t end;
};

inline ThreadSlice SliceOf(size_t count, int threads, int t) {
  constexpr size_t kChunkFloats = 64;
  const size_t chunks_per_thread = count / kChunkFloats / threads;
  const size_t begin = t * chunks_per_thread * kChunkFloats;
  return {begin, t == threads - 1 ? count : begin + chunks_per_thread * kChunkFloats};
}

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_RELEASED_THREADS_H_
