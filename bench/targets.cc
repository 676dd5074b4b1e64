#include "targets.h"

#include <cstdio>
#include <functional>
#include <string>

#include "bench_cases.h"

namespace anyattn_bench {
namespace {

// One row's value for a target: against the limits measured at start-up, and against those
// measured alongside the row.
struct RowValue {
  double start = 0.0;
  double now = 0.0;
};

// anyattn's GFLOP/s on `row` (the row must have an anyattn timing).
double AnyattnGflops(const FwdRow& row) {
  return row.flops / row.anyattn->median_seconds * 1e-9;
}

// anyattn's share of the FMA peak on `row`, at start-up and alongside.
RowValue ShareOfPeak(const FwdRow& row) {
  return {AnyattnGflops(row) / row.peak_gflops, AnyattnGflops(row) / row.peak_now_gflops};
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

void Record(TargetCheck* check, const RowValue& value, const std::string& key) {
  check->start.Record(value.start, key);
  check->now.Record(value.now, key);
}

TargetCheck NewCheck(const std::string& name, const std::string& unit, double threshold) {
  TargetCheck check;
  check.name = name;
  check.unit = unit;
  check.threshold = threshold;
  return check;
}

// Folds value(row) over the forward rows at `threads` that `covers` selects and that have a
// value (value returns false when the row has none).
TargetCheck FoldForward(const BenchReport& report, int threads, const std::string& name,
                        const std::string& unit, double threshold,
                        const std::function<bool(const FwdRow&)>& covers,
                        const std::function<bool(const FwdRow&, RowValue*)>& value) {
  TargetCheck check = NewCheck(name, unit, threshold);
  for (const FwdRow& row : report.forward) {
    RowValue measured;
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
  TargetCheck check = NewCheck(name, "% peak", threshold);
  for (const BwdRow& row : report.backward) {
    if (row.threads != threads || !row.anyattn || !covers(row)) continue;
    const double gflops = row.flops / row.anyattn->median_seconds * 1e-9;
    Record(&check, {100.0 * gflops / row.peak_gflops, 100.0 * gflops / row.peak_now_gflops},
           BwdKey(row.shape));
  }
  return check;
}

// The rate ratios of the complete pairs of `kind` at `threads` threads: the 'now' values of the
// two ratio targets.
TargetValues PairValues(const BenchReport& report, PairKind kind, int threads) {
  TargetValues values;
  for (const PairRow& row : report.pairs) {
    if (row.kind != kind || row.threads != threads || !row.subject || !row.reference) continue;
    values.Record(row.rate_ratio(), PairKey(row.kind, row.shape, row.threads));
  }
  return values;
}

}  // namespace

void TargetValues::Record(double value, const std::string& key) {
  if (values.empty() || value < worst) {
    worst = value;
    worst_row = key;
  }
  values.push_back(value);
}

double TargetValues::median() const {
  return Median(values);
}

std::vector<TargetCheck> CheckTargets(const BenchReport& report, int threads) {
  std::vector<TargetCheck> checks;
  auto percent_of_peak = [](const FwdRow& row, RowValue* value) {
    const RowValue share = ShareOfPeak(row);
    *value = {100.0 * share.start, 100.0 * share.now};
    return true;
  };
  auto long_f32 = [](const FwdRow& row, int64_t head_dim, bool causal) {
    return row.shape.dtype == DType::kF32 && row.shape.head_dim == head_dim &&
           row.shape.causal == causal && row.shape.seqlen_q >= kTargetMinSeqlen;
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
  // Start-up: the two forward rows' rates; now: the bf16 / f32 pairs, timed in alternation.
  TargetCheck bf16_rate = FoldForward(
      report, threads, "bf16 rate / f32 rate, S>=2048", "x", 0.9,
      [](const FwdRow& row) {
        return row.shape.dtype == DType::kBf16 && row.shape.seqlen_q >= kTargetMinSeqlen;
      },
      [&](const FwdRow& row, RowValue* value) {
        const FwdRow* f32 = FindRow(report.forward, row.shape, DType::kF32, row.threads);
        if (f32 == nullptr) return false;
        value->start = AnyattnGflops(row) / AnyattnGflops(*f32);
        return true;
      });
  bf16_rate.now = PairValues(report, PairKind::kBf16VsF32, threads);
  checks.push_back(bf16_rate);
  // Timed in alternation already: one value.
  auto vs_blas = [](const FwdRow& row, RowValue* value) {
    if (!row.baseline) return false;
    const double ratio = row.baseline->median_seconds / row.anyattn->median_seconds;
    *value = {ratio, ratio};
    return true;
  };
  checks.push_back(FoldForward(
      report, threads, "x OpenBLAS unfused, D=128 S>=2048", "x", 1.4,
      [](const FwdRow& row) {
        return row.shape.head_dim == 128 && row.shape.seqlen_q >= kTargetMinSeqlen;
      },
      vs_blas));
  checks.push_back(FoldForward(
      report, threads, "x OpenBLAS unfused, D=64 S>=2048", "x", 1.8,
      [](const FwdRow& row) {
        return row.shape.head_dim == 64 && row.shape.seqlen_q >= kTargetMinSeqlen;
      },
      vs_blas));
  // Start-up: the two forward rows' rates; now: the thread pairs, timed in alternation.
  if (threads != 1) {
    TargetCheck scaling = FoldForward(
        report, threads, "scaling vs 1 thread, S>=2048", "x", 1.85,
        [](const FwdRow& row) { return row.shape.seqlen_q >= kTargetMinSeqlen; },
        [&](const FwdRow& row, RowValue* value) {
          const FwdRow* single = FindRow(report.forward, row.shape, row.shape.dtype, 1);
          if (single == nullptr) return false;
          value->start = AnyattnGflops(row) / AnyattnGflops(*single);
          return true;
        });
    scaling.now = PairValues(report, PairKind::kThreadsVsOne, threads);
    checks.push_back(scaling);
  }

  // Issue 6: f32 backward at S >= 2048, D in {64, 128}; causal rows count useful FLOPs only.
  auto long_f32_backward = [](const BwdRow& row, bool causal) {
    return row.shape.dtype == DType::kF32 &&
           (row.shape.head_dim == 64 || row.shape.head_dim == 128) && row.shape.causal == causal &&
           row.shape.seqlen_q >= kTargetMinSeqlen;
  };
  checks.push_back(
      FoldBackwardPercentOfPeak(report, threads, "backward f32 D=64,128 S>=2048 no mask", 50.0,
                                [&](const BwdRow& row) { return long_f32_backward(row, false); }));
  checks.push_back(
      FoldBackwardPercentOfPeak(report, threads, "backward f32 causal D=64,128 S>=2048", 45.0,
                                [&](const BwdRow& row) { return long_f32_backward(row, true); }));

  // Issue 3: bf16 caches at Sk = 32768. Issue 5: every decode row (bf16, f16 and f32, B in
  // {1, 8}, Sk in {4096, 32768}, dense and paged). Alongside: the streaming read timed after the
  // row. The MLA rows are not part of these tables (they have no target: they print their ratios
  // only). Issue 36: 8-bit caches (decode rows; not the chunked-prefill rows) read >= 80% of the
  // read bandwidth.
  TargetCheck decode = NewCheck("decode bf16 Sk=32768", "% read bw", 70.0);
  TargetCheck decode_all = NewCheck("decode, every row (issue 5)", "% read bw", 70.0);
  TargetCheck decode_8bit = NewCheck("decode 8-bit caches (issue 36)", "% read bw", 80.0);
  for (const DecodeRow& row : report.decode) {
    if (row.threads != threads || !row.anyattn || IsMlaDecode(row.shape) ||
        row.shape.seqlen_q > 1) {
      continue;
    }
    const std::string key = DecodeKey(row.shape);
    const bool kv8 = row.shape.cache != CacheFormat::kAsQ;
    TargetCheck& all = kv8 ? decode_8bit : decode_all;
    const bool bf16_long =
        !kv8 && row.shape.dtype == DType::kBf16 && row.shape.seqlen_k == 32768;
    const double percent =
        100.0 * row.kv_bytes / row.anyattn->median_seconds * 1e-9 / row.read_bandwidth_gbps;
    all.start.Record(percent, key);
    if (bf16_long) decode.start.Record(percent, key);
    if (!row.read_alongside) continue;
    const double percent_now =
        100.0 * row.read_alongside->median_seconds / row.anyattn->median_seconds;
    all.now.Record(percent_now, key);
    if (bf16_long) decode.now.Record(percent_now, key);
  }
  checks.push_back(decode);
  checks.push_back(decode_all);
  checks.push_back(decode_8bit);

  TargetCheck rss = NewCheck("RSS case: 64 MiB - (peak - inputs - outputs)", "MiB", 0.0);
  if (report.rss_case && report.rss_case->ran) {
    const double headroom =
        64.0 - (report.rss_case->peak_rss_bytes - report.rss_case->inputs_outputs_bytes) /
                   (1024.0 * 1024.0);
    Record(&rss, {headroom, headroom}, "rss-case");
  }
  checks.push_back(rss);
  return checks;
}

void PrintTargetChecks(const std::vector<TargetCheck>& checks, int threads) {
  std::printf(
      "\nIssue 3, issue 5 (decode) and issue 6 (backward) targets at %d thread(s): worst measured "
      "row against the bar (median over the same rows beside it); 'now' = each row against the "
      "limits measured alongside it (see the tables), and for the two ratio targets the paired "
      "rows (two calls timed in alternation)\n",
      threads);
  std::printf("%-46s %8s %8s %9s %9s %7s %-9s %s\n", "target", "worst", "median", "worst now",
              "med. now", "bar", "unit", "result");
  // A value, or "-" where the target has none of that kind.
  auto cell = [](const TargetValues& values, double value, int width) {
    char text[32];
    if (values.values.empty()) {
      std::snprintf(text, sizeof(text), "%*s", width, "-");
    } else {
      std::snprintf(text, sizeof(text), "%*.2f", width, value);
    }
    return std::string(text);
  };
  for (const TargetCheck& check : checks) {
    if (check.start.values.empty() && check.now.values.empty()) {
      std::printf("%-46s %8s %8s %9s %9s %7.2f %-9s not measured in this run\n", check.name.c_str(),
                  "-", "-", "-", "-", check.threshold, check.unit.c_str());
      continue;
    }
    const TargetValues& described = check.start.values.empty() ? check.now : check.start;
    std::printf("%-46s %s %s %s %s %7.2f %-9s %s, now %s (%zu rows; worst %s)\n",
                check.name.c_str(), cell(check.start, check.start.worst, 8).c_str(),
                cell(check.start, check.start.median(), 8).c_str(),
                cell(check.now, check.now.worst, 9).c_str(),
                cell(check.now, check.now.median(), 9).c_str(), check.threshold, check.unit.c_str(),
                check.start.values.empty() ? "-" : (check.met() ? "met" : "MISSED"),
                check.now.values.empty() ? "-" : (check.met_now() ? "met" : "MISSED"),
                described.values.size(), described.worst_row.c_str());
  }
  std::fflush(stdout);
}

}  // namespace anyattn_bench
