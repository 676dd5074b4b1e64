// Repeated timing with warm-up and medians: the one way every implementation is timed, so that the
// ratios in a row compare like with like.
#ifndef ANYATTN_BENCH_TIMING_H_
#define ANYATTN_BENCH_TIMING_H_

#include <functional>
#include <optional>
#include <vector>

namespace anyattn_bench {

// How many times a case runs. After warm-up, the timed run count is
// clamp(ceil(target_seconds / warm-up run time), min_runs, max_runs), except that a case whose
// single run exceeds long_run_seconds runs min_runs_long times, to keep the whole run bounded.
struct TimingPolicy {
  // Warm-up: at least one run, repeated until warmup_seconds have passed. 0.1 s also lets the
  // other implementation's idle threads (OpenBLAS spins about 0.1 s after a call) go to sleep.
  double warmup_seconds = 0.1;
  double target_seconds = 0.5;
  int min_runs = 3;
  int max_runs = 25;
  double long_run_seconds = 2.0;
  int min_runs_long = 2;
};

// Summary of the timed runs of one case, in seconds.
struct TimingResult {
  double median_seconds = 0.0;
  double min_seconds = 0.0;
  double max_seconds = 0.0;
  int runs = 0;
};

// Seconds on a monotonic clock.
double NowSeconds();

// Run count, min, max and median of the given run times (at least one).
TimingResult SummarizeRuns(std::vector<double> seconds);

// Calls run() for warm-up and then for the timed runs of `policy`. run() returns false on failure,
// which stops the timing and yields std::nullopt (run() is expected to have reported the error).
std::optional<TimingResult> TimeRepeated(const std::function<bool()>& run,
                                         const TimingPolicy& policy);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_TIMING_H_
