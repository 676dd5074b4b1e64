#include "peak_alongside.h"

#include <vector>

#include "machine_limits.h"

namespace anyattn_bench {

TimedAlongsidePeak TimeAlongsidePeak(int threads, const std::function<bool()>& anyattn,
                                     const InterleavedRun* peer, const TimingPolicy& policy) {
  const FmaBurst burst(threads, kPeakBurstSeconds);
  std::vector<double> burst_gflops;
  std::vector<InterleavedRun> runs(2);
  runs[0].run = anyattn;
  runs[1].run = [&] {
    burst_gflops.push_back(burst.Run());
    return true;
  };
  runs[1].chunk_share = kPeakBurstShare;
  if (peer != nullptr) runs.push_back(*peer);
  const std::vector<std::optional<TimingResult>> timings = TimeInterleaved(runs, policy);
  TimedAlongsidePeak result;
  result.anyattn = timings[0];
  // The warm-up bursts came first; the timed ones are the last `runs`.
  result.peak_now_gflops = MedianOfLast(burst_gflops, timings[1]->runs);
  if (peer != nullptr) result.peer = timings[2];
  return result;
}

}  // namespace anyattn_bench
