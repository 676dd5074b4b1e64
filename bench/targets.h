// Issue 3's performance targets and issue 6's backward targets, checked against the rows one run
// measured. The thresholds are the issues'; the measured values come only from the report.
#ifndef ANYATTN_BENCH_TARGETS_H_
#define ANYATTN_BENCH_TARGETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "results.h"

namespace anyattn_bench {

// The forward targets cover shapes with S >= this.
constexpr int64_t kTargetMinSeqlen = 2048;

// Checks every target that the report has rows for, at `threads` threads (issues 3 and 6 set their
// targets at 2); the scaling target compares `threads` with 1 thread. The two ratio targets (bf16
// rate / f32 rate, scaling) take their 'now' values from the paired rows, the other targets from
// the limits measured alongside each row. Targets without rows come back with rows == 0.
std::vector<TargetCheck> CheckTargets(const BenchReport& report, int threads);

// Prints the checks as a small table.
void PrintTargetChecks(const std::vector<TargetCheck>& checks, int threads);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_TARGETS_H_
