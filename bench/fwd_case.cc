#include <algorithm>
#include <cmath>
#include <memory>
#include <sstream>

#include "anyattn_runner.h"
#include "baseline_openblas.h"
#include "bench_cases.h"
#include "peak_alongside.h"
#include "tensors.h"

namespace anyattn_bench {
namespace {

// Largest |a - b| over `count` elements of `dtype`; NaN if any element is NaN.
double MaxAbsDiff(const void* a, const void* b, DType dtype, size_t count) {
  double worst = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double diff = std::fabs(static_cast<double>(LoadAsF32(a, dtype, i)) -
                                  static_cast<double>(LoadAsF32(b, dtype, i)));
    if (std::isnan(diff)) return diff;
    worst = std::max(worst, diff);
  }
  return worst;
}

// Agreement bound between anyattn and the baseline for inputs uniform in [-1, 1): f32 results
// differ only by summation order; bf16 results may land one bf16 rounding step (2^-8 relative)
// apart, on outputs below 1 in magnitude.
double Tolerance(DType dtype) {
  return dtype == DType::kF32 ? 1e-4 : 2e-2;
}

}  // namespace

FwdRow RunFwdCase(const FwdShape& shape, const MachineLimits& limits,
                  const CaseSettings& settings) {
  FwdRow row;
  row.shape = shape;
  row.threads = limits.threads;
  row.flops = FwdFlops(shape);
  row.peak_gflops = limits.fma_peak_gflops;
  row.max_abs_diff = std::nan("");

  const FwdBuffers buffers(shape);
  if (!buffers.ok()) {
    row.anyattn_error = "benchmark could not allocate the inputs";
    return row;
  }
  const size_t q_elements = buffers.q_elements;
  const size_t element_bytes = DTypeBytes(shape.dtype);
  const AnyattnFwdCall call = buffers.Call(settings.isa);

  // The baseline, unless disabled or over the score-matrix cap.
  std::unique_ptr<UnfusedBaseline> baseline;
  AlignedBuffer baseline_out;
  const double score_bytes = UnfusedBaseline::ScoreBytes(shape);
  if (!settings.run_baseline) {
    row.baseline_skipped = "disabled";
  } else if (score_bytes > settings.baseline_cap_bytes) {
    std::ostringstream reason;
    reason << "scores " << score_bytes / (1 << 20) << " MiB > cap "
           << settings.baseline_cap_bytes / (1 << 20) << " MiB";
    row.baseline_skipped = reason.str();
  } else {
    baseline_out = AlignedBuffer(q_elements * element_bytes);
    baseline = std::make_unique<UnfusedBaseline>(shape, limits.threads);
    if (!baseline->ok() || !baseline_out.data()) {
      row.baseline_skipped = "could not allocate the score matrix";
      baseline.reset();
    }
  }

  // The baseline in alternation with anyattn, so that the ratio sees one state of the host; it
  // rests after each chunk so that its spinning workers do not slow anyattn.
  InterleavedRun blas;
  blas.run = [&] {
    baseline->Run(buffers.q.data(), buffers.k.data(), buffers.v.data(), baseline_out.data());
    return true;
  };
  blas.rest_seconds = kOpenBlasSpinSeconds;
  const TimedAlongsidePeak timed = TimeAlongsidePeak(
      limits.threads, [&] { return call.Run(&row.anyattn_error); }, baseline ? &blas : nullptr,
      settings.policy);
  row.anyattn = timed.anyattn;
  row.peak_now_gflops = timed.peak_now_gflops;
  if (!baseline) return row;
  row.baseline = timed.peer;
  if (row.anyattn && row.baseline) {
    row.max_abs_diff = MaxAbsDiff(buffers.out.data(), baseline_out.data(), shape.dtype, q_elements);
    row.outputs_agree = row.max_abs_diff <= Tolerance(shape.dtype);
  }
  return row;
}

}  // namespace anyattn_bench
