#include "options.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace anyattn_bench {
namespace {

// The library's path names: anyattn_isa_name for 0, 1, 2, ... until it answers "unknown".
bool IsaFromName(const std::string& name, anyattn_isa* isa) {
  for (int32_t value = ANYATTN_ISA_AUTO;; ++value) {
    const char* path = anyattn_isa_name(static_cast<anyattn_isa>(value));
    if (std::strcmp(path, "unknown") == 0) return false;
    if (name == path) {
      *isa = static_cast<anyattn_isa>(value);
      return true;
    }
  }
}

std::string IsaNames() {
  std::string names;
  for (int32_t value = ANYATTN_ISA_AUTO;; ++value) {
    const char* path = anyattn_isa_name(static_cast<anyattn_isa>(value));
    if (std::strcmp(path, "unknown") == 0) return names;
    names += (names.empty() ? "" : ", ") + std::string(path);
  }
}

// Parses a positive integer; false on anything else.
bool ParsePositiveInt(const std::string& text, int* value) {
  char* end = nullptr;
  const long parsed = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || parsed <= 0 || parsed > 4096) return false;
  *value = static_cast<int>(parsed);
  return true;
}

// Parses a positive finite number; false on anything else.
bool ParsePositiveDouble(const std::string& text, double* value) {
  char* end = nullptr;
  const double parsed = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(parsed > 0.0) || parsed > 1e12) return false;
  *value = parsed;
  return true;
}

// Parses "1,2,4" into positive thread counts.
bool ParseThreadsList(const std::string& text, std::vector<int>* threads) {
  threads->clear();
  std::istringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    int value = 0;
    if (!ParsePositiveInt(item, &value)) return false;
    threads->push_back(value);
  }
  return !threads->empty();
}

}  // namespace

std::string UsageText() {
  return R"(anyattn_bench: anyattn forward vs the unfused OpenBLAS baseline, and anyattn backward,
against this machine's limits.

Usage: anyattn_bench [options]
  --threads-list 1,2     thread counts to run every table for (default: anyattn's default, then 1)
  --quick                a subset of rows with shorter timings (a minute or two)
  --filter TERMS         run rows whose key contains every comma-separated term, e.g.
                         --filter fwd/f32,D128,S4096   or   --filter decode/bf16;
                         repeat --filter to run the rows matching any of them
                         keys: fwd/<f32|bf16>/<full|causal>/B1/Hq16/Hk<16|4>/D<64|128>/S<len>
                               bwd/<f32|bf16>/<full|causal>/B1/Hq16/Hk16/D<64|128>/S<len>
                               decode/<bf16|f16|f32>/B<1|8>/Hq32/Hk8/D128/Sk<4096|32768>[/page<16|256>]
                               pair/bf16-f32/thr<N>/<full|causal>/B1/Hq16/Hk<16|4>/D<64|128>/S<len>
                               pair/thr<N>-thr1/<f32|bf16>/<full|causal>/B1/Hq16/Hk<16|4>/D<64|128>/S<len>
                               rss/f32/full/B1/Hq8/Hk8/D128/S32768 (the peak-RSS child)
  --json PATH            results file (default bench/results/latest.json, relative to cwd)
  --no-forward           skip the forward table
  --no-backward          skip the backward table
  --no-baseline          skip the unfused OpenBLAS baseline
  --no-decode            skip the decode table
  --no-pairs             skip the paired table (bf16 vs f32, N threads vs 1, timed in alternation)
  --pair-max-seqlen N    longest S the paired table covers (default 4096; 8192 adds ~6 minutes)
  --no-rss-case          do not spawn the peak-RSS case at the end (--quick never does)
  --rss-case             run only the peak-RSS case (S=32768, D=128, H=8, f32) in this process
  --baseline-cap-mib N   skip the baseline where its score matrix exceeds N MiB (default 64,
                         i.e. S <= 4096; 256 includes S = 8192)
  --target-seconds X     timed-run budget per case and implementation (default 0.5; quick 0.2)
  --min-runs N           minimum timed runs per case (default 3)
  --isa NAME             anyattn path: auto or a path's name (anyattn_isa_name; default auto)
  --bandwidth-mib N      buffer streamed by the read-bandwidth measurement (default 1024)
  --kv-pages huge|small  pages of the decode rows' K/V: transparent 2 MiB pages, as the
                         read-bandwidth buffer has (default), or the allocator's default
  --help                 this text
Set OPENBLAS_CORETYPE=Cooperlake on AVX-512 machines (bench/run_bench.sh does it), or Debian's
OpenBLAS 0.3.21 runs its SSE3 kernels and the baseline is far slower than it should be.
)";
}

