// Measures this machine's compute and memory limits, the denominators of every percentage the
// benchmark prints. Nothing here is hard-coded: each figure is measured when the benchmark starts.
#ifndef ANYATTN_BENCH_MACHINE_LIMITS_H_
#define ANYATTN_BENCH_MACHINE_LIMITS_H_

#include <cstddef>
#include <cstdint>

namespace anyattn_bench {

// The widest f32 vector instruction set the running CPU offers, chosen at run time.
enum class VectorIsa { kScalar, kAvx2Fma, kAvx512 };

// The ISA the measurement loops use on this CPU (AVX-512F if present, else AVX2+FMA, else scalar).
VectorIsa DetectVectorIsa();

// "avx512", "avx2+fma" or "scalar". Static storage.
const char* VectorIsaName(VectorIsa isa);

// f32 FMA throughput in GFLOP/s (one FMA = 2 FLOPs) of `threads` threads running at once, each an
// unrolled register-only FMA loop with independent accumulators. Spends about `seconds` in 15
// trials and returns the best. Requires threads >= 1.
double MeasureFmaPeakGflops(int threads, double seconds);

// One trial of that measurement, calibrated once: `threads` threads each run the FMA loop for
// about `seconds`. Run() can then be repeated between other timed calls to see what the cores
// deliver at that moment.
class FmaBurst {
 public:
  FmaBurst(int threads, double seconds);
  // Runs one burst; returns its GFLOP/s.
  double Run() const;

 private:
  VectorIsa isa_;
  int threads_;
  int64_t iterations_;
};

// A streaming read's rate over several passes, GB/s (1e9 bytes/s); 0 if it could not run.
struct ReadBandwidth {
  double median_gbps = 0.0;  // what the decode targets compare with, as they compare medians
  double best_gbps = 0.0;    // the fastest pass: a host's momentary peak
};

// Streaming read bandwidth of `threads` threads summing disjoint slices of one buffer of `bytes`
// bytes (on transparent 2 MiB pages where the kernel gives them) with vector loads. The buffer
// is written once first so that every page is resident; returns the median and the best of
// `passes` timed passes. Requires threads >= 1, passes >= 1.
ReadBandwidth MeasureReadBandwidth(int threads, size_t bytes, int passes);

// One streaming read pass: `threads` threads sum disjoint slices of data[0 .. count) (count a
// multiple of 64 floats, 64-byte aligned) with vector loads; returns the wall-clock seconds. The
// caller owns the buffer, so it can be the same kind of memory as the data it is compared with.
double TimeReadPass(const float* data, size_t count, int threads);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_MACHINE_LIMITS_H_
