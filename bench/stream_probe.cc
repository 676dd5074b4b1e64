// anyattn_stream_probe: how much of the machine's streaming read bandwidth a loop keeps when it
// also computes. Each thread sums its slice of one large buffer, one 64-byte line per step, and
// runs F independent FMAs on every line (F = 0: the plain read anyattn_bench measures at start-up).
// The decode loop spends about 12 cycles of arithmetic per line of K/V it reads (bf16, GQA 4:
// bench/MEASUREMENTS.md, "Where the decode loop waits"), so the F = 8 to 16 rows show what a loop
// of that weight can read here at best, with the hardware prefetchers alone or with a prefetcht0
// --prefetch-bytes ahead.
//
//   anyattn_stream_probe [--threads T] [--mib N] [--fmas-list 0,8,12,16] [--prefetch-bytes B]
//                        [--huge-pages] [--passes P]
//
// Defaults: 2 threads, 1024 MiB, F in {0, 4, 8, 12, 16, 24}, no software prefetch, the
// allocator's pages, 7 passes per F; prints the median and best GB/s of each F. Needs AVX-512.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "released_threads.h"
#include "timing.h"

namespace anyattn_bench {
namespace {

std::atomic<float> g_sink{0.0f};

// Sums floats [0, count) (count a multiple of 16) line by line with F FMAs per line on 11
// independent accumulators, prefetching prefetch_bytes ahead when that is positive.
template <int F>
__attribute__((target("avx512f"))) float ComputeOverLines(const float* data, size_t count,
                                                          size_t prefetch_bytes) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1e-3f * static_cast<float>(i));
  const __m512 factor = _mm512_set1_ps(0.999f);
  const char* bytes = reinterpret_cast<const char*>(data);
  for (size_t i = 0; i < count; i += 16) {
    if (prefetch_bytes != 0) _mm_prefetch(bytes + i * sizeof(float) + prefetch_bytes, _MM_HINT_T0);
    const __m512 line = _mm512_load_ps(data + i);
    acc[0] = _mm512_add_ps(acc[0], line);
#pragma GCC unroll 32
    for (int f = 0; f < F; ++f) {
      acc[1 + f % 11] = _mm512_fmadd_ps(acc[1 + f % 11], factor, line);
    }
  }
  __m512 total = acc[0];
  for (int i = 1; i < 12; ++i) total = _mm512_add_ps(total, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

using LineLoop = float (*)(const float*, size_t, size_t);

LineLoop LoopFor(int fmas) {
  switch (fmas) {
    case 0:
      return ComputeOverLines<0>;
    case 4:
      return ComputeOverLines<4>;
    case 8:
      return ComputeOverLines<8>;
    case 12:
      return ComputeOverLines<12>;
    case 16:
      return ComputeOverLines<16>;
    case 24:
      return ComputeOverLines<24>;
    default:
      return nullptr;
  }
}

struct StreamOptions {
  int threads = 2;
  size_t mib = 1024;
  std::vector<int> fmas = {0, 4, 8, 12, 16, 24};
  size_t prefetch_bytes = 0;
  bool huge_pages = false;
  int passes = 7;
};

bool ParseStreamOptions(int argc, char** argv, StreamOptions* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--huge-pages") {
      options->huge_pages = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "anyattn_stream_probe: %s needs a value\n", name.c_str());
      return false;
    }
    const char* value = argv[++i];
    if (name == "--threads") {
      options->threads = std::atoi(value);
    } else if (name == "--mib") {
      options->mib = static_cast<size_t>(std::atoll(value));
    } else if (name == "--prefetch-bytes") {
      options->prefetch_bytes = static_cast<size_t>(std::atoll(value));
    } else if (name == "--passes") {
      options->passes = std::atoi(value);
    } else if (name == "--fmas-list") {
      options->fmas.clear();
      for (const char* p = value; *p != '\0';) {
        options->fmas.push_back(std::atoi(p));
        const char* comma = std::strchr(p, ',');
        p = comma == nullptr ? p + std::strlen(p) : comma + 1;
      }
    } else {
      std::fprintf(stderr, "anyattn_stream_probe: unknown option or value: %s %s\n", name.c_str(),
                   value);
      return false;
    }
  }
  for (int f : options->fmas) {
    if (LoopFor(f) == nullptr) {
      std::fprintf(stderr, "anyattn_stream_probe: --fmas-list takes 0, 4, 8, 12, 16, 24 (got %d)\n",
                   f);
      return false;
    }
  }
  if (options->threads < 1 || options->mib < 1 || options->passes < 1 || options->fmas.empty()) {
    std::fprintf(stderr, "anyattn_stream_probe: need threads, mib, passes >= 1 and some FMAs\n");
    return false;
  }
  return true;
}

// Seconds for `threads` threads, released together, to run `loop` over disjoint slices of data
// (as anyattn_bench's start-up read splits and times its passes).
double TimePass(LineLoop loop, const float* data, size_t count, int threads,
                size_t prefetch_bytes) {
  return TimeOnThreads(threads, [&](int t) {
    const ThreadSlice slice = SliceOf(count, threads, t);
    g_sink.store(loop(data + slice.begin, slice.end - slice.begin, prefetch_bytes),
                 std::memory_order_relaxed);
  });
}

int RunStream(const StreamOptions& options) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("anyattn_stream_probe: needs AVX-512; nothing to measure on this CPU\n");
    return 0;
  }
  const size_t bytes = options.mib << 20;
  // Room past the end for the prefetches, which never fault but should not leave the mapping.
  const size_t allocated =
      (bytes + options.prefetch_bytes + (size_t{2} << 20)) / (size_t{2} << 20) * (size_t{2} << 20);
  float* data = static_cast<float*>(std::aligned_alloc(size_t{2} << 20, allocated));
  if (data == nullptr) {
    std::fprintf(stderr, "anyattn_stream_probe: could not allocate %zu MiB\n", options.mib);
    return 1;
  }
  if (options.huge_pages) madvise(data, allocated, MADV_HUGEPAGE);
  const size_t count = bytes / sizeof(float);
  for (size_t i = 0; i < allocated / sizeof(float); ++i) {
    data[i] = static_cast<float>(i & 1023) * 1e-3f;
  }
  const std::string prefetch =
      options.prefetch_bytes != 0
          ? "prefetcht0 " + std::to_string(options.prefetch_bytes) + " bytes ahead"
          : std::string("no software prefetch");
  std::printf("streaming read with F FMAs per 64-byte line: %d thread(s), %zu MiB, %s pages, %s\n",
              options.threads, options.mib, options.huge_pages ? "2 MiB" : "default",
              prefetch.c_str());
  for (int f : options.fmas) {
    const LineLoop loop = LoopFor(f);
    std::vector<double> gbps;
    TimePass(loop, data, count, options.threads, options.prefetch_bytes);  // warm-up
    for (int pass = 0; pass < options.passes; ++pass) {
      gbps.push_back(bytes / TimePass(loop, data, count, options.threads, options.prefetch_bytes) *
                     1e-9);
    }
    std::printf("  F %2d: median %6.1f GB/s, best %6.1f GB/s (%d passes)\n", f, Median(gbps),
                *std::max_element(gbps.begin(), gbps.end()), options.passes);
  }
  std::free(data);
  return 0;
}

}  // namespace
}  // namespace anyattn_bench

int main(int argc, char** argv) {
  anyattn_bench::StreamOptions options;
  if (!anyattn_bench::ParseStreamOptions(argc, argv, &options)) return 2;
  return anyattn_bench::RunStream(options);
}
