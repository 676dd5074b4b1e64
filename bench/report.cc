#include "report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "bench_cases.h"
#include "json_writer.h"
#include "process_info.h"

namespace anyattn_bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// GFLOP/s of `flops` done in `seconds`.
double Gflops(double flops, double seconds) {
  return flops / seconds * 1e-9;
}

// Writes a TimingResult as an object with times in milliseconds.
void WriteTiming(JsonWriter* json, const TimingResult& timing) {
  json->BeginObject();
  json->Field("median_ms", timing.median_seconds * 1e3);
  json->Field("min_ms", timing.min_seconds * 1e3);
  json->Field("max_ms", timing.max_seconds * 1e3);
  json->Field("runs", timing.runs);
  json->EndObject();
}

// Writes the fields of a dense shape: dtype, mask, batch, lengths, heads, head dim.
void WriteShapeFields(JsonWriter* json, const FwdShape& shape) {
  json->Field("dtype", DTypeName(shape.dtype));
  json->Field("mask", shape.causal ? "causal" : "none");
  json->Field("batch", shape.batch);
  json->Field("seqlen_q", shape.seqlen_q);
  json->Field("seqlen_k", shape.seqlen_k);
  json->Field("heads_q", shape.heads_q);
  json->Field("heads_k", shape.heads_k);
  json->Field("head_dim", shape.head_dim);
}

// Writes the fields every forward and backward row shares: key, shape, threads, FLOPs, peaks.
void WriteRowFields(JsonWriter* json, const std::string& key, const FwdShape& shape, int threads,
                    double flops, double peak_gflops, double peak_now_gflops) {
  json->Field("key", key);
  WriteShapeFields(json, shape);
  json->Field("threads", threads);
  json->Field("flops", flops);
  json->Field("fma_peak_gflops", peak_gflops);
  json->Field("fma_peak_now_gflops", peak_now_gflops);
}

// Writes the forward rows.
void WriteForwardRows(JsonWriter* json, const BenchReport& report) {
  json->Key("forward");
  json->BeginArray();
  for (const FwdRow& row : report.forward) {
    json->BeginObject();
    WriteRowFields(json, FwdKey(row.shape), row.shape, row.threads, row.flops, row.peak_gflops,
                   row.peak_now_gflops);
    json->Key("anyattn");
    if (row.anyattn) {
      WriteTiming(json, *row.anyattn);
    } else {
      json->Null();
    }
    json->Field("anyattn_error", row.anyattn_error);
    if (row.anyattn) {
      const double gflops = Gflops(row.flops, row.anyattn->median_seconds);
      json->Field("anyattn_gflops", gflops);
      json->Field("anyattn_percent_of_peak", 100.0 * gflops / row.peak_gflops);
      json->Field("anyattn_percent_of_peak_now", 100.0 * gflops / row.peak_now_gflops);
    }
    json->Key("openblas_unfused");
    if (row.baseline) {
      WriteTiming(json, *row.baseline);
      json->Field("openblas_unfused_gflops", Gflops(row.flops, row.baseline->median_seconds));
    } else {
      json->Null();
    }
    json->Field("openblas_unfused_skipped", row.baseline_skipped);
    if (row.anyattn && row.baseline) {
      json->Field("speedup_vs_openblas_unfused",
                  row.baseline->median_seconds / row.anyattn->median_seconds);
      json->Field("max_abs_diff_vs_openblas_unfused", row.max_abs_diff);
      json->Field("outputs_agree", row.outputs_agree);
    }
    json->EndObject();
  }
  json->EndArray();
}

// Writes the backward rows.
void WriteBackwardRows(JsonWriter* json, const BenchReport& report) {
  json->Key("backward");
  json->BeginArray();
  for (const BwdRow& row : report.backward) {
    json->BeginObject();
    WriteRowFields(json, BwdKey(row.shape), row.shape, row.threads, row.flops, row.peak_gflops,
                   row.peak_now_gflops);
    json->Key("anyattn");
    if (row.anyattn) {
      WriteTiming(json, *row.anyattn);
      const double gflops = Gflops(row.flops, row.anyattn->median_seconds);
      json->Field("anyattn_gflops", gflops);
      json->Field("anyattn_percent_of_peak", 100.0 * gflops / row.peak_gflops);
      json->Field("anyattn_percent_of_peak_now", 100.0 * gflops / row.peak_now_gflops);
      json->Field("gradients_finite", row.gradients_finite);
    } else {
      json->Null();
    }
    json->Field("anyattn_error", row.anyattn_error);
    json->EndObject();
  }
  json->EndArray();
}

