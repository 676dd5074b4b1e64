// anyattn_bench: measures this machine's limits, then anyattn's forward pass against them and
// against the unfused OpenBLAS baseline, and its backward pass against them, times the ratio
// targets' calls in pairs, and prints and saves the tables. See bench/README.md.
#include <cblas.h>

#include <strings.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "baseline_openblas.h"
#include "bench_cases.h"
#include "machine_limits.h"
#include "options.h"
#include "process_info.h"
#include "report.h"
#include "targets.h"

namespace anyattn_bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The thread counts to run: --threads-list, or anyattn's default followed by 1.
std::vector<int> ThreadCounts(const Options& options, int default_threads) {
  if (!options.threads_list.empty()) return options.threads_list;
  std::vector<int> counts = {default_threads};
  if (default_threads != 1 && !options.quick) counts.push_back(1);
  return counts;
}

// Streaming read bandwidth of `threads` threads, measured in a child process so that its large
// buffer never counts toward this process's peak RSS. Zeros on failure.
ReadBandwidth MeasureReadBandwidthInChild(int threads, double bandwidth_mib) {
  int exit_code = -1;
  const std::string output = RunSelf({"--child-bandwidth", std::to_string(threads),
                                      "--bandwidth-mib", std::to_string(bandwidth_mib)},
                                     &exit_code);
  const size_t line = output.find("read_bandwidth ");
  if (exit_code != 0 || line == std::string::npos) return {};
  const std::string text = output.substr(line);
  ReadBandwidth read;
  read.median_gbps = std::atof(TokenValue(text, "gbps").c_str());
  read.best_gbps = std::atof(TokenValue(text, "best").c_str());
  return read;
}

// All of argv joined by spaces.
std::string JoinArgs(int argc, char** argv) {
  std::string joined;
  for (int i = 0; i < argc; ++i) joined += (i ? " " : "") + std::string(argv[i]);
  return joined;
}

// The run's header facts: versions, CPU, OpenBLAS configuration.
BenchReport NewReport(int argc, char** argv, const Options& options) {
  BenchReport report;
  report.command_line = JoinArgs(argc, argv);
  report.timestamp = UtcTimestamp();
  report.cpu_model = CpuModelName();
  report.fma_isa = VectorIsaName(DetectVectorIsa());
  report.anyattn_version = anyattn_version_string();
  const anyattn_isa isa = options.isa_value;
  report.anyattn_isa = anyattn_isa_name(isa == ANYATTN_ISA_AUTO ? anyattn_isa_default() : isa);
  report.openblas_corename = openblas_get_corename();
  report.openblas_config = openblas_get_config();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  report.openblas_coretype_env = coretype ? coretype : "";
  report.baseline_description = UnfusedBaseline::Description();
  if (options.quick) report.policy.target_seconds = 0.2;
  if (options.target_seconds > 0) report.policy.target_seconds = options.target_seconds;
  if (options.min_runs > 0) {
    report.policy.min_runs = options.min_runs;
    report.policy.min_runs_long = std::min(report.policy.min_runs_long, options.min_runs);
  }
  report.load_average_start = LoadAverage();
  return report;
}

// True for the OpenBLAS cores whose kernels use AVX-512 (names as openblas_get_corename gives
// them).
bool OpenblasCoreUsesAvx512(const std::string& corename) {
  for (const char* core : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (strcasecmp(corename.c_str(), core) == 0) return true;
  }
  return false;
}

// The paired table at `threads` threads: each forward shape with kTargetMinSeqlen <= S <=
// --pair-max-seqlen that the filters let through, in bf16 against f32, and (when threads > 1) on
// `threads` against one thread, each pair timed in alternation. Returns the number of failed rows.
int RunPairTable(const Options& options, int threads, const CaseSettings& settings,
                 BenchReport* report) {
  int failures = 0;
  bool printed_header = false;
  auto run = [&](PairKind kind, const FwdShape& shape) {
    if (!MatchesAnyFilter(PairKey(kind, shape, threads), options.filters)) return;
    if (!printed_header) PrintPairTableHeader(threads);
    printed_header = true;
    report->pairs.push_back(RunPairCase(kind, shape, threads, settings));
    PrintPairRow(report->pairs.back());
    if (!report->pairs.back().subject || !report->pairs.back().reference) ++failures;
  };
  std::vector<FwdShape> shapes;
  for (const FwdShape& shape : ForwardTableShapes(options.quick)) {
    if (shape.seqlen_q >= kTargetMinSeqlen && shape.seqlen_q <= options.pair_max_seqlen) {
      shapes.push_back(shape);
    }
  }
  for (const FwdShape& shape : shapes) {
    if (shape.dtype == DType::kBf16) run(PairKind::kBf16VsF32, shape);
  }
  if (threads == 1) return failures;
  for (const FwdShape& shape : shapes) run(PairKind::kThreadsVsOne, shape);
  return failures;
}