bool ParseOptions(int argc, char** argv, Options* options, std::string* error) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    // Returns the value following a flag, or null (with *error set) when it is missing.
    auto next_value = [&]() -> const char* {
      if (i + 1 >= argc) {
        *error = arg + " needs a value";
        return nullptr;
      }
      return argv[++i];
    };
    const char* value = nullptr;
    if (arg == "--help" || arg == "-h") {
      options->help = true;
    } else if (arg == "--quick") {
      options->quick = true;
    } else if (arg == "--no-forward") {
      options->run_forward = false;
    } else if (arg == "--no-backward") {
      options->run_backward = false;
    } else if (arg == "--no-baseline") {
      options->run_baseline = false;
    } else if (arg == "--no-decode") {
      options->run_decode = false;
    } else if (arg == "--no-pairs") {
      options->run_pairs = false;
    } else if (arg == "--no-rss-case") {
      options->run_rss_case = false;
    } else if (arg == "--rss-case") {
      options->rss_case_mode = true;
    } else if (arg == "--threads-list") {
      if (!(value = next_value())) return false;
      if (!ParseThreadsList(value, &options->threads_list)) {
        *error =
            std::string("--threads-list wants positive integers like 1,2; got '") + value + "'";
        return false;
      }
    } else if (arg == "--filter") {
      if (!(value = next_value())) return false;
      options->filters.push_back(value);
    } else if (arg == "--json") {
      if (!(value = next_value())) return false;
      options->json_path = value;
    } else if (arg == "--baseline-cap-mib") {
      if (!(value = next_value())) return false;
      if (!ParsePositiveDouble(value, &options->baseline_cap_mib)) {
        *error = std::string("--baseline-cap-mib wants a positive number; got '") + value + "'";
        return false;
      }
    } else if (arg == "--target-seconds") {
      if (!(value = next_value())) return false;
      if (!ParsePositiveDouble(value, &options->target_seconds)) {
        *error = std::string("--target-seconds wants a positive number; got '") + value + "'";
        return false;
      }
    } else if (arg == "--pair-max-seqlen") {
      if (!(value = next_value())) return false;
      if (!ParsePositiveInt(value, &options->pair_max_seqlen)) {
        *error = std::string("--pair-max-seqlen wants a positive integer; got '") + value + "'";
        return false;
      }
    } else if (arg == "--min-runs") {
      if (!(value = next_value())) return false;
      if (!ParsePositiveInt(value, &options->min_runs)) {
        *error = std::string("--min-runs wants a positive integer; got '") + value + "'";
        return false;
      }
    } else if (arg == "--isa") {
      if (!(value = next_value())) return false;
      options->isa = value;
      if (!IsaFromName(options->isa, &options->isa_value)) {
        *error = "--isa wants one of " + IsaNames() + "; got '" + options->isa + "'";
        return false;
      }
    } else if (arg == "--bandwidth-mib") {
      if (!(value = next_value())) return false;
      if (!ParsePositiveDouble(value, &options->bandwidth_mib)) {
        *error = std::string("--bandwidth-mib wants a positive number; got '") + value + "'";
        return false;
      }
    } else if (arg == "--kv-pages") {
      if (!(value = next_value())) return false;
      options->kv_pages = value;
      if (options->kv_pages != "huge" && options->kv_pages != "small") {
        *error = "--kv-pages wants huge or small; got '" + options->kv_pages + "'";
        return false;
      }
    } else if (arg == "--child-bandwidth") {
      if (!(value = next_value())) return false;
      if (!ParsePositiveInt(value, &options->child_bandwidth_threads)) {
        *error = std::string("--child-bandwidth wants a positive integer; got '") + value + "'";
        return false;
      }
    } else {
      *error = "unknown option '" + arg + "' (see --help)";
      return false;
    }
  }
  return true;
}

}  // namespace anyattn_bench
