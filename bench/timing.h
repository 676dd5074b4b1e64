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

// The median of `values` (the mean of the middle two for an even count); 0 when empty.
double Median(std::vector<double> values);

// Run count, min, max and median of the given run times (at least one).
TimingResult SummarizeRuns(std::vector<double> seconds);

// The median of the last `count` of `values` (all of them when there are fewer); 0 when empty.
double MedianOfLast(const std::vector<double>& values, int count);

// Calls run() for warm-up and then for the timed runs of `policy`. run() returns false on failure,
// which stops the timing and yields std::nullopt (run() is expected to have reported the error).
std::optional<TimingResult> TimeRepeated(const std::function<bool()>& run,
                                         const TimingPolicy& policy);

// One of the implementations TimeInterleaved alternates.
struct InterleavedRun {
  // One call; returns false on failure (and is expected to have reported the error).
  std::function<bool()> run;
  // Seconds to sleep after each of its chunks, before the next implementation runs: OpenBLAS's
  // workers spin for about 0.1 s after a call and would slow whatever ran next.
  double rest_seconds = 0.0;
  // Its chunk lasts about this share of the common chunk length (at least one call): a short
  // probe such as an FMA burst takes a few calls spread over the round, not a whole chunk.
  double chunk_share = 1.0;
};

// Times several implementations in alternation, so that a slow moment of a shared host falls on
// all of them alike and the ratios of their medians compare like with like. Each is warmed up as
// in TimeRepeated; then every round runs each implementation in turn for a chunk of consecutive
// calls lasting about as long as one call of the slowest (at least 0.1 s), until each has had
// about policy.target_seconds (min_runs to max_runs rounds, at least 5 while a chunk lasts at most
// 0.5 s; min_runs_long rounds when a call exceeds long_run_seconds). Results are in the order of
// `runs`; an implementation whose call fails gets std::nullopt and drops out of the later rounds.
std::vector<std::optional<TimingResult>> TimeInterleaved(const std::vector<InterleavedRun>& runs,
                                                         const TimingPolicy& policy);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_TIMING_H_
