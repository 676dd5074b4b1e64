#include "anyattn_runner.h"
#include "bench_cases.h"
#include "process_info.h"
#include "tensors.h"

namespace anyattn_bench {

const char* RssCaseKey() {
  return "rss/f32/full/B1/Hq8/Hk8/D128/S32768";
}

RssCaseResult RunRssCase(int threads, anyattn_isa isa) {
  constexpr int64_t kSeqlen = 32768;
  constexpr int64_t kHeads = 8;
  constexpr int64_t kHeadDim = 128;
  RssCaseResult result;
  anyattn_set_num_threads(threads);
  result.threads = anyattn_get_num_threads();
  const size_t elements = kSeqlen * kHeads * kHeadDim;
  const size_t bytes = elements * sizeof(float);
  result.inputs_outputs_bytes = static_cast<int64_t>(4 * bytes);
  AlignedBuffer q(bytes);
  AlignedBuffer k(bytes);
  AlignedBuffer v(bytes);
  AlignedBuffer out(bytes);
  if (!q.data() || !k.data() || !v.data() || !out.data()) {
    result.error = "benchmark could not allocate the inputs";
    return result;
  }
  FillUniform(q.data(), DType::kF32, elements, 21);
  FillUniform(k.data(), DType::kF32, elements, 22);
  FillUniform(v.data(), DType::kF32, elements, 23);
  FillUniform(out.data(), DType::kF32, elements, 24);
  result.rss_before_call_bytes = CurrentRssBytes();
  const AnyattnFwdCall call(1, kSeqlen, kSeqlen, kHeads, kHeads, kHeadDim, DType::kF32, false, isa,
                            q.data(), k.data(), v.data(), out.data());
  const double start = NowSeconds();
  result.ran = call.Run(&result.error);
  result.seconds = NowSeconds() - start;
  result.peak_rss_bytes = PeakRssBytes();
  return result;
}

}  // namespace anyattn_bench
