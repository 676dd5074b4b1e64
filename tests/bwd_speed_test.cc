// A measurement harness, not a timed test (DESIGN §6-7: no performance bars in unit tests): it is
// DISABLED_ and runs only on request, printing one row per shape of the backward table.
//   build/tests/anyattn_bwd_tests --gtest_also_run_disabled_tests --gtest_filter='BwdSpeed.*'
// Environment: ANYATTN_BWD_SPEED_REPS (default 3) timed runs after one warm-up, ANYATTN_BWD_SPEED_S
// (default 2048). Columns: median wall time and its GFLOP/s; median CPU time, GFLOP/s per
// CPU-second and its percentage of the measured peak; the same for the least CPU time of the runs
// (the run least disturbed by other processes' cache traffic). B = 1, Hq = Hk = 16, D = Dv in {64,
// 128}, causal or not, f32 and bf16, 1 and 2 threads. Useful FLOPs = 2.5 x forward = 10 D x visible
// pairs. Reported: the median wall time, and the median CPU time of the process (all threads),
// whose GFLOP/s per CPU-second is the figure to trust on a shared machine: wall time there measures
// the neighbours as much as the kernel. The percentage is of the one-core FMA peak measured at
// start-up the same way (CPU time), so on an idle machine it is also the wall-clock percentage of
// the peak of `threads` cores.
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "anyattn/anyattn.h"
#include "cpu/simd/isa_target.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

// The f32 FMA peak of one core, measured like the kernels would reach it: 16 independent AVX-512
// FMA chains (enough to cover 2 ports x 4 cycles of latency), no loads.
ANYATTN_TARGET_BEGIN("avx512f")
namespace anyattn::testing::fma_peak {
#define ANYATTN_PEAK_ALL(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define ANYATTN_PEAK_DECLARE(k) __m512 acc##k = _mm512_set1_ps(0.001f * (k));
#define ANYATTN_PEAK_STEP(k) acc##k = _mm512_fmadd_ps(acc##k, factor, addend);
#define ANYATTN_PEAK_SUM(k) sum = _mm512_add_ps(sum, acc##k);
// Returns a value derived from every chain so that none is optimised away.
__attribute__((noinline)) float fma_chains(int64_t iterations, float factor_value) {
  ANYATTN_PEAK_ALL(ANYATTN_PEAK_DECLARE)
  const __m512 factor = _mm512_set1_ps(factor_value), addend = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iterations; ++i) {
    ANYATTN_PEAK_ALL(ANYATTN_PEAK_STEP)
  }
  __m512 sum = _mm512_setzero_ps();
  ANYATTN_PEAK_ALL(ANYATTN_PEAK_SUM)
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.f;
  for (const float lane : lanes) total += lane;
  return total;
}
#undef ANYATTN_PEAK_SUM
#undef ANYATTN_PEAK_STEP
#undef ANYATTN_PEAK_DECLARE
#undef ANYATTN_PEAK_ALL
}  // namespace anyattn::testing::fma_peak
ANYATTN_TARGET_END()
#endif

