// Streaming read bandwidth: disjoint slices of one large resident buffer are summed with vector
// loads by all threads at once. The buffer is far larger than the caches, so the rate is DRAM's.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "machine_limits.h"
#include "released_threads.h"
#include "timing.h"

namespace anyattn_bench {
namespace {

std::atomic<float> g_read_sink{0.0f};

// Sums `count` floats (a multiple of 64, 64-byte aligned) with four independent 16-lane chains.
__attribute__((target("avx512f"))) float SumAvx512(const float* data, size_t count) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (size_t i = 0; i < count; i += 64) {
    acc0 = _mm512_add_ps(acc0, _mm512_load_ps(data + i));
    acc1 = _mm512_add_ps(acc1, _mm512_load_ps(data + i + 16));
    acc2 = _mm512_add_ps(acc2, _mm512_load_ps(data + i + 32));
    acc3 = _mm512_add_ps(acc3, _mm512_load_ps(data + i + 48));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

// Sums `count` floats (a multiple of 64, 32-byte aligned) with eight independent 8-lane chains.
__attribute__((target("avx2"))) float SumAvx2(const float* data, size_t count) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (size_t i = 0; i < count; i += 64) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_load_ps(data + i + 8 * j));
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

// Sums `count` floats with plain C++ (vectorised by the compiler to the baseline ISA).
float SumScalar(const float* data, size_t count) {
  float acc[16] = {};
  for (size_t i = 0; i < count; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += data[i + j];
  }
  float sum = 0.0f;
  for (float a : acc) sum += a;
  return sum;
}

// Sums `count` floats with the loop of `isa`.
float SumWith(VectorIsa isa, const float* data, size_t count) {
  switch (isa) {
    case VectorIsa::kAvx512:
      return SumAvx512(data, count);
    case VectorIsa::kAvx2Fma:
      return SumAvx2(data, count);
    case VectorIsa::kScalar:
      return SumScalar(data, count);
  }
  return 0.0f;
}

}  // namespace

double TimeReadPass(const float* data, size_t count, int threads) {
  const VectorIsa isa = DetectVectorIsa();
  return TimeOnThreads(threads, [&](int t) {
    const ThreadSlice slice = SliceOf(count, threads, t);
    g_read_sink.store(SumWith(isa, data + slice.begin, slice.end - slice.begin),
                      std::memory_order_relaxed);
  });
}

ReadBandwidth MeasureReadBandwidth(int threads, size_t bytes, int passes) {
  constexpr size_t kChunkFloats = 64;
  const size_t chunks = bytes / sizeof(float) / kChunkFloats;
  const size_t count = chunks * kChunkFloats;
  float* data = static_cast<float*>(std::aligned_alloc(2 << 20, count * sizeof(float)));
  if (data == nullptr) return {};
  madvise(data, count * sizeof(float), MADV_HUGEPAGE);
  TimeOnThreads(threads, [&](int t) {
    const ThreadSlice slice = SliceOf(count, threads, t);
    for (size_t i = slice.begin; i < slice.end; ++i) data[i] = static_cast<float>(i & 1023) * 1e-3f;
  });
  std::vector<double> gbps;
  for (int pass = 0; pass < passes; ++pass) {
    const double seconds = TimeReadPass(data, count, threads);
    gbps.push_back(count * sizeof(float) / seconds * 1e-9);
  }
  std::free(data);
  ReadBandwidth result;
  result.median_gbps = Median(gbps);
  result.best_gbps = *std::max_element(gbps.begin(), gbps.end());
  return result;
}

}  // namespace anyattn_bench
