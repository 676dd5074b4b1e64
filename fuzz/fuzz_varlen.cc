// libFuzzer harness for anyattn_fwd_varlen: packed q/k/v with random strides and dtypes, random
// cu_seqlens (leading rows outside every sequence, empty sequences), optional seqused_k, masks,
// softcap, sinks, and corrupted sequence metadata the validation must reject (negative start,
// decreasing offsets, offsets past total rows, lengths above max_seqlen, seqused_k out of range,
// wrong index dtype). Accepted calls must match the f64 reference (reference_cache.h) on every
// row inside a sequence, leave rows outside every sequence and all padding untouched, and write
// the same bytes again with another thread count.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_common.h"
#include "fuzz_varlen_meta.h"
#include "reference/reference_cache.h"

using anyattn_fuzz::FuzzTensor;
using anyattn_fuzz::StrideKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  FuzzedDataProvider data(bytes, size);
  const anyattn_fuzz::VarlenShape shape(data);
  const int32_t dtype = shape.dtype;
  const int64_t B = shape.B, Hk = shape.Hk, Hq = shape.Hq, D = shape.D, Dv = shape.Dv;

  // Sequence metadata: valid by construction, then possibly corrupted.
  const anyattn_fuzz::VarlenMeta meta = anyattn_fuzz::make_varlen_meta(data, B);
  const int64_t total_q = meta.total_q, total_k = meta.total_k;
  bool must_fail = meta.must_fail;

  const int64_t q_shape[3] = {total_q, Hq, D}, k_shape[3] = {total_k, Hk, D};
  const int64_t v_shape[3] = {total_k, Hk, Dv}, out_shape[3] = {total_q, Hq, Dv};
  const int64_t lse_shape[2] = {Hq, total_q};
  auto tensor = [&](int32_t dt, int rank, const int64_t* dims, unsigned char fill) {
    return anyattn_fuzz::draw_tensor(data, dt, rank, dims, fill, 2);
  };
  FuzzTensor q = tensor(dtype, 3, q_shape, 0), k = tensor(dtype, 3, k_shape, 0);
  FuzzTensor v = tensor(dtype, 3, v_shape, 0);
  FuzzTensor out = tensor(dtype, 3, out_shape, 0xA5);
  FuzzTensor lse = tensor(ANYATTN_DTYPE_F32, 2, lse_shape, 0x5A);
  const bool hostile = data.ConsumeBool();
  const int poisoned = hostile ? data.ConsumeIntegralInRange<int>(0, 2) : -1;
  anyattn_fuzz::fill_values(data, q, poisoned == 0);
  anyattn_fuzz::fill_values(data, k, poisoned == 1);
  anyattn_fuzz::fill_values(data, v, poisoned == 2);
  // Broadcast outputs overlap themselves where two written elements share an address: over the
  // heads (dim 1 of out, dim 0 of lse) once any row is written, over rows (dim 0 of out) once
  // two rows are.
  const int64_t written_rows = meta.rows_in_sequences();
  if (out.t.strides[0] == 0 && written_rows > 1) must_fail = true;
  if (out.t.strides[1] == 0 && Hq > 1 && written_rows > 0) must_fail = true;
  const bool lse_broadcast = lse.t.strides[0] == 0 && Hq > 1 && written_rows > 0;

  const bool float_index = meta.corruption == 8;
  FuzzTensor tcq = anyattn_fuzz::make_index_tensor(meta.cu_q);
  FuzzTensor tck = anyattn_fuzz::make_index_tensor(meta.cu_k);
  FuzzTensor tused = anyattn_fuzz::make_index_tensor(meta.used);
  if (float_index) {
    tcq.t.dtype = ANYATTN_DTYPE_F32;
    must_fail = true;
  }

  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.causal = data.ConsumeBool();
  params.window_left = data.ConsumeIntegralInRange<int32_t>(-1, 4);
  params.window_right = data.ConsumeIntegralInRange<int32_t>(-1, 4);
  params.softcap = data.ConsumeBool() ? 5.0f : 0.0f;
  params.num_splits = data.ConsumeIntegralInRange<int32_t>(0, 3);
  const int64_t sinks_shape[1] = {Hq};
  FuzzTensor sinks = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 1, sinks_shape,
                                               StrideKind::kContiguous, 0, 1, 0);
  for (int64_t offset : sinks.offsets()) {
    anyattn_fuzz::store_value(sinks, offset, data.ConsumeIntegralInRange<int>(-8, 8) / 4.0);
  }
  if (data.ConsumeBool()) params.sinks = &sinks.t;
  const bool with_lse = data.ConsumeBool();

  anyattn::reference::VarlenOutputs ref;
  if (with_lse && lse_broadcast) must_fail = true;
  if (!must_fail) {
    ref = anyattn::reference::fwd_varlen(q.t, k.t, v.t, tcq.t, tck.t,
                                         meta.use_seqused ? &tused.t : nullptr, &params);
  }

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  const anyattn_fuzz::Snapshot out_before(&out), lse_before(&lse);
  const anyattn_status status = anyattn_fwd_varlen(
      &q.t, &k.t, &v.t, &out.t, with_lse ? &lse.t : nullptr, &tcq.t, &tck.t,
      meta.use_seqused ? &tused.t : nullptr, meta.max_seqlen_q, meta.max_seqlen_k, &params);
  if (status != ANYATTN_OK) {
    if (std::strlen(anyattn_last_error()) == 0) anyattn_fuzz::fail("empty message", status, 0, 0);
    if (!out_before.unchanged() || !lse_before.unchanged()) {
      anyattn_fuzz::fail("a rejected call wrote", status, 0, 0);
    }
    return 0;
  }
  if (must_fail) anyattn_fuzz::fail("invalid call accepted", meta.corruption, 0, 0);
  out_before.check_padding("out padding");
  lse_before.check_padding("lse padding");
  if (!with_lse && !lse_before.unchanged()) anyattn_fuzz::fail("lse written", 0, 0, 0);
  anyattn_fuzz::check_same_bytes_with_threads(threads % 3 + 1, {&out_before, &lse_before}, [&] {
    return anyattn_fwd_varlen(&q.t, &k.t, &v.t, &out.t, with_lse ? &lse.t : nullptr, &tcq.t, &tck.t,
                              meta.use_seqused ? &tused.t : nullptr, meta.max_seqlen_q,
                              meta.max_seqlen_k, &params);
  });

  // Rows inside a sequence match the reference; rows outside keep the sentinel.
  const std::vector<double> got = anyattn::reference::to_contiguous_f64(out.t);
  // The sentinel as a value: a contiguous tensor filled with the same bytes as out was.
  const FuzzTensor sentinel =
      anyattn_fuzz::make_tensor(dtype, 3, out_shape, StrideKind::kContiguous, 0, 1, 0xA5);
  const std::vector<double> sentinel_out = anyattn::reference::to_contiguous_f64(sentinel.t);
  const double tol = anyattn_fuzz::tolerance(dtype);
  const int64_t row = Hq * Dv;
  for (int64_t r = 0; r < total_q; ++r) {
    const std::vector<double> g(got.begin() + r * row, got.begin() + (r + 1) * row);
    if (ref.row_in_sequence[r]) {
      const std::vector<double> w(ref.out.begin() + r * row, ref.out.begin() + (r + 1) * row);
      anyattn_fuzz::check_close("out", g, w, tol, 2.0);
    } else {
      for (int64_t i = 0; i < row; ++i) {
        if (std::memcmp(&g[i], &sentinel_out[r * row + i], sizeof(double)) != 0) {
          anyattn_fuzz::fail("row outside every sequence written", r, g[i], sentinel_out[0]);
        }
      }
    }
  }
  if (with_lse) {
    const std::vector<double> got_lse = anyattn::reference::to_contiguous_f64(lse.t);
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t r = 0; r < total_q; ++r) {
        if (!ref.row_in_sequence[r]) continue;
        const size_t i = static_cast<size_t>(h * total_q + r);
        anyattn_fuzz::check_close("lse", {got_lse[i]}, {ref.lse[i]}, 1e-4, 1.0);
      }
    }
  }
  return 0;
}