namespace anyattn {
namespace testing {
namespace {

double seconds(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && std::atoi(value) > 0 ? std::atoi(value) : fallback;
}

// GFLOP/s per CPU-second of 16 AVX-512 FMA chains, the best of 3 runs; 0 without AVX-512.
double measured_fma_peak() {
#if defined(__x86_64__) || defined(_M_X64)
  if (!anyattn_isa_supported(ANYATTN_ISA_AVX512)) return 0.0;
  double best = 0.0;
  for (int run = 0; run < 3; ++run) {
    const int64_t iterations = 50000000;
    const double c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    const float sink = fma_peak::fma_chains(iterations, 0.99999f);
    const double c1 = seconds(CLOCK_PROCESS_CPUTIME_ID);
    EXPECT_TRUE(sink == sink);  // finite by construction; uses the result
    best = std::max(best, 1e-9 * static_cast<double>(iterations) * 16 * 32 / (c1 - c0));
  }
  return best;
#else
  return 0.0;
#endif
}

TEST(BwdSpeed, DISABLED_Table) {
  const double peak = measured_fma_peak();
  std::printf("measured f32 FMA peak: %.1f GFLOP/s per CPU-second (one core)\n", peak);
  const int reps = env_int("ANYATTN_BWD_SPEED_REPS", 3);
  const int64_t seqlen = env_int("ANYATTN_BWD_SPEED_S", 2048);
  const int64_t batch = 1, heads = 16;
  std::printf("%-28s %8s %7s %8s %10s %9s %10s %9s\n", "shape", "wall ms", "GF/s", "cpu ms",
              "GF/s/cpu-s", "% of peak", "best/cpu-s", "% of peak");
  for (const int64_t dim : {int64_t{64}, int64_t{128}}) {
    for (const bool causal : {false, true}) {
      for (const anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
        const size_t bytes = dtype == ANYATTN_DTYPE_F32 ? 4 : 2;
        const int64_t shape[4] = {batch, seqlen, heads, dim};
        const size_t n = static_cast<size_t>(batch * seqlen * heads * dim);
        // q, k, v, dout, out, dq, dk, dv
        std::vector<std::vector<unsigned char>> buffers(8, std::vector<unsigned char>(n * bytes));
        for (int t = 0; t < 4; ++t) {
          for (size_t e = 0; e < n; ++e) {
            const float x = static_cast<float>((e * 2654435761u + 97u * t) % 1000) / 1000.f - 0.5f;
            uint32_t bits;
            std::memcpy(&bits, &x, 4);
            if (bytes == 2) {
              const uint16_t half = static_cast<uint16_t>(bits >> 16);
              std::memcpy(&buffers[t][e * 2], &half, 2);
            } else {
              std::memcpy(&buffers[t][e * 4], &x, 4);
            }
          }
        }
        anyattn_tensor tensors[8];
        for (int t = 0; t < 8; ++t) {
          ASSERT_EQ(anyattn_tensor_init_contiguous(&tensors[t], buffers[t].data(), dtype, 4, shape),
                    ANYATTN_OK);
        }
        std::vector<float> lse_values(static_cast<size_t>(batch * heads * seqlen));
        const int64_t lse_shape[3] = {batch, heads, seqlen};
        anyattn_tensor lse;
        ASSERT_EQ(anyattn_tensor_init_contiguous(&lse, lse_values.data(), ANYATTN_DTYPE_F32, 3,
                                                 lse_shape),
                  ANYATTN_OK);
        anyattn_fwd_params params;
        anyattn_fwd_params_init(&params);
        params.causal = causal ? 1 : 0;
        ASSERT_EQ(anyattn_fwd(&tensors[0], &tensors[1], &tensors[2], &tensors[4], &lse, &params),
                  ANYATTN_OK)
            << anyattn_last_error();
        const double pairs = causal ? 0.5 * static_cast<double>(seqlen) * (seqlen + 1)
                                    : static_cast<double>(seqlen) * seqlen;
        const double flops = 2.5 * 4.0 * batch * heads * dim * pairs;
        for (const int threads : {1, 2}) {
          anyattn_set_num_threads(threads);
          std::vector<double> wall, cpu;
          for (int r = 0; r <= reps; ++r) {
            const double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
            ASSERT_EQ(anyattn_bwd(&tensors[3], &tensors[0], &tensors[1], &tensors[2], &tensors[4],
                                  &lse, &tensors[5], &tensors[6], &tensors[7], nullptr, &params),
                      ANYATTN_OK)
                << anyattn_last_error();
            const double w1 = seconds(CLOCK_MONOTONIC), c1 = seconds(CLOCK_PROCESS_CPUTIME_ID);
            if (r > 0) {  // run 0 warms up
              wall.push_back(w1 - w0);
              cpu.push_back(c1 - c0);
            }
          }
          std::sort(wall.begin(), wall.end());
          std::sort(cpu.begin(), cpu.end());
          const double w = wall[wall.size() / 2], c = cpu[cpu.size() / 2];
          char label[64];
          std::snprintf(label, sizeof(label), "S=%lld D=%lld %s %s %dt",
                        static_cast<long long>(seqlen), static_cast<long long>(dim),
                        causal ? "causal" : "full", dtype == ANYATTN_DTYPE_F32 ? "f32" : "bf16",
                        threads);
          const double best = cpu.front();
          std::printf("%-28s %8.1f %7.1f %8.1f %10.1f %8.0f%% %10.1f %8.0f%%\n", label, 1e3 * w,
                      1e-9 * flops / w, 1e3 * c, 1e-9 * flops / c,
                      peak > 0 ? 100.0 * 1e-9 * flops / c / peak : 0.0, 1e-9 * flops / best,
                      peak > 0 ? 100.0 * 1e-9 * flops / best / peak : 0.0);
          std::fflush(stdout);
        }
        anyattn_set_num_threads(0);
      }
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
