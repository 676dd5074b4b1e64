#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

namespace anyattn_bench {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

TimingResult SummarizeRuns(std::vector<double> seconds) {
  TimingResult result;
  result.runs = static_cast<int>(seconds.size());
  result.min_seconds = *std::min_element(seconds.begin(), seconds.end());
  result.max_seconds = *std::max_element(seconds.begin(), seconds.end());
  result.median_seconds = Median(std::move(seconds));
  return result;
}

namespace {

// Shortest chunk of consecutive calls per implementation and round: long enough that the switch
// between implementations (and a rest) costs little against it.
constexpr double kMinChunkSeconds = 0.1;
// Chunks up to this long get at least kMinShortRounds rounds.
constexpr double kShortChunkSeconds = 0.5;
constexpr int kMinShortRounds = 5;

// Calls run() until policy.warmup_seconds have passed (at least once); returns the last call's
// seconds, or a negative value when a call failed.
double WarmUp(const std::function<bool()>& run, const TimingPolicy& policy) {
  const double warmup_start = NowSeconds();
  double single_run_seconds = 0.0;
  do {
    const double start = NowSeconds();
    if (!run()) return -1.0;
    single_run_seconds = NowSeconds() - start;
  } while (NowSeconds() - warmup_start < policy.warmup_seconds);
  return single_run_seconds;
}

// How many runs (or rounds) lasting `seconds` each make up policy.target_seconds: between
// min_count and policy.max_runs (min_count wins), or policy.min_runs_long (at least 1) when one
// lasts longer than policy.long_run_seconds.
int RepeatCount(const TimingPolicy& policy, double seconds, int min_count) {
  if (seconds > policy.long_run_seconds) return std::max(1, policy.min_runs_long);
  const int count = static_cast<int>(std::ceil(policy.target_seconds / std::max(seconds, 1e-9)));
  return std::clamp(count, min_count, std::max(min_count, policy.max_runs));
}

void Rest(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

double MedianOfLast(const std::vector<double>& values, int count) {
  const size_t taken = std::min(values.size(), static_cast<size_t>(std::max(count, 0)));
  return Median(std::vector<double>(values.end() - taken, values.end()));
}

std::optional<TimingResult> TimeRepeated(const std::function<bool()>& run,
                                         const TimingPolicy& policy) {
  const double single_run_seconds = WarmUp(run, policy);
  if (single_run_seconds < 0) return std::nullopt;

  const int runs = RepeatCount(policy, single_run_seconds, policy.min_runs);

  std::vector<double> seconds;
  seconds.reserve(runs);
  for (int r = 0; r < runs; ++r) {
    const double start = NowSeconds();
    if (!run()) return std::nullopt;
    seconds.push_back(NowSeconds() - start);
  }
  return SummarizeRuns(std::move(seconds));
}

std::vector<std::optional<TimingResult>> TimeInterleaved(const std::vector<InterleavedRun>& runs,
                                                         const TimingPolicy& policy) {
  const size_t count = runs.size();
  std::vector<double> single(count, 0.0);
  std::vector<bool> failed(count, false);
  double slowest = 0.0;
  for (size_t i = 0; i < count; ++i) {
    single[i] = WarmUp(runs[i].run, policy);
    failed[i] = single[i] < 0;
    Rest(runs[i].rest_seconds);
    if (!failed[i]) slowest = std::max(slowest, single[i]);
  }

  const double chunk_seconds = std::max(kMinChunkSeconds, slowest);
  // A median over rounds needs a few of them; below half a second a chunk can afford five.
  const int min_rounds = chunk_seconds <= kShortChunkSeconds
                             ? std::max(policy.min_runs, kMinShortRounds)
                             : policy.min_runs;
  const int rounds = RepeatCount(policy, chunk_seconds, min_rounds);
  std::vector<int> chunk(count, 1);
  for (size_t i = 0; i < count; ++i) {
    const double calls =
        std::floor(runs[i].chunk_share * chunk_seconds / std::max(single[i], 1e-9));
    chunk[i] = static_cast<int>(std::max(calls, 1.0));
  }

  std::vector<std::vector<double>> seconds(count);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < count; ++i) {
      if (failed[i]) continue;
      for (int call = 0; call < chunk[i] && !failed[i]; ++call) {
        const double start = NowSeconds();
        failed[i] = !runs[i].run();
        seconds[i].push_back(NowSeconds() - start);
      }
      Rest(runs[i].rest_seconds);
    }
  }

  std::vector<std::optional<TimingResult>> results(count);
  for (size_t i = 0; i < count; ++i) {
    if (!failed[i]) results[i] = SummarizeRuns(std::move(seconds[i]));
  }
  return results;
}

}  // namespace anyattn_bench
