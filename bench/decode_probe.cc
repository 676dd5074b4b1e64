// anyattn_decode_probe: times one decode shape (Sq = 1, Hq = 32, Hk = 8, D = 128) and prints the
// median and minimum call time. Made for A/B comparisons of two library builds on a noisy
// machine: run it alternately against each build (LD_LIBRARY_PATH=<build>/src) and compare the
// medians of several alternations, as bench/README.md describes.
//
//   anyattn_decode_probe [--dtype bf16|f32] [--batch B] [--seqlen-q SQ] [--seqlen-k SK]
//                        [--page-size P] [--pages-in-order] [--threads T] [--runs N]
//
// Defaults: bf16, B = 8, Sq = 1, Sk = 32768, dense (P = 0; paged pages scattered as in
// anyattn_bench's table unless --pages-in-order), 2 threads, 7 runs. One K/V copy is reused, so a
// cache smaller than twice the last-level cache is timed from cache (the probe says so); B = 1, Sk
// = 512 with --threads 1 --runs 3000 times the loop on data in L2 (read the minimum). Sq > 1 (the
// last Sq positions, no mask: speculative or chunked decoding) times the streaming path that packs
// K and V once Sq * Hq / Hk exceeds the direct loop's 12 rows per kv head.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "anyattn_runner.h"
#include "process_info.h"
#include "tensors.h"
#include "timing.h"

namespace anyattn_bench {
namespace {

struct ProbeOptions {
  DecodeShape shape;
  int64_t seqlen_q = 1;
  bool pages_in_order = false;
  int threads = 2;
  int runs = 7;
};

bool ParseProbeOptions(int argc, char** argv, ProbeOptions* options) {
  options->shape.batch = 8;
  options->shape.seqlen_k = 32768;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--pages-in-order") {
      options->pages_in_order = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "anyattn_decode_probe: %s needs a value\n", name.c_str());
      return false;
    }
    const char* value = argv[++i];
    if (name == "--dtype" && (std::strcmp(value, "bf16") == 0 || std::strcmp(value, "f32") == 0)) {
      options->shape.dtype = std::strcmp(value, "f32") == 0 ? DType::kF32 : DType::kBf16;
    } else if (name == "--batch") {
      options->shape.batch = std::atoll(value);
    } else if (name == "--seqlen-q") {
      options->seqlen_q = std::atoll(value);
    } else if (name == "--seqlen-k") {
      options->shape.seqlen_k = std::atoll(value);
    } else if (name == "--page-size") {
      options->shape.page_size = std::atoll(value);
    } else if (name == "--threads") {
      options->threads = std::atoi(value);
    } else if (name == "--runs") {
      options->runs = std::atoi(value);
    } else {
      std::fprintf(stderr, "anyattn_decode_probe: unknown option or value: %s %s\n", name.c_str(),
                   value);
      return false;
    }
  }
  const DecodeShape& s = options->shape;
  if (s.batch < 1 || options->seqlen_q < 1 || s.seqlen_k < 1 || s.page_size < 0 ||
      options->threads < 1 || options->runs < 1 ||
      (s.page_size > 0 && s.seqlen_k % s.page_size != 0)) {
    std::fprintf(stderr,
                 "anyattn_decode_probe: need batch, seqlen-q, seqlen-k, threads, runs >= 1 and "
                 "page-size 0 or a divisor of seqlen-k\n");
    return false;
  }
  return true;
}

int RunProbe(const ProbeOptions& options) {
  const DecodeShape& shape = options.shape;
  const size_t element_bytes = DTypeBytes(shape.dtype);
  const size_t q_elements = shape.batch * options.seqlen_q * shape.heads_q * shape.head_dim;
  const size_t kv_elements = shape.batch * shape.seqlen_k * shape.heads_k * shape.head_dim;
  AlignedBuffer q(q_elements * element_bytes);
  AlignedBuffer out(q_elements * element_bytes);
  AlignedBuffer k(kv_elements * element_bytes);
  AlignedBuffer v(kv_elements * element_bytes);
  if (!q.data() || !out.data() || !k.data() || !v.data()) {
    std::fprintf(stderr, "anyattn_decode_probe: could not allocate the buffers\n");
    return 1;
  }
  FillUniform(q.data(), shape.dtype, q_elements, 11);
  FillUniform(k.data(), shape.dtype, kv_elements, 13);
  FillUniform(v.data(), shape.dtype, kv_elements, 14);
  const int64_t pages = shape.page_size > 0 ? shape.batch * shape.seqlen_k / shape.page_size : 0;
  std::vector<int32_t> block_table = ScatteredBlockTable(pages);
  if (options.pages_in_order) std::iota(block_table.begin(), block_table.end(), 0);

  anyattn_set_num_threads(options.threads);
  AnyattnFwdCall call(shape.batch, options.seqlen_q, shape.seqlen_k, shape.heads_q, shape.heads_k,
                      shape.head_dim, shape.dtype, false, ANYATTN_ISA_AUTO, q.data(), k.data(),
                      v.data(), out.data());
  if (shape.page_size > 0) call.UsePagedCache(shape.page_size, block_table.data());
  std::string error;
  std::vector<double> seconds;
  for (int run = -1; run < options.runs; ++run) {  // run -1: warm-up
    const double start = NowSeconds();
    if (!call.Run(&error)) {
      std::fprintf(stderr, "anyattn_decode_probe: %s\n", error.c_str());
      return 1;
    }
    if (run >= 0) seconds.push_back(NowSeconds() - start);
  }
  const TimingResult timing = SummarizeRuns(std::move(seconds));
  const double kv_bytes = DecodeKvBytes(shape);
  const std::string sq = options.seqlen_q > 1 ? "/Sq" + std::to_string(options.seqlen_q) : "";
  std::printf(
      "%s%s%s threads %d: median %.4f ms, min %.4f ms (%d runs); %.1f GB/s at the median%s\n",
      DecodeKey(shape).c_str(), sq.c_str(), options.pages_in_order ? " (pages in order)" : "",
      options.threads, timing.median_seconds * 1e3, timing.min_seconds * 1e3, timing.runs,
      kv_bytes / timing.median_seconds * 1e-9,
      kv_bytes < 2.0 * static_cast<double>(LastLevelCacheBytes())
          ? " (K/V fit in twice the last-level cache: timed from cache)"
          : "");
  return 0;
}

}  // namespace
}  // namespace anyattn_bench

int main(int argc, char** argv) {
  anyattn_bench::ProbeOptions options;
  if (!anyattn_bench::ParseProbeOptions(argc, argv, &options)) return 2;
  return anyattn_bench::RunProbe(options);
}