// Writes the decode rows.
void WriteDecodeRows(JsonWriter* json, const BenchReport& report) {
  json->Key("decode");
  json->BeginArray();
  for (const DecodeRow& row : report.decode) {
    json->BeginObject();
    json->Field("key", DecodeKey(row.shape));
    json->Field("dtype", DTypeName(row.shape.dtype));
    json->Field("batch", row.shape.batch);
    json->Field("seqlen_q", row.shape.seqlen_q);
    json->Field("cache", row.shape.cache == CacheFormat::kAsQ ? DTypeName(row.shape.dtype)
                                                              : CacheFormatName(row.shape.cache));
    json->Field("seqlen_k", row.shape.seqlen_k);
    json->Field("heads_q", row.shape.heads_q);
    json->Field("heads_k", row.shape.heads_k);
    json->Field("head_dim", row.shape.head_dim);
    json->Field("page_size", row.shape.page_size);
    json->Field("threads", row.threads);
    json->Field("kv_bytes", row.kv_bytes);
    json->Field("kv_copies_rotated", row.kv_copies);
    json->Field("kv_pages", row.kv_huge_pages ? "huge" : "small");
    json->Field("read_bandwidth_gbps", row.read_bandwidth_gbps);
    json->Key("anyattn");
    if (row.anyattn) {
      WriteTiming(json, *row.anyattn);
      const double gbps = row.kv_bytes / row.anyattn->median_seconds * 1e-9;
      json->Field("kv_gbps", gbps);
      json->Field("percent_of_read_bandwidth", 100.0 * gbps / row.read_bandwidth_gbps);
    } else {
      json->Null();
    }
    json->Key("read_alongside");
    if (row.read_alongside) {
      WriteTiming(json, *row.read_alongside);
      json->Field("gbps", row.kv_bytes / row.read_alongside->median_seconds * 1e-9);
    } else {
      json->Null();
    }
    json->Field("anyattn_error", row.anyattn_error);
    json->EndObject();
  }
  json->EndArray();
}

// Writes the paired rows.
void WritePairRows(JsonWriter* json, const BenchReport& report) {
  json->Key("pairs");
  json->BeginArray();
  for (const PairRow& row : report.pairs) {
    json->BeginObject();
    json->Field("key", PairKey(row.kind, row.shape, row.threads));
    json->Field("kind", row.kind == PairKind::kBf16VsF32 ? "bf16_vs_f32" : "threads_vs_one");
    WriteShapeFields(json, row.shape);
    json->Field("threads", row.threads);
    json->Field("reference_threads", row.kind == PairKind::kBf16VsF32 ? row.threads : 1);
    json->Key("subject");
    if (row.subject) {
      WriteTiming(json, *row.subject);
    } else {
      json->Null();
    }
    json->Key("reference");
    if (row.reference) {
      WriteTiming(json, *row.reference);
    } else {
      json->Null();
    }
    if (row.subject && row.reference) json->Field("rate_ratio", row.rate_ratio());
    json->Field("anyattn_error", row.error);
    json->EndObject();
  }
  json->EndArray();
}

// Writes the --rss-case result, or null.
void WriteRssCase(JsonWriter* json, const BenchReport& report) {
  json->Key("rss_case");
  if (!report.rss_case) {
    json->Null();
    return;
  }
  const RssCaseResult& rss = *report.rss_case;
  json->BeginObject();
  json->Field("shape", "B1 Sq=Sk=32768 Hq=Hk=8 D=128 f32 non-causal");
  json->Field("ran", rss.ran);
  json->Field("error", rss.error);
  json->Field("threads", rss.threads);
  json->Field("inputs_outputs_bytes", rss.inputs_outputs_bytes);
  json->Field("rss_before_call_bytes", rss.rss_before_call_bytes);
  json->Field("peak_rss_bytes", rss.peak_rss_bytes);
  json->Field("peak_rss_over_inputs_outputs_bytes", rss.peak_rss_bytes - rss.inputs_outputs_bytes);
  json->Field("seconds", rss.seconds);
  json->EndObject();
}

}  // namespace

