// A row's timed calls interleaved with FMA bursts, so that its percentage of the peak is taken
// against what the cores delivered while it ran (`%now` in the forward and backward tables).
#ifndef ANYATTN_BENCH_PEAK_ALONGSIDE_H_
#define ANYATTN_BENCH_PEAK_ALONGSIDE_H_

#include <functional>
#include <optional>

#include "timing.h"

namespace anyattn_bench {

// Length of each FMA burst (FmaBurst) interleaved with a row's timed calls, and the share of each
// round's chunk length they take (at least one burst per round): rows of long calls get several
// bursts per round, so that the median burst samples as much of the row's time as it can.
constexpr double kPeakBurstSeconds = 0.03;
constexpr double kPeakBurstShare = 0.2;

struct TimedAlongsidePeak {
  std::optional<TimingResult> anyattn;
  // Median GFLOP/s of the bursts that ran between the timed calls.
  double peak_now_gflops = 0.0;
  // The peer's timing, when one was given and its calls succeeded.
  std::optional<TimingResult> peer;
};

// Times `anyattn`, FMA bursts on `threads` threads (kPeakBurstShare of each round) and, when
// given, `peer`, in alternation (TimeInterleaved). anyattn comes first in each round, right after
// the previous round's rest, which costs it, not the others, any wake-up.
TimedAlongsidePeak TimeAlongsidePeak(int threads, const std::function<bool()>& anyattn,
                                     const InterleavedRun* peer, const TimingPolicy& policy);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_PEAK_ALONGSIDE_H_
