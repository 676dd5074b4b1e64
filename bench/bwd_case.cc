#include <cmath>

#include "anyattn_runner.h"
#include "bench_cases.h"
#include "peak_alongside.h"
#include "tensors.h"

namespace anyattn_bench {
namespace {

// True when every one of the `count` elements of `data` (of `dtype`) is finite.
bool AllFinite(const void* data, DType dtype, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(LoadAsF32(data, dtype, i))) return false;
  }
  return true;
}

}  // namespace

BwdRow RunBwdCase(const FwdShape& shape, const MachineLimits& limits,
                  const CaseSettings& settings) {
  BwdRow row;
  row.shape = shape;
  row.threads = limits.threads;
  row.flops = BwdFlops(shape);
  row.peak_gflops = limits.fma_peak_gflops;

  const size_t element_bytes = DTypeBytes(shape.dtype);
  const size_t q_elements = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim;
  const size_t kv_elements = shape.batch * shape.seqlen_k * shape.heads_k * shape.head_dim;
  const size_t lse_elements = shape.batch * shape.heads_q * shape.seqlen_q;
  AlignedBuffer q(q_elements * element_bytes);
  AlignedBuffer k(kv_elements * element_bytes);
  AlignedBuffer v(kv_elements * element_bytes);
  AlignedBuffer dout(q_elements * element_bytes);
  AlignedBuffer out(q_elements * element_bytes);
  AlignedBuffer lse(lse_elements * sizeof(float));
  AlignedBuffer dq(q_elements * element_bytes);
  AlignedBuffer dk(kv_elements * element_bytes);
  AlignedBuffer dv(kv_elements * element_bytes);
  for (const AlignedBuffer* buffer : {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv}) {
    if (buffer->data() == nullptr) {
      row.anyattn_error = "benchmark could not allocate the tensors";
      return row;
    }
  }
  FillUniform(q.data(), shape.dtype, q_elements, 21);
  FillUniform(k.data(), shape.dtype, kv_elements, 22);
  FillUniform(v.data(), shape.dtype, kv_elements, 23);
  FillUniform(dout.data(), shape.dtype, q_elements, 24);
  FillUniform(dq.data(), shape.dtype, q_elements, 25);
  FillUniform(dk.data(), shape.dtype, kv_elements, 26);
  FillUniform(dv.data(), shape.dtype, kv_elements, 27);

  BwdBuffers buffers;
  buffers.q = q.data();
  buffers.k = k.data();
  buffers.v = v.data();
  buffers.dout = dout.data();
  buffers.out = out.data();
  buffers.lse = lse.f32();
  buffers.dq = dq.data();
  buffers.dk = dk.data();
  buffers.dv = dv.data();
  const AnyattnBwdCall call(shape, settings.isa, buffers);
  if (!call.RunForward(&row.anyattn_error)) {
    row.anyattn_error = "forward: " + row.anyattn_error;
    return row;
  }
  const TimedAlongsidePeak timed = TimeAlongsidePeak(
      limits.threads, [&] { return call.Run(&row.anyattn_error); }, nullptr, settings.policy);
  row.anyattn = timed.anyattn;
  row.peak_now_gflops = timed.peak_now_gflops;
  if (row.anyattn) {
    row.gradients_finite = AllFinite(dq.data(), shape.dtype, q_elements) &&
                           AllFinite(dk.data(), shape.dtype, kv_elements) &&
                           AllFinite(dv.data(), shape.dtype, kv_elements);
  }
  return row;
}

}  // namespace anyattn_bench
