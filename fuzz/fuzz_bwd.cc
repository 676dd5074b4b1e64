// libFuzzer harness for anyattn_bwd: random small shapes, dtypes, strides (padded, permuted, zero,
// negative) for every one of the nine tensors, GQA ratios, masks, softcap, ALiBi, sinks (with
// dsinks), dropout, ISA paths and thread counts; hostile values (NaN and subnormals in q, k, v or
// dout; NaN or infinite LSE entries) and hostile parameters, with and without bwd_own_forward,
// in each precision; misuse the validation must reject (null data, a gradient overlapping an
// input or another gradient, a missing LSE, dsinks without sinks or sinks without dsinks, bad
// ranks, negative sizes).
//
// out and lse are the f64 reference's forward (with dropout), rounded into their tensors, so the
// backward is checked on its own, not through anyattn_fwd; the expected gradients are the
// reference's for that rounded out. Checks: a rejected call writes nothing and explains itself;
// an accepted call writes only the logical elements of dq, dk, dv (and dsinks), writes the same
// bytes again with another thread count and, with moderate parameters, matches the reference's
// gradients: every NaN the reference has, and every finite value within the bound of
// anyattn_fuzz::check_gradient (relative to the sum of the terms' absolute values); with NaN
// inputs, NaN may also reach the gradients of masked pairs (0 * NaN), as documented.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "fuzz_common.h"
#include "reference/reference_bwd.h"

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
  const int64_t v_shape[4] = {B, Sk, Hk, Dv}, o_shape[4] = {B, Sq, Hq, Dv};
  const int64_t lse_shape[3] = {B, Hq, Sq}, dsinks_shape[1] = {Hq};
  auto tensor = [&](int32_t dt, int ndim, const int64_t* dims, unsigned char fill) {
    return anyattn_fuzz::draw_tensor(data, dt, ndim, dims, fill);
  };
  FuzzTensor q = tensor(dtype, 4, q_shape, 0), k = tensor(dtype, 4, k_shape, 0);
  FuzzTensor v = tensor(dtype, 4, v_shape, 0), dout = tensor(dtype, 4, o_shape, 0);
  FuzzTensor out = tensor(dtype, 4, o_shape, 0), lse = tensor(ANYATTN_DTYPE_F32, 3, lse_shape, 0);
  FuzzTensor dq = tensor(dtype, 4, q_shape, 0xA5), dk = tensor(dtype, 4, k_shape, 0xA5);
  FuzzTensor dv = tensor(dtype, 4, v_shape, 0xA5);
  FuzzTensor dsinks = tensor(ANYATTN_DTYPE_F32, 1, dsinks_shape, 0x5A);
  const bool valid_dtype = dtype != ANYATTN_DTYPE_I32;
  const int poisoned = hostile_values ? data.ConsumeIntegralInRange<int>(0, 3) : -1;
  if (valid_dtype) {
    anyattn_fuzz::fill_values(data, q, poisoned == 0);
    anyattn_fuzz::fill_values(data, k, poisoned == 1);
    anyattn_fuzz::fill_values(data, v, poisoned == 2);
    anyattn_fuzz::fill_values(data, dout, poisoned == 3);
  }

  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  const bool moderate_params = anyattn_fuzz::draw_score_params(data, &params);
  // auto, portable, avx2, avx512, avx512_amx, or an invalid value (9).
  const int isa_pick = data.ConsumeIntegralInRange<int>(0, 5);
  params.isa = isa_pick == 5 ? 9 : isa_pick;
  const float dropouts[] = {0.f, 0.f, 0.f, 0.25f, 0.75f, 1.f, NAN, -0.5f};
  params.dropout_p = dropouts[data.ConsumeIntegralInRange<int>(0, 7)];
  params.dropout_seed = data.ConsumeIntegral<uint64_t>();
  params.dropout_offset = data.ConsumeIntegral<uint64_t>();

  // ALiBi slopes (Hq) or (B, Hq) and sinks (Hq), over real buffers.
  const anyattn_fuzz::SideInputs side(data, B, Hq);
  side.attach(&params);

  // Misuse that validation must reject.
  const int misuse = data.ConsumeIntegralInRange<int>(0, 23);
  const anyattn_tensor* q_arg = &q.t;
  const anyattn_tensor* lse_arg = &lse.t;
  const anyattn_tensor* dq_arg = &dq.t;
  const anyattn_tensor* dv_arg = &dv.t;
  const anyattn_tensor* dsinks_arg = params.sinks != nullptr ? &dsinks.t : nullptr;
  anyattn_tensor bad{};
  bool must_fail = false;
  const int64_t q_n = B * Sq * Hq * D, k_n = B * Sk * Hk * D;
  switch (misuse) {
    case 1:  // null data in a non-empty input
      bad = q.t;
      bad.data = nullptr;
      q_arg = &bad;
      must_fail = q_n > 0;
      break;
    case 2:  // dq is q: a gradient must not overlap an input
      bad = q.t;
      dq_arg = &bad;
      must_fail = q_n > 0;
      break;
    case 3:  // dv is dk: gradients must not overlap each other
      if (D == Dv) {
        bad = dk.t;
        dv_arg = &bad;
        must_fail = k_n > 0;
      }
      break;
    case 4:  // no LSE
      lse_arg = nullptr;
      must_fail = true;
      break;
    case 5:  // dsinks without sinks, or sinks without dsinks
      dsinks_arg = dsinks_arg == nullptr ? &dsinks.t : nullptr;
      must_fail = true;
      break;
    case 6:  // rank 3 where 4 is required
      bad = q.t;
      bad.ndim = 3;
      q_arg = &bad;
      must_fail = true;
      break;
    case 7:  // negative dimension
      bad = q.t;
      bad.shape[1] = -1;
      q_arg = &bad;
      must_fail = true;
      break;
    case 8:  // lse of the wrong dtype
      bad = lse.t;
      bad.dtype = dtype == ANYATTN_DTYPE_F32 ? ANYATTN_DTYPE_F16 : ANYATTN_DTYPE_I32;
      lse_arg = &bad;
      must_fail = true;
      break;
    default:
      break;
  }
  // A gradient broadcast (stride 0) over a dimension of size > 1 overlaps itself.
  for (const FuzzTensor* g : {&dq, &dk, &dv}) {
    int64_t n = 1;
    for (int d = 0; d < 4; ++d) n *= g->t.shape[d];
    for (int d = 0; d < 3; ++d) {
      if (g->t.strides[d] == 0 && g->t.shape[d] > 1 && n > 0) must_fail = true;
    }
  }
  const bool valid_params = std::isfinite(params.softmax_scale) && params.softcap >= 0.f &&
                            std::isfinite(params.softcap) && params.window_left >= -1 &&
                            params.window_right >= -1 && params.dropout_p >= 0.f &&
                            params.dropout_p < 1.f && params.isa != 9;
  const bool valid_shapes = valid_dtype && Hq % Hk == 0 && D <= ANYATTN_MAX_HEAD_DIM &&
                            Dv <= ANYATTN_MAX_HEAD_DIM_V;  // head dims of 0 are legal
  if (!valid_shapes || !valid_params) must_fail = true;

  // out and lse: the reference's forward, so the backward is checked on its own. Any other
  // values (hostile LSE entries here) must still be taken without a crash.
  const bool computable = valid_shapes && valid_params;
  anyattn::reference::DenseGradients ref;
  if (computable) {
    const anyattn::reference::DenseGradients forward =
        anyattn::reference::bwd_dense(q.t, k.t, v.t, dout.t, &params);
    anyattn_fuzz::store_all(out, forward.out);
    anyattn_fuzz::store_all(lse, forward.lse);
    // The gradients of a backward handed this out, rounded to the dtype (D_i = <dout_i, out_i>).
    ref = anyattn::reference::bwd_dense(q.t, k.t, v.t, dout.t, &params, &out.t);
  }
  const int lse_poison = data.ConsumeIntegralInRange<int>(0, 7);
  const std::vector<int64_t> lse_offsets = lse.offsets();
  if (lse_poison < 3 && !lse_offsets.empty()) {
    const float poison[] = {NAN, INFINITY, -INFINITY};
    const size_t at = data.ConsumeIntegralInRange<size_t>(0, lse_offsets.size() - 1);
    anyattn_fuzz::store_value(lse, lse_offsets[at], poison[lse_poison]);
  }
  // A broadcast (stride 0) lse holds one value for several rows: not the forward's. (A broadcast
  // out is fine: the expected gradients are computed from the out as stored.)
  const bool broadcast_lse = lse.aliases_elements();
  const bool numeric_check =
      !must_fail && computable && moderate_params && lse_poison >= 3 && !broadcast_lse;

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  // Drawn last, so that earlier corpus entries keep their meaning. out is the reference's forward
  // rounded to the dtype, and lse the reference's rounded to f32: the forward's own up to those
  // roundings, which is what the flag promises, unless two of out's elements share an address
  // (then out holds one row's values for another). The expected gradients, those for the out
  // handed over, differ from the flag's by about those roundings, inside check_gradient's bound.
  params.bwd_own_forward = data.ConsumeBool() && !out.aliases_elements() ? 1 : 0;
  // Default, accurate or fast: a fast bf16 call rounds P Z and dS to bf16 for dV, dK and dQ, at
  // most 2^-9 of each term, inside check_gradient's bf16 bound.
  params.precision = data.ConsumeIntegralInRange<int>(0, 2);
  const anyattn_fuzz::Snapshot dq_before(&dq), dk_before(&dk), dv_before(&dv),
      dsinks_before(&dsinks), q_before(&q), out_before(&out), lse_before(&lse);
  const anyattn_status status = anyattn_bwd(&dout.t, q_arg, &k.t, &v.t, &out.t, lse_arg, dq_arg,
                                            &dk.t, dv_arg, dsinks_arg, &params);
  if (!anyattn_fuzz::check_status(status, {&dq_before, &dk_before, &dv_before, &dsinks_before},
                                  {&q_before, &out_before, &lse_before})) {
    return 0;
  }
  auto dump = [&] {
    anyattn_fuzz::print_tensor("dout", &dout.t);
    anyattn_fuzz::print_tensor("q", q_arg);
    anyattn_fuzz::print_tensor("k", &k.t);
    anyattn_fuzz::print_tensor("v", &v.t);
    anyattn_fuzz::print_tensor("lse", lse_arg);
    anyattn_fuzz::print_tensor("dq", dq_arg);
    anyattn_fuzz::print_tensor("dk", &dk.t);
    anyattn_fuzz::print_tensor("dv", dv_arg);
    anyattn_fuzz::print_tensor("dsinks", dsinks_arg);
    std::fprintf(stderr, "  scale %g softcap %g window (%d, %d) dropout %g isa %d causal %d",
                 params.softmax_scale, params.softcap, params.window_left, params.window_right,
                 params.dropout_p, params.isa, params.causal);
    std::fprintf(stderr, " own_forward %d precision %d\n", params.bwd_own_forward,
                 params.precision);
    std::fprintf(stderr, "  alibi %d sinks %d poisoned %d\n", params.alibi_slopes != nullptr,
                 params.sinks != nullptr, poisoned);
  };
  if (must_fail) {
    dump();
    anyattn_fuzz::fail("invalid call accepted", misuse, 0, 0);
  }
  dq_before.check_padding("dq padding");
  dk_before.check_padding("dk padding");
  dv_before.check_padding("dv padding");
  dsinks_before.check_padding("dsinks padding");
  if (dsinks_arg == nullptr && !dsinks_before.unchanged()) {
    anyattn_fuzz::fail("dsinks written", 0, 0, 0);
  }
  anyattn_fuzz::check_same_bytes_with_threads(
      threads % 3 + 1, {&dq_before, &dk_before, &dv_before, &dsinks_before}, [&] {
        return anyattn_bwd(&dout.t, q_arg, &k.t, &v.t, &out.t, lse_arg, dq_arg, &dk.t, dv_arg,
                           dsinks_arg, &params);
      });
  if (!numeric_check) return 0;

  if (std::getenv("ANYATTN_FUZZ_VERBOSE") != nullptr) dump();
  const bool nan_inputs = poisoned >= 0;
  using anyattn::reference::to_contiguous_f64;
  using anyattn_fuzz::check_gradient;
  check_gradient("dq", to_contiguous_f64(dq.t), ref.dq, ref.dq_terms, dtype, nan_inputs);
  check_gradient("dk", to_contiguous_f64(dk.t), ref.dk, ref.dk_terms, dtype, nan_inputs);
  check_gradient("dv", to_contiguous_f64(dv.t), ref.dv, ref.dv_terms, dtype, nan_inputs);
  if (dsinks_arg != nullptr) {
    // dsinks is f32, and so is its bound, but with the flag bf16 and f16 calls sum it from P dP
    // instead of <dout, out> (docs/backward.md): it then differs from the expected one, that of
    // the rounded out, by out's rounding, as the other gradients do.
    check_gradient("dsinks", to_contiguous_f64(dsinks.t), ref.dsinks, ref.dsinks_terms,
                   params.bwd_own_forward != 0 ? dtype : ANYATTN_DTYPE_F32, nan_inputs);
  }
  return 0;
}