void PrintRunHeader(const BenchReport& report) {
  std::printf("anyattn_bench  %s\n", report.timestamp.c_str());
  std::printf("command      : %s\n", report.command_line.c_str());
  std::printf("cpu          : %s\n", report.cpu_model.c_str());
  std::printf("anyattn      : version %s, isa %s\n", report.anyattn_version.c_str(),
              report.anyattn_isa.c_str());
  std::printf(
      "openblas     : core %s, OPENBLAS_CORETYPE=%s\n", report.openblas_corename.c_str(),
      report.openblas_coretype_env.empty() ? "(unset)" : report.openblas_coretype_env.c_str());
  std::printf("load average : %.2f (1 min; other work on the machine makes timings noisy)\n",
              report.load_average_start);
  std::printf(
      "timing       : >= %.2fs warm-up each; forward and backward rows: anyattn, FMA bursts and "
      "the baseline in alternation, clamp(ceil(%.2fs / chunk), %d, %d) rounds (>= 5 for chunks <= "
      "0.5s) of a chunk each (chunk = max(0.1s, slowest run)); decode rows: median of "
      "clamp(ceil(%.2fs / run), %d, %d) "
      "runs; runs longer than %.0fs: %d run(s) or rounds\n",
      report.policy.warmup_seconds, report.policy.target_seconds, report.policy.min_runs,
      report.policy.max_runs, report.policy.target_seconds, report.policy.min_runs,
      report.policy.max_runs, report.policy.long_run_seconds, report.policy.min_runs_long);
  std::fflush(stdout);
}

void PrintLimits(const MachineLimits& limits) {
  std::printf(
      "limits       : %d thread(s): f32 FMA peak %.1f GFLOP/s (%.1f per thread), "
      "streaming read %.1f GB/s (median of 8 passes; fastest %.1f)\n",
      limits.threads, limits.fma_peak_gflops, limits.fma_peak_gflops / limits.threads,
      limits.read_bandwidth_gbps, limits.read_bandwidth_best_gbps);
  std::fflush(stdout);
}

void PrintFwdTableHeader(int threads) {
  std::printf(
      "\nForward, %d thread(s). GFLOP/s = 4*B*Hq*D*visible_pairs / median time; %%peak = of the "
      "FMA peak measured at start-up; %%now = of FMA bursts run between the timed calls (median); "
      "x blas = blas ms / anyattn ms, timed in alternation (>1: anyattn faster)\n",
      threads);
  std::printf("%-20s %-5s %-6s %3s %10s %8s %6s %6s | %10s %8s %7s %9s\n", "shape", "dtype", "mask",
              "thr", "ms", "GFLOP/s", "%peak", "%now", "blas ms", "GFLOP/s", "x blas", "max|diff|");
  std::fflush(stdout);
}

