#include "targets.h"

#include <algorithm>
#include <cstdio>
#include <functional>

namespace anyattn_bench {
namespace {

// anyattn's GFLOP/s on `row` (the row must have an anyattn timing).
double AnyattnGflops(const FwdRow& row) {
  return row.flops / row.anyattn->median_seconds * 1e-9;
}

// The row of `rows` with the same shape as `shape` but `dtype` and `threads`, or null.
const FwdRow* FindRow(const std::vector<FwdRow>& rows, FwdShape shape, DType dtype, int threads) {
  shape.dtype = dtype;
  const std::string key = FwdKey(shape);
  for (const FwdRow& row : rows) {
    if (row.threads == threads && row.anyattn && FwdKey(row.shape) == key) return &row;
  }
  return nullptr;
}

// Counts `measured`, the value of the row keyed `key`, into *check, keeping the worst (lowest).
void Record(TargetCheck* check, double measured, const std::string& key) {
  if (check->rows == 0 || measured < check->worst) {
    check->worst = measured;
    check->worst_row = key;
  }
  ++check->rows;
  check->values.push_back(measured);
}

// Folds value(row) over the forward rows at `threads` that `covers` selects and that have a
// value (value returns false when the row has none).
TargetCheck FoldForward(const BenchReport& report, int threads, const std::string& name,
                        const std::string& unit, double threshold,
                        const std::function<bool(const FwdRow&)>& covers,
                        const std::function<bool(const FwdRow&, double*)>& value) {
  TargetCheck check;
  check.name = name;
  check.unit = unit;
  check.threshold = threshold;
  for (const FwdRow& row : report.forward) {
    double measured = 0.0;
    if (row.threads != threads || !row.anyattn || !covers(row) || !value(row, &measured)) continue;
    Record(&check, measured, FwdKey(row.shape));
  }
  return check;
}

// Folds anyattn's percentage of the FMA peak over the backward rows at `threads` that `covers`
// selects.
TargetCheck FoldBackwardPercentOfPeak(const BenchReport& report, int threads,
                                      const std::string& name, double threshold,
                                      const std::function<bool(const BwdRow&)>& covers) {
  TargetCheck check;
  check.name = name;
  check.unit = "% peak";
  check.threshold = threshold;
  for (const BwdRow& row : report.backward) {
    if (row.threads != threads || !row.anyattn || !covers(row)) continue;
    const double gflops = row.flops / row.anyattn->median_seconds * 1e-9;
    Record(&check, 100.0 * gflops / row.peak_gflops, BwdKey(row.shape));
  }
  return check;
}

}  // namespace

double TargetCheck::median() const {
  if (values.empty()) return 0.0;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const size_t middle = sorted.size() / 2;
  return sorted.size() % 2 == 1 ? sorted[middle] : 0.5 * (sorted[middle - 1] + sorted[middle]);
}

std::vector<TargetCheck> CheckTargets(const BenchReport& report, int threads) {
  std::vector<TargetCheck> checks;
  auto percent_of_peak = [](const FwdRow& row, double* value) {
    *value = 100.0 * AnyattnGflops(row) / row.peak_gflops;
    return true;
  };
  auto long_f32 = [](const FwdRow& row, int64_t head_dim, bool causal) {
    return row.shape.dtype == DType::kF32 && row.shape.head_dim == head_dim &&
           row.shape.causal == causal && row.shape.seqlen_q >= 2048;
  };
  checks.push_back(FoldForward(
      report, threads, "f32 D=128 S>=2048 no mask", "% peak", 80.0,
      [&](const FwdRow& row) { return long_f32(row, 128, false); }, percent_of_peak));
  checks.push_back(FoldForward(
      report, threads, "f32 D=64 S>=2048 no mask", "% peak", 70.0,
      [&](const FwdRow& row) { return long_f32(row, 64, false); }, percent_of_peak));
  checks.push_back(FoldForward(
      report, threads, "f32 causal D=64,128 S>=2048", "% peak", 70.0,
      [&](const FwdRow& row) { return long_f32(row, 64, true) || long_f32(row, 128, true); },
      percent_of_peak));
  checks.push_back(FoldForward(
      report, threads, "bf16 rate / f32 rate, S>=2048", "x", 0.9,
      [](const FwdRow& row) {
        return row.shape.dtype == DType::kBf16 && row.shape.seqlen_q >= 2048;
      },
      [&](const FwdRow& row, double* value) {
        const FwdRow* f32 = FindRow(report.forward, row.shape, DType::kF32, row.threads);
        if (f32 == nullptr) return false;
        *value = AnyattnGflops(row) / AnyattnGflops(*f32);
        return true;
      }));
  auto vs_blas = [](const FwdRow& row, double* value) {
    if (!row.baseline) return false;
    *value = row.baseline->median_seconds / row.anyattn->median_seconds;
    return true;
  };
  checks.push_back(FoldForward(
      report, threads, "x OpenBLAS unfused, D=128 S>=2048", "x", 1.4,
      [](const FwdRow& row) { return row.shape.head_dim == 128 && row.shape.seqlen_q >= 2048; },
      vs_blas));
  checks.push_back(FoldForward(
      report, threads, "x OpenBLAS unfused, D=64 S>=2048", "x", 1.8,
      [](const FwdRow& row) { return row.shape.head_dim == 64 && row.shape.seqlen_q >= 2048; },
      vs_blas));
  if (threads != 1) {
    checks.push_back(FoldForward(
        report, threads, "scaling vs 1 thread, S>=2048", "x", 1.85,
        [](const FwdRow& row) { return row.shape.seqlen_q >= 2048; },
        [&](const FwdRow& row, double* value) {
          const FwdRow* single = FindRow(report.forward, row.shape, row.shape.dtype, 1);
          if (single == nullptr) return false;
          *value = AnyattnGflops(row) / AnyattnGflops(*single);
          return true;
        }));
  }

  // Issue 6: f32 backward at S >= 2048, D in {64, 128}; causal rows count useful FLOPs only.
  auto long_f32_backward = [](const BwdRow& row, bool causal) {
    return row.shape.dtype == DType::kF32 &&
           (row.shape.head_dim == 64 || row.shape.head_dim == 128) && row.shape.causal == causal &&
           row.shape.seqlen_q >= 2048;
  };
  checks.push_back(
      FoldBackwardPercentOfPeak(report, threads, "backward f32 D=64,128 S>=2048 no mask", 50.0,
                                [&](const BwdRow& row) { return long_f32_backward(row, false); }));
  checks.push_back(
      FoldBackwardPercentOfPeak(report, threads, "backward f32 causal D=64,128 S>=2048", 45.0,
                                [&](const BwdRow& row) { return long_f32_backward(row, true); }));

  // Issue 3: bf16 caches at Sk = 32768. Issue 5: every decode row (bf16 and f32, B in {1, 8},
  // Sk in {4096, 32768}, dense and paged).
  TargetCheck decode;
  decode.name = "decode bf16 Sk=32768";
  decode.unit = "% read bw";
  decode.threshold = 70.0;
  TargetCheck decode_all = decode;
  decode_all.name = "decode, every row (issue 5)";
  for (const DecodeRow& row : report.decode) {
    if (row.threads != threads || !row.anyattn) continue;
    const double percent =
        100.0 * row.kv_bytes / row.anyattn->median_seconds * 1e-9 / row.read_bandwidth_gbps;
    Record(&decode_all, percent, DecodeKey(row.shape));
    if (row.shape.dtype == DType::kBf16 && row.shape.seqlen_k == 32768) {
      Record(&decode, percent, DecodeKey(row.shape));
    }
  }
  checks.push_back(decode);
  checks.push_back(decode_all);

  TargetCheck rss;
  rss.name = "RSS case: 64 MiB - (peak - inputs - outputs)";
  rss.unit = "MiB";
  rss.threshold = 0.0;
  if (report.rss_case && report.rss_case->ran) {
    Record(&rss,
           64.0 - (report.rss_case->peak_rss_bytes - report.rss_case->inputs_outputs_bytes) /
                      (1024.0 * 1024.0),
           "rss-case");
  }
  checks.push_back(rss);
  return checks;
}

void PrintTargetChecks(const std::vector<TargetCheck>& checks, int threads) {
  std::printf(
      "\nIssue 3, issue 5 (decode) and issue 6 (backward) targets at %d thread(s): worst measured "
      "row against the bar (median over the same rows beside it)\n",
      threads);
  std::printf("%-46s %10s %10s %10s %-10s %s\n", "target", "worst", "median", "bar", "unit",
              "result");
  for (const TargetCheck& check : checks) {
    if (check.rows == 0) {
      std::printf("%-46s %10s %10s %10.2f %-10s not measured in this run\n", check.name.c_str(),
                  "-", "-", check.threshold, check.unit.c_str());
      continue;
    }
    std::printf("%-46s %10.2f %10.2f %10.2f %-10s %s (%d rows; worst %s)\n", check.name.c_str(),
                check.worst, check.median(), check.threshold, check.unit.c_str(),
                check.met() ? "met" : "MISSED", check.rows, check.worst_row.c_str());
  }
  std::fflush(stdout);
}

}  // namespace anyattn_bench
