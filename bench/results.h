// What one benchmark run measured: the records the table printer and the JSON writer share.
#ifndef ANYATTN_BENCH_RESULTS_H_
#define ANYATTN_BENCH_RESULTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shapes.h"
#include "timing.h"

namespace anyattn_bench {

// This machine's limits for one thread count, measured at start-up.
struct MachineLimits {
  int threads = 0;
  // f32 FMA throughput of `threads` threads running at once, GFLOP/s.
  double fma_peak_gflops = 0.0;
  // The same FMA measurement repeated after the tables: a noise indicator only (the tables use
  // fma_peak_gflops). A large difference means other work shared the cores during the run.
  double fma_peak_gflops_end = 0.0;
  // Streaming read bandwidth of `threads` threads, GB/s: the median of the start-up passes (the
  // decode rows' denominator, as they report medians) and the fastest; 0 if it failed.
  double read_bandwidth_gbps = 0.0;
  double read_bandwidth_best_gbps = 0.0;
};

// One row of the forward table.
struct FwdRow {
  FwdShape shape;
  int threads = 0;
  double flops = 0.0;
  // The FMA peak of `threads` threads, the denominator of the percentage.
  double peak_gflops = 0.0;
  // Median GFLOP/s of the FMA bursts interleaved with the timed calls: the peak at the moment the
  // row ran, the denominator of `%now`. 0 when not measured.
  double peak_now_gflops = 0.0;
  std::optional<TimingResult> anyattn;
  // anyattn's status name and anyattn_last_error() when a call failed.
  std::string anyattn_error;
  std::optional<TimingResult> baseline;
  // Why the baseline did not run ("disabled", "scores 4096 MiB > cap 1024 MiB", ...), if it did
  // not.
  std::string baseline_skipped;
  // max |anyattn out - baseline out| over all elements, or NaN when not both ran.
  double max_abs_diff = 0.0;
  // False when max_abs_diff exceeds the dtype's tolerance.
  bool outputs_agree = true;
};

// One row of the backward table: anyattn_bwd alone, on out and lse from one earlier anyattn_fwd.
struct BwdRow {
  FwdShape shape;
  int threads = 0;
  // Useful backward FLOPs, BwdFlops(shape).
  double flops = 0.0;
  // The FMA peak of `threads` threads, the denominator of the percentage.
  double peak_gflops = 0.0;
  // As in FwdRow: the peak measured alongside the timed calls.
  double peak_now_gflops = 0.0;
  std::optional<TimingResult> anyattn;
  // anyattn's status name and anyattn_last_error() when the forward or a backward call failed.
  std::string anyattn_error;
  // False when some element of dq, dk or dv is NaN or infinite after the timed runs.
  bool gradients_finite = true;
};

// One row of the decode table.
struct DecodeRow {
  DecodeShape shape;
  int threads = 0;
  double kv_bytes = 0.0;
  double read_bandwidth_gbps = 0.0;
  // Copies of K/V that the timed runs cycle through so that each run reads from DRAM, not cache.
  int kv_copies = 1;
  // Whether the K/V buffers asked for transparent 2 MiB pages (CaseSettings::kv_pages).
  bool kv_huge_pages = false;
  std::optional<TimingResult> anyattn;
  std::string anyattn_error;
  // A streaming read of the same bytes from the K/V buffers themselves (same copy rotation, same
  // threads), timed in rounds alternating with the row's calls: the machine's read bandwidth
  // while the row ran, for a ratio that host-level noise moves less.
  std::optional<TimingResult> read_alongside;
};

// What the two calls of a paired row differ in.
enum class PairKind {
  // The same shape in bf16 (the subject) and in f32 (the reference), at the same thread count.
  kBf16VsF32,
  // The same shape and dtype on `threads` threads (the subject) and on one (the reference).
  kThreadsVsOne,
};

// One row of the paired table: two anyattn calls that differ in one setting, timed in
// alternation (TimeInterleaved), so that their ratio sees one state of the host. The ratio
// targets (bf16 rate / f32 rate, 2 threads / 1 thread) otherwise compare rows of the forward
// tables timed minutes apart.
struct PairRow {
  PairKind kind = PairKind::kBf16VsF32;
  // The subject's shape (dtype bf16 for kBf16VsF32).
  FwdShape shape;
  // The subject's thread count; the reference runs on as many (kBf16VsF32) or on one.
  int threads = 0;
  std::optional<TimingResult> subject;
  std::optional<TimingResult> reference;
  // anyattn's status name and anyattn_last_error() when a call failed.
  std::string error;
  // The subject's rate over the reference's: both do the same FLOPs, so the reference's median
  // time over the subject's. Only when both timings exist.
  double rate_ratio() const { return reference->median_seconds / subject->median_seconds; }
};

// The --rss-case measurement: one S=32768, D=128, H=8, f32 forward call in a fresh process.
struct RssCaseResult {
  bool ran = false;
  std::string error;
  int threads = 0;
  int64_t inputs_outputs_bytes = 0;
  int64_t rss_before_call_bytes = 0;
  int64_t peak_rss_bytes = 0;
  double seconds = 0.0;
};

// One target's values over the rows it covers, in row order, and the worst (lowest) of them.
struct TargetValues {
  std::vector<double> values;
  double worst = 0.0;
  // The key of the row that gave `worst`.
  std::string worst_row;
  void Record(double value, const std::string& key);
  // The median of `values` (the mean of the middle two for an even count); 0 when empty.
  double median() const;
};

// One target: the worst measured value over the rows it covers, against its threshold. The
// median over those rows is reported beside it: on a shared host one slow moment decides the
// worst row, and the median shows where a typical row stands. Each row's value is taken twice:
// against the limits measured at start-up (the issues' definition), and against those measured
// alongside the row (FMA bursts between its timed calls, a streaming read right after a decode
// row), which other work on the host moves far less.
struct TargetCheck {
  std::string name;
  // What the value is, e.g. "% of FMA peak" or "x".
  std::string unit;
  double threshold = 0.0;
  TargetValues start;
  TargetValues now;
  int rows() const { return static_cast<int>(start.values.size()); }
  bool met() const { return rows() > 0 && start.worst >= threshold; }
  bool met_now() const { return !now.values.empty() && now.worst >= threshold; }
};

// Everything one invocation measured.
struct BenchReport {
  std::string command_line;
  std::string timestamp;
  std::string cpu_model;
  std::string fma_isa;
  std::string anyattn_version;
  std::string anyattn_isa;
  std::string openblas_corename;
  std::string openblas_config;
  std::string openblas_coretype_env;
  std::string baseline_description;
  TimingPolicy policy;
  std::vector<MachineLimits> limits;
  std::vector<FwdRow> forward;
  std::vector<BwdRow> backward;
  std::vector<DecodeRow> decode;
  std::vector<PairRow> pairs;
  std::optional<RssCaseResult> rss_case;
  // Issue 3's and issue 6's targets checked at target_threads threads.
  int target_threads = 0;
  std::vector<TargetCheck> targets;
  int64_t peak_rss_bytes = 0;
  double total_seconds = 0.0;
  // 1-minute load average when the run started and ended (other work on the machine).
  double load_average_start = 0.0;
  double load_average_end = 0.0;
};

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_RESULTS_H_
