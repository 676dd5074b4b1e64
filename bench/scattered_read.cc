// anyattn_scattered_read: how fast this machine reads a large buffer in chunks taken in a
// scattered order, against the same chunks in memory order, passes alternating in one process.
//
//   anyattn_scattered_read [--mib M] [--chunk-kib K1,K2,...] [--threads T] [--rounds N]
//
// A paged KV cache of pages of P keys holds, per page, P key rows of all kv heads side by side:
// with B8 Hk8 D128 bf16, 16-key pages are 32 KiB chunks of K (and of V) that the block table
// scatters over the pool. The decode loop reads each chunk whole while its hints fetch the next
// one, so its rate is bounded by what the memory delivers for chunks of that size in that order,
// not by the streaming read that anyattn_bench compares every row with. This probe measures
// both: the buffer (M MiB, 2 MiB pages, default 1024) is cut into chunks of K KiB, each thread
// takes a contiguous share of the chunk list, in memory order or in the order of
// ScatteredBlockTable (bench/tensors.h, the benches' block tables), and sums each chunk's floats
// while it asks for the next chunk's lines into L2, line by line, as the decode loop's far hints
// do. Default chunks 4, 16, 32, 64, 128 and 512 KiB, 2 threads, 9 rounds; each round times one
// pass of each order per chunk size, and the report gives the median GB/s of each and the median
// over rounds of scattered / in order.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "integer_list.h"
#include "released_threads.h"
#include "tensors.h"
#include "timing.h"

namespace anyattn_bench {
namespace {

std::atomic<float> g_sink{0.0f};

struct ScatterOptions {
  size_t mib = 1024;
  std::vector<int64_t> chunk_kib = {4, 16, 32, 64, 128, 512};
  int threads = 2;
  int rounds = 9;
};

bool ParseScatterOptions(int argc, char** argv, ScatterOptions* options) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const char* value = argv[i + 1];
    if (name == "--mib") {
      options->mib = std::strtoull(value, nullptr, 10);
    } else if (name == "--threads") {
      options->threads = std::atoi(value);
    } else if (name == "--rounds") {
      options->rounds = std::atoi(value);
    } else if (name == "--chunk-kib") {
      if (!ParseIntegerList(value, &options->chunk_kib)) return false;
    } else {
      return false;
    }
  }
  if (argc % 2 == 0 || options->threads < 1 || options->rounds < 1 || options->chunk_kib.empty()) {
    return false;
  }
  for (int64_t kib : options->chunk_kib) {
    if (kib <= 0 || static_cast<size_t>(kib) * 1024 * static_cast<size_t>(options->threads) >
                        options->mib << 20) {
      return false;
    }
  }
  return true;
}

// Sums the floats of chunk order[i] for i in [begin, end), each chunk `chunk_bytes` long (a
// multiple of 64), hinting the next chunk of the share into L2 one line per line loaded.
float SumChunks(const char* base, const std::vector<int32_t>& order, size_t begin, size_t end,
                size_t chunk_bytes) {
  float lanes[16] = {};
  for (size_t i = begin; i < end; ++i) {
    const char* chunk = base + static_cast<size_t>(order[i]) * chunk_bytes;
    const char* next = base + static_cast<size_t>(order[i + 1 < end ? i + 1 : i]) * chunk_bytes;
    for (size_t offset = 0; offset < chunk_bytes; offset += 64) {
      __builtin_prefetch(next + offset, 0, 2);
      const float* line = reinterpret_cast<const float*>(chunk + offset);
      for (int j = 0; j < 16; ++j) lanes[j] += line[j];
    }
  }
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

double TimePass(const char* base, const std::vector<int32_t>& order, size_t chunk_bytes,
                int threads) {
  return TimeOnThreads(threads, [&](int t) {
    const size_t share = order.size() / threads;
    const size_t begin = t * share;
    const size_t end = t == threads - 1 ? order.size() : begin + share;
    g_sink.store(SumChunks(base, order, begin, end, chunk_bytes), std::memory_order_relaxed);
  });
}

int Run(const ScatterOptions& options) {
  const size_t bytes = options.mib << 20;
  AlignedBuffer buffer(bytes, Pages::kHuge);
  if (buffer.data() == nullptr) {
    std::fprintf(stderr, "anyattn_scattered_read: cannot allocate %zu MiB\n", options.mib);
    return 1;
  }
  std::memset(buffer.data(), 0, bytes);
  const char* base = static_cast<const char*>(buffer.data());
  std::printf("%zu MiB on 2 MiB pages, %d thread(s), %d rounds; GB/s medians\n", options.mib,
              options.threads, options.rounds);
  for (int64_t kib : options.chunk_kib) {
    const size_t chunk_bytes = static_cast<size_t>(kib) * 1024;
    const int64_t chunks = static_cast<int64_t>(bytes / chunk_bytes);
    std::vector<int32_t> in_order(chunks);
    for (int64_t i = 0; i < chunks; ++i) in_order[i] = static_cast<int32_t>(i);
    const std::vector<int32_t> scattered = ScatteredBlockTable(chunks);
    const double read_bytes = static_cast<double>(chunks) * chunk_bytes;
    std::vector<double> ordered_gbps, scattered_gbps, ratios;
    for (int round = -1; round < options.rounds; ++round) {  // round -1: warm-up
      const bool scattered_first = round % 2 != 0;
      double ordered_s = 0.0, scattered_s = 0.0;
      for (int turn = 0; turn < 2; ++turn) {
        const bool scattered_turn = (turn == 0) == scattered_first;
        const double s = TimePass(base, scattered_turn ? scattered : in_order, chunk_bytes,
                                  options.threads);
        (scattered_turn ? scattered_s : ordered_s) = s;
      }
      if (round < 0) continue;
      ordered_gbps.push_back(read_bytes / ordered_s * 1e-9);
      scattered_gbps.push_back(read_bytes / scattered_s * 1e-9);
      ratios.push_back(ordered_s / scattered_s);
    }
    std::printf(
        "  chunks of %4lld KiB: in order %6.1f, scattered %6.1f, scattered / in order %.3f\n",
        static_cast<long long>(kib), Median(ordered_gbps), Median(scattered_gbps), Median(ratios));
  }
  return 0;
}

}  // namespace
}  // namespace anyattn_bench

int main(int argc, char** argv) {
  anyattn_bench::ScatterOptions options;
  if (!anyattn_bench::ParseScatterOptions(argc, argv, &options)) {
    std::fprintf(stderr,
                 "usage: anyattn_scattered_read [--mib M] [--chunk-kib K1,K2,...] [--threads T] "
                 "[--rounds N]\n(chunk sizes >= 1 KiB, at least one chunk per thread)\n");
    return 2;
  }
  return anyattn_bench::Run(options);
}