void PrintFwdRow(const FwdRow& row) {
  std::printf("%-20s %-5s %-6s %3d ", FwdLabel(row.shape).c_str(), DTypeName(row.shape.dtype),
              row.shape.causal ? "causal" : "none", row.threads);
  if (row.anyattn) {
    const double gflops = Gflops(row.flops, row.anyattn->median_seconds);
    std::printf("%10.3f %8.1f %5.1f%% %5.1f%% | ", row.anyattn->median_seconds * 1e3, gflops,
                100.0 * gflops / row.peak_gflops, 100.0 * gflops / row.peak_now_gflops);
  } else {
    std::printf("%10s %8s %6s %6s | ", "error", "-", "-", "-");
  }
  if (row.baseline) {
    std::printf("%10.3f %8.1f ", row.baseline->median_seconds * 1e3,
                Gflops(row.flops, row.baseline->median_seconds));
  } else {
    std::printf("%10s %8s ", "-", "-");
  }
  if (row.anyattn && row.baseline) {
    std::printf("%7.2f %9.1e%s", row.baseline->median_seconds / row.anyattn->median_seconds,
                row.max_abs_diff, row.outputs_agree ? "" : " MISMATCH");
  } else {
    std::printf("%7s %9s", "-", "-");
  }
  if (!row.anyattn_error.empty()) std::printf("  anyattn: %s", row.anyattn_error.c_str());
  if (!row.baseline_skipped.empty() && row.baseline_skipped != "disabled") {
    std::printf("  (blas: %s)", row.baseline_skipped.c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

void PrintBwdTableHeader(int threads) {
  std::printf(
      "\nBackward, %d thread(s): anyattn_bwd alone (out, lse from one untimed anyattn_fwd). "
      "GFLOP/s = 2.5 * 4*B*Hq*D*visible_pairs / median time; %%peak, %%now as in the forward "
      "table\n",
      threads);
  std::printf("%-20s %-5s %-6s %3s %10s %8s %6s %6s\n", "shape", "dtype", "mask", "thr", "ms",
              "GFLOP/s", "%peak", "%now");
  std::fflush(stdout);
}

void PrintBwdRow(const BwdRow& row) {
  std::printf("%-20s %-5s %-6s %3d ", FwdLabel(row.shape).c_str(), DTypeName(row.shape.dtype),
              row.shape.causal ? "causal" : "none", row.threads);
  if (row.anyattn) {
    const double gflops = Gflops(row.flops, row.anyattn->median_seconds);
    std::printf("%10.3f %8.1f %5.1f%% %5.1f%%%s", row.anyattn->median_seconds * 1e3, gflops,
                100.0 * gflops / row.peak_gflops, 100.0 * gflops / row.peak_now_gflops,
                row.gradients_finite ? "" : "  NON-FINITE");
  } else {
    std::printf("%10s %8s %6s %6s", "error", "-", "-", "-");
  }
  if (!row.anyattn_error.empty()) std::printf("  anyattn: %s", row.anyattn_error.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

void PrintDecodeTableHeader(int threads, bool kv_huge_pages) {
  std::printf(
      "\nDecode (Sq=1), %d thread(s), K/V on %s. KV GB/s = bytes of K and V read / median time; "
      "%%bw = of the streaming read bandwidth measured at start-up (median); read now = a "
      "streaming read of the same K/V buffers, in rounds alternating with the row's calls "
      "(median), %%now = KV GB/s of it\n",
      threads,
      kv_huge_pages ? "transparent 2 MiB pages (as the start-up read's buffer)"
                    : "the allocator's default pages (the start-up read's buffer asks for 2 MiB)");
  std::printf("%-28s %-5s %3s %10s %9s %8s %6s %8s %6s %7s\n", "shape", "dtype", "thr", "ms",
              "KV MiB", "KV GB/s", "%bw", "read now", "%now", "copies");
  std::fflush(stdout);
}

void PrintDecodeRow(const DecodeRow& row) {
  std::printf("%-28s %-5s %3d ", DecodeLabel(row.shape).c_str(), DTypeName(row.shape.dtype),
              row.threads);
  if (row.anyattn) {
    const double gbps = row.kv_bytes / row.anyattn->median_seconds * 1e-9;
    const double read_gbps =
        row.read_alongside ? row.kv_bytes / row.read_alongside->median_seconds * 1e-9 : 0.0;
    std::printf("%10.3f %9.1f %8.1f %5.1f%% %8.1f %5.1f%% %7d\n", row.anyattn->median_seconds * 1e3,
                row.kv_bytes / kMiB, gbps, 100.0 * gbps / row.read_bandwidth_gbps, read_gbps,
                100.0 * gbps / read_gbps, row.kv_copies);
  } else {
    std::printf("%10s %9.1f %8s %6s %8s %6s %7d  anyattn: %s\n", "error", row.kv_bytes / kMiB, "-",
                "-", "-", "-", row.kv_copies, row.anyattn_error.c_str());
  }
  std::fflush(stdout);
}

void PrintKv8Ratios(const std::vector<DecodeRow>& rows) {
  bool printed_header = false;
  for (const DecodeRow& row : rows) {
    if (row.shape.cache == CacheFormat::kAsQ || !row.anyattn) continue;
    DecodeShape bf16_shape = row.shape;
    bf16_shape.cache = CacheFormat::kAsQ;
    const std::string bf16_key = DecodeKey(bf16_shape);
    for (const DecodeRow& base : rows) {
      if (DecodeKey(base.shape) != bf16_key || !base.anyattn) continue;
      if (!printed_header) {
        std::printf("\n8-bit caches against bf16 (tokens/s = B * Sq / median time; ratio = 8-bit "
                    "tokens/s / bf16 tokens/s)\n%-36s %12s %12s %7s\n",
                    "shape", "tokens/s", "bf16 tok/s", "ratio");
        printed_header = true;
      }
      const double tokens = static_cast<double>(row.shape.batch * row.shape.seqlen_q);
      const double rate = tokens / row.anyattn->median_seconds;
      const double base_rate = tokens / base.anyattn->median_seconds;
      std::printf("%-36s %12.0f %12.0f %7.2f\n", DecodeLabel(row.shape).c_str(), rate, base_rate,
                  rate / base_rate);
    }
  }
  std::fflush(stdout);
}

void PrintPairTableHeader(int threads) {
  std::printf(
      "\nPaired rows, %d thread(s): the two calls of each pair timed in alternation (rounds of a "
      "chunk each, as the forward rows), so that the ratio sees one state of the host. ratio = "
      "reference ms / subject ms: bf16 rate / f32 rate, or %d-thread rate / 1-thread rate\n",
      threads, threads);
  std::printf("%-13s %-20s %-5s %-6s %12s %12s %7s\n", "pair", "shape", "dtype", "mask",
              "subject ms", "reference ms", "ratio");
  std::fflush(stdout);
}

void PrintPairRow(const PairRow& row) {
  const std::string pair = row.kind == PairKind::kBf16VsF32
                               ? "bf16 / f32"
                               : std::to_string(row.threads) + " thr / 1 thr";
  std::printf("%-13s %-20s %-5s %-6s ", pair.c_str(), FwdLabel(row.shape).c_str(),
              row.kind == PairKind::kBf16VsF32 ? "-" : DTypeName(row.shape.dtype),
              row.shape.causal ? "causal" : "none");
  if (row.subject && row.reference) {
    std::printf("%12.3f %12.3f %7.2f\n", row.subject->median_seconds * 1e3,
                row.reference->median_seconds * 1e3, row.rate_ratio());
  } else {
    std::printf("%12s %12s %7s  anyattn: %s\n", "error", "-", "-", row.error.c_str());
  }
  std::fflush(stdout);
}

void PrintRssCase(const RssCaseResult& result) {
  std::printf("\nPeak RSS case (own process): B1 S=32768 H=8 D=128 f32 non-causal, %d thread(s)\n",
              result.threads);
  if (!result.ran) {
    std::printf("  not measured: %s\n", result.error.c_str());
    std::fflush(stdout);
    return;
  }
  std::printf(
      "  inputs+outputs %.1f MiB, RSS before the call %.1f MiB, peak RSS %.1f MiB, "
      "peak - (inputs+outputs) = %.1f MiB, call %.2f s\n",
      result.inputs_outputs_bytes / kMiB, result.rss_before_call_bytes / kMiB,
      result.peak_rss_bytes / kMiB, (result.peak_rss_bytes - result.inputs_outputs_bytes) / kMiB,
      result.seconds);
  if (!result.error.empty()) std::printf("  anyattn: %s\n", result.error.c_str());
  std::fflush(stdout);
}

void PrintRssCaseMachineLine(const RssCaseResult& result) {
  std::printf(
      "rss_case ran=%d threads=%d io_bytes=%lld before_bytes=%lld peak_bytes=%lld "
      "seconds=%.6f\n",
      result.ran ? 1 : 0, result.threads, static_cast<long long>(result.inputs_outputs_bytes),
      static_cast<long long>(result.rss_before_call_bytes),
      static_cast<long long>(result.peak_rss_bytes), result.seconds);
  if (!result.error.empty()) std::printf("rss_case_error %s\n", result.error.c_str());
  std::fflush(stdout);
}

RssCaseResult ParseRssCaseOutput(const std::string& output) {
  RssCaseResult result;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    const std::string line = output.substr(start, end - start);
    if (line.rfind("rss_case ", 0) == 0) {
      result.ran = TokenValue(line, "ran") == "1";
      result.threads = std::atoi(TokenValue(line, "threads").c_str());
      result.inputs_outputs_bytes = std::atoll(TokenValue(line, "io_bytes").c_str());
      result.rss_before_call_bytes = std::atoll(TokenValue(line, "before_bytes").c_str());
      result.peak_rss_bytes = std::atoll(TokenValue(line, "peak_bytes").c_str());
      result.seconds = std::atof(TokenValue(line, "seconds").c_str());
    } else if (line.rfind("rss_case_error ", 0) == 0) {
      result.error = line.substr(15);
    }
    start = end + 1;
  }
  return result;
}

bool WriteJsonReport(const BenchReport& report, const std::string& path, std::string* error) {
  JsonWriter json;
  json.BeginObject();
  json.Field("schema", "anyattn-bench/1");
  json.Field("timestamp", report.timestamp);
  json.Field("command_line", report.command_line);
  json.Field("cpu_model", report.cpu_model);
  json.Field("fma_isa", report.fma_isa);
  json.Field("anyattn_version", report.anyattn_version);
  json.Field("anyattn_isa", report.anyattn_isa);
  json.Field("openblas_corename", report.openblas_corename);
  json.Field("openblas_config", report.openblas_config);
  json.Field("openblas_coretype_env", report.openblas_coretype_env);
  json.Field("baseline", report.baseline_description);
  json.Field("flop_formula", "4*B*Hq*D*visible_pairs");
  json.Field("backward_flop_formula", "2.5*4*B*Hq*D*visible_pairs");
  json.Key("timing_policy");
  json.BeginObject();
  json.Field("warmup_seconds", report.policy.warmup_seconds);
  json.Field("target_seconds", report.policy.target_seconds);
  json.Field("min_runs", report.policy.min_runs);
  json.Field("max_runs", report.policy.max_runs);
  json.Field("long_run_seconds", report.policy.long_run_seconds);
  json.Field("min_runs_long", report.policy.min_runs_long);
  json.EndObject();
  json.Key("machine_limits");
  json.BeginArray();
  for (const MachineLimits& limits : report.limits) {
    json.BeginObject();
    json.Field("threads", limits.threads);
    json.Field("fma_peak_gflops", limits.fma_peak_gflops);
    json.Field("fma_peak_gflops_per_thread", limits.fma_peak_gflops / limits.threads);
    json.Field("fma_peak_gflops_remeasured_at_end", limits.fma_peak_gflops_end);
    json.Field("read_bandwidth_gbps", limits.read_bandwidth_gbps);
    json.Field("read_bandwidth_fastest_pass_gbps", limits.read_bandwidth_best_gbps);
    json.EndObject();
  }
  json.EndArray();
  WriteForwardRows(&json, report);
  WriteBackwardRows(&json, report);
  WriteDecodeRows(&json, report);
  WritePairRows(&json, report);
  WriteRssCase(&json, report);
  json.Field("target_threads", report.target_threads);
  json.Key("targets");
  json.BeginArray();
  for (const TargetCheck& check : report.targets) {
    json.BeginObject();
    json.Field("name", check.name);
    json.Field("unit", check.unit);
    json.Field("threshold", check.threshold);
    json.Field("rows", check.rows());
    json.Field("rows_now", static_cast<int>(check.now.values.size()));
    if (check.rows() > 0) {
      json.Field("worst", check.start.worst);
      json.Field("worst_row", check.start.worst_row);
      json.Field("median", check.start.median());
      json.Field("met", check.met());
    }
    if (!check.now.values.empty()) {
      json.Field("worst_now", check.now.worst);
      json.Field("worst_now_row", check.now.worst_row);
      json.Field("median_now", check.now.median());
      json.Field("met_now", check.met_now());
    }
    json.EndObject();
  }
  json.EndArray();
  json.Field("load_average_start", report.load_average_start);
  json.Field("load_average_end", report.load_average_end);
  json.Field("peak_rss_bytes", report.peak_rss_bytes);
  json.Field("total_seconds", report.total_seconds);
  json.EndObject();

  std::error_code fs_error;
  const std::filesystem::path file(path);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), fs_error);
  std::ofstream out(path);
  out << json.text() << "\n";
  out.close();
  if (!out) {
    *error = "cannot write " + path;
    return false;
  }
  return true;
}

}  // namespace anyattn_bench
