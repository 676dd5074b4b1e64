// Command-line options of anyattn_bench.
#ifndef ANYATTN_BENCH_OPTIONS_H_
#define ANYATTN_BENCH_OPTIONS_H_

#include <string>
#include <vector>

#include "anyattn/anyattn.h"

namespace anyattn_bench {

struct Options {
  // Thread counts to run the tables for; empty means "anyattn's default, then 1".
  std::vector<int> threads_list;
  // A subset of rows and shorter timings, a minute or two in all.
  bool quick = false;
  // Filters (--filter, repeatable): a row runs when it matches any of them (see shapes.h).
  std::vector<std::string> filters;
  std::string json_path = "bench/results/latest.json";
  bool run_forward = true;
  bool run_backward = true;
  bool run_baseline = true;
  bool run_decode = true;
  // The paired table: the rows of the ratio targets timed two calls at a time in alternation.
  bool run_pairs = true;
  // The paired table covers target shapes with S up to this: a pair of S = 8192 calls takes about
  // 15 s, and the 24 of them would add some 6 minutes to a full run.
  int pair_max_seqlen = 4096;
  // Whether the full run also spawns the --rss-case measurement in a child process.
  bool run_rss_case = true;
  // Run only the peak-RSS case in this process and exit.
  bool rss_case_mode = false;
  // Skip the unfused baseline where its score matrix would exceed this many MiB.
  double baseline_cap_mib = 64.0;
  // Timing policy overrides; negative means "keep the default".
  double target_seconds = -1.0;
  int min_runs = -1;
  // anyattn ISA path, as named (any name anyattn_isa_name gives) and as its value.
  std::string isa = "auto";
  anyattn_isa isa_value = ANYATTN_ISA_AUTO;
  // Size of the buffer the read-bandwidth measurement streams, MiB.
  double bandwidth_mib = 1024.0;
  // Pages of the decode rows' K/V buffers: "huge" (transparent 2 MiB pages, as the read-bandwidth
  // buffer has) or "small" (the allocator's default).
  std::string kv_pages = "huge";
  // Internal: measure read bandwidth with this many threads, print it, exit (a child process).
  int child_bandwidth_threads = 0;
  bool help = false;
};

// Parses argv into *options. Returns false and sets *error on an unknown option or a bad value.
bool ParseOptions(int argc, char** argv, Options* options, std::string* error);

// The --help text.
std::string UsageText();

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_OPTIONS_H_
