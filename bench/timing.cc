#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

namespace anyattn_bench {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TimingResult SummarizeRuns(std::vector<double> seconds) {
  std::sort(seconds.begin(), seconds.end());
  TimingResult result;
  result.runs = static_cast<int>(seconds.size());
  result.min_seconds = seconds.front();
  result.max_seconds = seconds.back();
  const size_t mid = seconds.size() / 2;
  result.median_seconds =
      seconds.size() % 2 == 1 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
  return result;
}

std::optional<TimingResult> TimeRepeated(const std::function<bool()>& run,
                                         const TimingPolicy& policy) {
  const double warmup_start = NowSeconds();
  double single_run_seconds = 0.0;
  int warmup_runs = 0;
  do {
    const double start = NowSeconds();
    if (!run()) return std::nullopt;
    single_run_seconds = NowSeconds() - start;
    ++warmup_runs;
  } while (NowSeconds() - warmup_start < policy.warmup_seconds);

  int runs =
      static_cast<int>(std::ceil(policy.target_seconds / std::max(single_run_seconds, 1e-9)));
  runs = std::clamp(runs, policy.min_runs, std::max(policy.min_runs, policy.max_runs));
  if (single_run_seconds > policy.long_run_seconds) runs = std::max(1, policy.min_runs_long);

  std::vector<double> seconds;
  seconds.reserve(runs);
  for (int r = 0; r < runs; ++r) {
    const double start = NowSeconds();
    if (!run()) return std::nullopt;
    seconds.push_back(NowSeconds() - start);
  }
  return SummarizeRuns(std::move(seconds));
}

}  // namespace anyattn_bench
