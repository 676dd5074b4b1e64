// libFuzzer harness for anyattn_fwd: random small shapes, dtypes, strides (padded, permuted, zero,
// negative), GQA ratios, masks, softcap, ALiBi, sinks, split counts, ISA paths and thread counts,
// hostile values (NaN, inf, subnormals) and hostile parameters (NaN/inf scale, negative softcap,
// huge windows), plus misuse the validation must reject (null data, aliased outputs, broadcast
// outputs, bad ranks). Checks: a rejected call writes nothing and explains itself; an accepted
// call writes only out/lse, writes the same bytes again with another thread count, and matches
// the f64 reference (fuzz_common.h).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "fuzz_common.h"

using anyattn_fuzz::FuzzTensor;
using anyattn_fuzz::StrideKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  FuzzedDataProvider data(bytes, size);
  const anyattn_fuzz::DenseShape shape(data);
  const int32_t dtype = shape.dtype;
  const int64_t B = shape.B, Sq = shape.Sq, Sk = shape.Sk, Hk = shape.Hk, Hq = shape.Hq;
  const int64_t D = shape.D, Dv = shape.Dv;
  const bool hostile_values = shape.hostile_values;

  const int64_t q_shape[4] = {B, Sq, Hq, D}, k_shape[4] = {B, Sk, Hk, D};
  const int64_t v_shape[4] = {B, Sk, Hk, Dv}, out_shape[4] = {B, Sq, Hq, Dv};
  const int64_t lse_shape[3] = {B, Hq, Sq};
  auto tensor = [&](int32_t dt, int ndim, const int64_t* dims, unsigned char fill) {
    return anyattn_fuzz::draw_tensor(data, dt, ndim, dims, fill);
  };
  FuzzTensor q = tensor(dtype, 4, q_shape, 0), k = tensor(dtype, 4, k_shape, 0);
  FuzzTensor v = tensor(dtype, 4, v_shape, 0);
  FuzzTensor out = tensor(dtype, 4, out_shape, 0xA5);
  FuzzTensor lse = tensor(ANYATTN_DTYPE_F32, 3, lse_shape, 0x5A);
  const bool valid_dtype = dtype != ANYATTN_DTYPE_I32;
  if (valid_dtype) {
    const int poisoned = hostile_values ? data.ConsumeIntegralInRange<int>(0, 2) : -1;
    anyattn_fuzz::fill_values(data, q, poisoned == 0);
    anyattn_fuzz::fill_values(data, k, poisoned == 1);
    anyattn_fuzz::fill_values(data, v, poisoned == 2);
  }

  // Parameters: moderate ones keep the numeric check meaningful; hostile ones must be rejected
  // or computed without a crash.
  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  const bool moderate_params = anyattn_fuzz::draw_score_params(data, &params);
  const int32_t splits[] = {0, 1, 2, 3, 64, -1};
  params.num_splits = splits[data.ConsumeIntegralInRange<int>(0, 5)];
  // auto, portable, avx2, avx512, avx512_amx, or an invalid value (9).
  const int isa_pick = data.ConsumeIntegralInRange<int>(0, 5);
  params.isa = isa_pick == 5 ? 9 : isa_pick;
  const int dropout_pick = data.ConsumeIntegralInRange<int>(0, 15);
  params.dropout_p = dropout_pick == 0 ? 1.0f : dropout_pick == 1 ? NAN : 0.0f;
  // default, accurate, fast, or an invalid value (7).
  const int precision_pick = data.ConsumeIntegralInRange<int>(0, 3);
  params.precision = precision_pick == 3 ? 7 : precision_pick;

  // ALiBi slopes (Hq) or (B, Hq) and sinks (Hq), over real buffers.
  const anyattn_fuzz::SideInputs side(data, B, Hq);
  side.attach(&params);

  // Misuse that validation must reject.
  const int misuse = data.ConsumeIntegralInRange<int>(0, 15);
  const anyattn_tensor* q_arg = &q.t;
  const anyattn_tensor* out_arg = &out.t;
  const anyattn_tensor* lse_arg = data.ConsumeBool() ? &lse.t : nullptr;
  anyattn_tensor bad = out.t;
  bool must_fail = false;
  switch (misuse) {
    case 1:  // null data in a non-empty tensor
      bad = q.t;
      bad.data = nullptr;
      q_arg = &bad;
      must_fail = B * Sq * Hq * D > 0;
      break;
    case 2:  // out is q (same bytes): out must not overlap an input
      if (D == Dv) {
        bad = q.t;
        out_arg = &bad;
        must_fail = B * Sq * Hq * D > 0;
      }
      break;
    case 3:  // lse placed inside out's bytes
      if (lse_arg != nullptr) {
        bad = lse.t;
        bad.data = out.t.data;
        lse_arg = &bad;
        const int64_t lse_n = B * Hq * Sq, out_n = B * Sq * Hq * Dv;
        // Only where the two overlap: an empty out (or lse) overlaps nothing, so the call is
        // legal, and lse's values would land in bytes that the check below takes for out's
        // padding.
        if (lse.base_element == 0 && out.base_element == 0 &&
            lse.storage_bytes <= out.storage_bytes && lse_n > 0 && out_n > 0) {
          must_fail = true;
        } else {
          lse_arg = &lse.t;
        }
      }
      break;
    case 4:  // rank 3 where 4 is required
      bad = q.t;
      bad.ndim = 3;
      q_arg = &bad;
      must_fail = true;
      break;
    case 5:  // null descriptor for a required tensor
      out_arg = nullptr;
      must_fail = true;
      break;
    case 6:  // negative dimension
      bad = q.t;
      bad.shape[1] = -1;
      q_arg = &bad;
      must_fail = true;
      break;
    default:
      break;
  }
  // Broadcast (stride 0) out or lse over a dimension of size > 1 overlaps itself.
  for (int d = 0; d < 3; ++d) {
    if (out_arg == &out.t && out.t.strides[d] == 0 && out.t.shape[d] > 1 && Dv > 0) {
      must_fail = must_fail || B * Sq * Hq > 0;
    }
    if (lse_arg == &lse.t && lse.t.strides[d] == 0 && lse.t.shape[d] > 1 && B * Hq * Sq > 0) {
      must_fail = true;
    }
  }
  const bool valid_params = std::isfinite(params.softmax_scale) && params.softcap >= 0.f &&
                            std::isfinite(params.softcap) && params.window_left >= -1 &&
                            params.window_right >= -1 && params.dropout_p == 0.0f &&
                            params.isa != 9 && params.num_splits >= 0 && params.precision != 7;
  // Head dims of 0 are legal (docs/semantics.md section 6); DenseShape draws Hk >= 1.
  if (!valid_dtype || Hq % Hk != 0 || D > ANYATTN_MAX_HEAD_DIM || Dv > ANYATTN_MAX_HEAD_DIM_V ||
      !valid_params) {
    must_fail = true;
  }

  // The reference, from the inputs as they are before the call.
  const bool numeric_check = !must_fail && moderate_params;
  anyattn::reference::DenseOutputs ref;
  if (numeric_check) ref = anyattn::reference::fwd_dense(q.t, k.t, v.t, &params);

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  const anyattn_fuzz::Snapshot out_before(&out), lse_before(&lse), q_before(&q);
  const anyattn_status status = anyattn_fwd(q_arg, &k.t, &v.t, out_arg, lse_arg, &params);
  if (status != ANYATTN_OK) {
    if (std::strlen(anyattn_last_error()) == 0) anyattn_fuzz::fail("empty message", status, 0, 0);
    if (!out_before.unchanged() || !lse_before.unchanged() || !q_before.unchanged()) {
      anyattn_fuzz::fail("a rejected call wrote", status, 0, 0);
    }
    return 0;
  }
  auto dump = [&] {
    anyattn_fuzz::print_tensor("q", q_arg);
    anyattn_fuzz::print_tensor("k", &k.t);
    anyattn_fuzz::print_tensor("v", &v.t);
    anyattn_fuzz::print_tensor("out", out_arg);
    anyattn_fuzz::print_tensor("lse", lse_arg);
    std::fprintf(stderr,
                 "  scale %g softcap %g window (%d, %d) dropout %g isa %d splits %d precision %d\n",
                 params.softmax_scale, params.softcap, params.window_left, params.window_right,
                 params.dropout_p, params.isa, params.num_splits, params.precision);
    std::fprintf(stderr, "  causal %d alibi %d sinks %d\n", params.causal,
                 params.alibi_slopes != nullptr, params.sinks != nullptr);
    if (std::getenv("ANYATTN_FUZZ_VERBOSE") != nullptr && numeric_check) {
      const FuzzTensor* shown[] = {&q, &k, &v, &side.sinks};
      for (const FuzzTensor* t : shown) {
        std::fprintf(stderr, "  values:");
        for (double x : anyattn::reference::to_contiguous_f64(t->t)) std::fprintf(stderr, " %g", x);
        std::fprintf(stderr, "\n");
      }
    }
  };
  if (must_fail) {
    dump();
    anyattn_fuzz::fail("invalid call accepted", misuse, 0, 0);
  }
  out_before.check_padding("out padding");
  lse_before.check_padding("lse padding");
  if (lse_arg == nullptr && !lse_before.unchanged()) anyattn_fuzz::fail("lse written", 0, 0, 0);
  anyattn_fuzz::check_same_bytes_with_threads(threads % 3 + 1, {&out_before, &lse_before}, [&] {
    return anyattn_fwd(q_arg, &k.t, &v.t, out_arg, lse_arg, &params);
  });
  if (!numeric_check) return 0;

  const double tol = anyattn_fuzz::tolerance(dtype);
  if (std::getenv("ANYATTN_FUZZ_VERBOSE") != nullptr) dump();
  anyattn_fuzz::check_close("out", anyattn::reference::to_contiguous_f64(out.t), ref.out, tol, 2.0);
  if (lse_arg != nullptr) {
    anyattn_fuzz::check_close("lse", anyattn::reference::to_contiguous_f64(lse.t), ref.lse, 1e-4,
                              1.0);
  }
  return 0;
}
