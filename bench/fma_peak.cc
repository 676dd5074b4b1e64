// f32 FMA peak: every thread runs a chain-free FMA loop on registers only, so the measured rate is
// bounded by the FMA ports and the clock the core sustains, not by memory or latency.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "machine_limits.h"

namespace anyattn_bench {
namespace {

// Independent accumulators per loop: more than FMA latency (4) times FMA ports (2), so the loop
// never waits on a previous result.
constexpr int kAccumulators = 12;

// Sink that keeps the compiler from discarding the loops' results.
std::atomic<float> g_fma_sink{0.0f};

// Runs `iterations` rounds of kAccumulators independent 16-lane FMAs. Returns a value derived from
// every accumulator. FLOPs performed: iterations * kAccumulators * 16 * 2.
__attribute__((target("avx512f"))) float FmaLoopAvx512(int64_t iterations) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 scale = _mm512_set1_ps(0.999999f);
  const __m512 bias = _mm512_set1_ps(1e-6f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_fmadd_ps(acc[i], scale, bias);
  }
  __m512 total = acc[0];
  for (int i = 1; i < kAccumulators; ++i) total = _mm512_add_ps(total, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

// The AVX2+FMA version of FmaLoopAvx512. FLOPs performed: iterations * kAccumulators * 8 * 2.
__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iterations) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 scale = _mm256_set1_ps(0.999999f);
  const __m256 bias = _mm256_set1_ps(1e-6f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_fmadd_ps(acc[i], scale, bias);
  }
  __m256 total = acc[0];
  for (int i = 1; i < kAccumulators; ++i) total = _mm256_add_ps(total, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0.0f;
  for (float lane : lanes) sum += lane;
  return sum;
}

// Portable fallback: scalar multiply-adds the compiler may or may not fuse. FLOPs performed:
// iterations * kAccumulators * 2.
float FmaLoopScalar(int64_t iterations) {
  float acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = static_cast<float>(i);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kAccumulators; ++i) acc[i] = acc[i] * 0.999999f + 1e-6f;
  }
  float sum = 0.0f;
  for (float a : acc) sum += a;
  return sum;
}

// f32 lanes per FMA instruction of `isa`.
int LanesPerFma(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::kAvx512:
      return 16;
    case VectorIsa::kAvx2Fma:
      return 8;
    case VectorIsa::kScalar:
      return 1;
  }
  return 1;
}

// Runs the FMA loop of `isa` for `iterations` rounds.
float RunFmaLoop(VectorIsa isa, int64_t iterations) {
  switch (isa) {
    case VectorIsa::kAvx512:
      return FmaLoopAvx512(iterations);
    case VectorIsa::kAvx2Fma:
      return FmaLoopAvx2(iterations);
    case VectorIsa::kScalar:
      return FmaLoopScalar(iterations);
  }
  return 0.0f;
}

// Wall-clock seconds for `threads` threads to each run `iterations` rounds, all released at once.
double TimeFmaThreads(VectorIsa isa, int threads, int64_t iterations) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      g_fma_sink.store(RunFmaLoop(isa, iterations), std::memory_order_relaxed);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& worker : workers) worker.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Iterations of the FMA loop of `isa` that one thread runs in about `seconds`.
int64_t CalibratedIterations(VectorIsa isa, double seconds) {
  int64_t iterations = 1 << 16;
  double elapsed = TimeFmaThreads(isa, 1, iterations);
  while (elapsed < 0.01) {
    iterations *= 4;
    elapsed = TimeFmaThreads(isa, 1, iterations);
  }
  return std::max<int64_t>(1, static_cast<int64_t>(iterations * seconds / elapsed));
}

}  // namespace

VectorIsa DetectVectorIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return VectorIsa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorIsa::kAvx2Fma;
  return VectorIsa::kScalar;
}

const char* VectorIsaName(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::kAvx512:
      return "avx512";
    case VectorIsa::kAvx2Fma:
      return "avx2+fma";
    case VectorIsa::kScalar:
      return "scalar";
  }
  return "unknown";
}

double MeasureFmaPeakGflops(int threads, double seconds) {
  // Many short trials rather than a few long ones: other work on the machine can only lower a
  // trial's rate, so the best short trial is the best estimate of what the cores can do.
  constexpr int kTrials = 15;
  const FmaBurst trial(threads, seconds / kTrials);
  double best = 0.0;
  for (int t = 0; t < kTrials; ++t) best = std::max(best, trial.Run());
  return best;
}

FmaBurst::FmaBurst(int threads, double seconds)
    : isa_(DetectVectorIsa()),
      threads_(threads),
      iterations_(CalibratedIterations(isa_, seconds)) {}

double FmaBurst::Run() const {
  const double flops = 2.0 * kAccumulators * LanesPerFma(isa_) * iterations_ * threads_;
  return flops / TimeFmaThreads(isa_, threads_, iterations_) * 1e-9;
}

}  // namespace anyattn_bench