// The run proper: limits, tables, RSS case, JSON. Returns the process exit code.
int RunBenchmark(int argc, char** argv, const Options& options) {
  const double start = NowSeconds();
  BenchReport report = NewReport(argc, argv, options);
  PrintRunHeader(report);
  if (CpuInfoHasFlag("avx512f") && report.openblas_coretype_env.empty()) {
    std::printf(
        "warning      : OPENBLAS_CORETYPE is unset on an AVX-512 CPU; Debian's OpenBLAS "
        "may run slow kernels. Use bench/run_bench.sh or set OPENBLAS_CORETYPE=Cooperlake.\n");
  } else if (CpuInfoHasFlag("avx512f") && !OpenblasCoreUsesAvx512(report.openblas_corename)) {
    // A core type set for another machine (e.g. Haswell in a shared environment) runs OpenBLAS's
    // AVX2 kernels: half the sgemm rate on an AVX-512 CPU, which would flatter the baseline ratio.
    std::printf(
        "warning      : OpenBLAS runs its %s kernels (OPENBLAS_CORETYPE=%s) on an AVX-512 CPU; "
        "the baseline is then slower than it can be. Set OPENBLAS_CORETYPE=Cooperlake.\n",
        report.openblas_corename.c_str(), report.openblas_coretype_env.c_str());
  }

  anyattn_set_num_threads(0);
  const int default_threads = anyattn_get_num_threads();
  const std::vector<int> thread_counts = ThreadCounts(options, default_threads);
  for (int threads : thread_counts) {
    MachineLimits limits;
    limits.threads = threads;
    limits.fma_peak_gflops = MeasureFmaPeakGflops(threads, 0.6);
    const ReadBandwidth read = MeasureReadBandwidthInChild(threads, options.bandwidth_mib);
    limits.read_bandwidth_gbps = read.median_gbps;
    limits.read_bandwidth_best_gbps = read.best_gbps;
    PrintLimits(limits);
    report.limits.push_back(limits);
  }

  CaseSettings settings;
  settings.policy = report.policy;
  settings.isa = options.isa_value;
  settings.run_baseline = options.run_baseline;
  settings.baseline_cap_bytes = options.baseline_cap_mib * kMiB;
  settings.kv_pages = options.kv_pages == "small" ? Pages::kDefault : Pages::kHuge;
  int failures = 0;
  for (const MachineLimits& limits : report.limits) {
    anyattn_set_num_threads(limits.threads);
    if (anyattn_get_num_threads() != limits.threads) {
      std::printf("note         : anyattn_get_num_threads() = %d after setting %d\n",
                  anyattn_get_num_threads(), limits.threads);
    }
    if (options.run_forward) {
      bool printed_header = false;
      for (const FwdShape& shape : ForwardTableShapes(options.quick)) {
        if (!MatchesAnyFilter(FwdKey(shape), options.filters)) continue;
        if (!printed_header) PrintFwdTableHeader(limits.threads);
        printed_header = true;
        report.forward.push_back(RunFwdCase(shape, limits, settings));
        PrintFwdRow(report.forward.back());
        if (!report.forward.back().anyattn || !report.forward.back().outputs_agree) ++failures;
      }
    }
    if (options.run_backward) {
      bool printed_header = false;
      for (const FwdShape& shape : BackwardTableShapes(options.quick)) {
        if (!MatchesAnyFilter(BwdKey(shape), options.filters)) continue;
        if (!printed_header) PrintBwdTableHeader(limits.threads);
        printed_header = true;
        report.backward.push_back(RunBwdCase(shape, limits, settings));
        PrintBwdRow(report.backward.back());
        if (!report.backward.back().anyattn || !report.backward.back().gradients_finite) {
          ++failures;
        }
      }
    }
    if (options.run_decode) {
      bool printed_header = false;
      for (const DecodeShape& shape : DecodeTableShapes(options.quick)) {
        if (!MatchesAnyFilter(DecodeKey(shape), options.filters)) continue;
        if (!printed_header) {
          PrintDecodeTableHeader(limits.threads, settings.kv_pages == Pages::kHuge);
        }
        printed_header = true;
        report.decode.push_back(RunDecodeCase(shape, limits, settings));
        PrintDecodeRow(report.decode.back());
        if (!report.decode.back().anyattn) ++failures;
      }
      PrintKv8Ratios(report.decode);
    }
  }
  const int target_threads =
      std::find(thread_counts.begin(), thread_counts.end(), 2) != thread_counts.end()
          ? 2
          : thread_counts.front();
  if (options.run_pairs && options.run_forward) {
    failures += RunPairTable(options, target_threads, settings, &report);
  }
  anyattn_set_num_threads(0);

  if (options.run_rss_case && !options.quick && MatchesAnyFilter(RssCaseKey(), options.filters)) {
    int exit_code = -1;
    const std::string output = RunSelf(
        {"--rss-case", "--threads-list", std::to_string(default_threads), "--isa", options.isa},
        &exit_code);
    report.rss_case = ParseRssCaseOutput(output);
    if (exit_code != 0 && report.rss_case->error.empty()) {
      report.rss_case->error = "child process exited with " + std::to_string(exit_code);
    }
    PrintRssCase(*report.rss_case);
    if (!report.rss_case->ran) ++failures;
  }

  for (MachineLimits& limits : report.limits) {
    limits.fma_peak_gflops_end = MeasureFmaPeakGflops(limits.threads, 0.6);
    std::printf(
        "%slimits check : %d thread(s): FMA peak re-measured after the tables %.1f GFLOP/s "
        "(start %.1f)%s\n",
        &limits == &report.limits.front() ? "\n" : "", limits.threads, limits.fma_peak_gflops_end,
        limits.fma_peak_gflops,
        std::abs(limits.fma_peak_gflops_end / limits.fma_peak_gflops - 1.0) > 0.1
            ? ": differs by more than 10%, the cores were shared"
            : "");
  }

  report.target_threads = target_threads;
  report.targets = CheckTargets(report, target_threads);
  PrintTargetChecks(report.targets, target_threads);

  report.peak_rss_bytes = PeakRssBytes();
  report.total_seconds = NowSeconds() - start;
  report.load_average_end = LoadAverage();
  std::printf("\nLoad average (1 min) at start %.2f, at end %.2f on %d CPU(s)%s\n",
              report.load_average_start, report.load_average_end, default_threads,
              std::max(report.load_average_start, report.load_average_end) > 0.5 + default_threads
                  ? ": the machine was busy; these timings are noisy"
                  : "");
  std::printf(
      "Peak RSS of this process: %.1f MiB (includes the inputs of the largest case and "
      "the baseline's score matrix; the RSS case above is the library's own figure)\n",
      report.peak_rss_bytes / kMiB);
  std::printf("Total time: %.1f s; %d failed or mismatched row(s)\n", report.total_seconds,
              failures);
  std::string error;
  if (WriteJsonReport(report, options.json_path, &error)) {
    std::printf("JSON: %s\n", options.json_path.c_str());
  } else {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  return failures == 0 ? 0 : 2;
}

}  // namespace
}  // namespace anyattn_bench

int main(int argc, char** argv) {
  using namespace anyattn_bench;
  Options options;
  std::string error;
  if (!ParseOptions(argc, argv, &options, &error)) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 64;
  }
  if (options.help) {
    std::printf("%s", UsageText().c_str());
    return 0;
  }
  if (options.child_bandwidth_threads > 0) {
    const ReadBandwidth read = MeasureReadBandwidth(
        options.child_bandwidth_threads, static_cast<size_t>(options.bandwidth_mib * kMiB), 8);
    std::printf("read_bandwidth gbps=%.4f best=%.4f\n", read.median_gbps, read.best_gbps);
    return read.median_gbps > 0 ? 0 : 1;
  }
  if (options.rss_case_mode) {
    anyattn_set_num_threads(0);
    const int threads =
        options.threads_list.empty() ? anyattn_get_num_threads() : options.threads_list.front();
    const RssCaseResult result = RunRssCase(threads, options.isa_value);
    PrintRssCaseMachineLine(result);
    PrintRssCase(result);
    return result.ran ? 0 : 2;
  }
  return RunBenchmark(argc, argv, options);
}
