// libFuzzer harness for anyattn_bwd_varlen: packed dout/q/k/v/out with random strides and dtypes,
// random cu_seqlens (leading rows outside every sequence, empty sequences), optional seqused_k,
// masks, softcap, ALiBi (shared or per sequence), sinks with dsinks, dropout, bwd_own_forward, ISA
// paths, precision and thread counts, NaN and subnormal values, corrupted sequence metadata
// (fuzz_varlen_meta.h) and misuse the validation must reject (a missing LSE, dq aliasing q, dsinks
// without sinks).
//
// out and lse are the f64 reference's forward, rounded into their tensors; the expected gradients
// are the reference's for that out (reference_bwd.h, bwd_varlen). Checks: a rejected call writes
// nothing and explains itself; an accepted call writes no padding byte and no row outside every
// sequence, writes the same bytes again with another thread count, and its gradients of the rows
// inside match the reference as in fuzz_bwd.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include "fuzz_common.h"
#include "fuzz_varlen_meta.h"
#include "reference/reference_bwd.h"

using anyattn_fuzz::FuzzTensor;
using anyattn_fuzz::StrideKind;

namespace {

// Traps if an element of a row flagged 0 in `in_sequence` (rows = dim 0) changed since `before`.
void check_rows_outside(const char* what, const anyattn_fuzz::Snapshot& before,
                        const std::vector<char>& in_sequence) {
  const FuzzTensor& f = *before.f;
  const int64_t size = anyattn_dtype_size(f.t.dtype);
  const int64_t row_elements = f.t.shape[1] * f.t.shape[2];
  const std::vector<int64_t> offsets = f.offsets();
  for (size_t e = 0; e < offsets.size(); ++e) {
    const int64_t row = static_cast<int64_t>(e) / row_elements;
    if (in_sequence[row]) continue;
    const int64_t byte = (f.base_element + offsets[e]) * size;
    if (std::memcmp(&before.bytes[byte], f.storage.get() + byte, size) != 0) {
      anyattn_fuzz::fail(what, row, 0, 0);
    }
  }
}

// The values of the rows flagged 1, from a (rows, H, X) contiguous array.
std::vector<double> rows_inside(const std::vector<double>& all,
                                const std::vector<char>& in_sequence, int64_t row_elements) {
  std::vector<double> result;
  for (size_t r = 0; r < in_sequence.size(); ++r) {
    if (!in_sequence[r]) continue;
    result.insert(result.end(), all.begin() + r * row_elements,
                  all.begin() + (r + 1) * row_elements);
  }
  return result;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  FuzzedDataProvider data(bytes, size);
  const anyattn_fuzz::VarlenShape shape(data);
  const int32_t dtype = shape.dtype;
  const int64_t B = shape.B, Hk = shape.Hk, Hq = shape.Hq, D = shape.D, Dv = shape.Dv;

  const anyattn_fuzz::VarlenMeta meta = anyattn_fuzz::make_varlen_meta(data, B);
  const int64_t total_q = meta.total_q, total_k = meta.total_k;
  bool must_fail = meta.must_fail;

  const int64_t q_shape[3] = {total_q, Hq, D}, k_shape[3] = {total_k, Hk, D};
  const int64_t v_shape[3] = {total_k, Hk, Dv}, o_shape[3] = {total_q, Hq, Dv};
  const int64_t lse_shape[2] = {Hq, total_q}, dsinks_shape[1] = {Hq};
  auto tensor = [&](int32_t dt, int rank, const int64_t* dims, unsigned char fill) {
    return anyattn_fuzz::draw_tensor(data, dt, rank, dims, fill, 2);
  };
  FuzzTensor q = tensor(dtype, 3, q_shape, 0), k = tensor(dtype, 3, k_shape, 0);
  FuzzTensor v = tensor(dtype, 3, v_shape, 0), dout = tensor(dtype, 3, o_shape, 0);
  FuzzTensor out = tensor(dtype, 3, o_shape, 0), lse = tensor(ANYATTN_DTYPE_F32, 2, lse_shape, 0);
  FuzzTensor dq = tensor(dtype, 3, q_shape, 0xA5), dk = tensor(dtype, 3, k_shape, 0xA5);
  FuzzTensor dv = tensor(dtype, 3, v_shape, 0xA5);
  FuzzTensor dsinks = tensor(ANYATTN_DTYPE_F32, 1, dsinks_shape, 0x5A);
  const bool hostile = data.ConsumeBool();
  const int poisoned = hostile ? data.ConsumeIntegralInRange<int>(0, 3) : -1;
  anyattn_fuzz::fill_values(data, q, poisoned == 0);
  anyattn_fuzz::fill_values(data, k, poisoned == 1);
  anyattn_fuzz::fill_values(data, v, poisoned == 2);
  anyattn_fuzz::fill_values(data, dout, poisoned == 3);

  // A gradient broadcast (stride 0) overlaps itself where two written elements share an address:
  // over the heads once any row is written, over the rows once two are.
  const int64_t q_rows = meta.rows_in_sequences();
  const int64_t k_rows = B > 0 ? meta.cu_k[B] - meta.cu_k[0] : 0;
  for (const auto& [g, rows, heads] :
       {std::tuple{&dq, q_rows, Hq}, std::tuple{&dk, k_rows, Hk}, std::tuple{&dv, k_rows, Hk}}) {
    if (g->t.strides[0] == 0 && rows > 1) must_fail = true;
    if (g->t.strides[1] == 0 && heads > 1 && rows > 0) must_fail = true;
  }

  const bool float_index = meta.corruption == 8;
  FuzzTensor tcq = anyattn_fuzz::make_index_tensor(meta.cu_q);
  FuzzTensor tck = anyattn_fuzz::make_index_tensor(meta.cu_k);
  FuzzTensor tused = anyattn_fuzz::make_index_tensor(meta.used);
  if (float_index) {
    tcq.t.dtype = ANYATTN_DTYPE_F32;
    must_fail = true;
  }
  const anyattn_tensor* used_arg = meta.use_seqused ? &tused.t : nullptr;

  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.causal = data.ConsumeBool();
  params.window_left = data.ConsumeIntegralInRange<int32_t>(-1, 4);
  params.window_right = data.ConsumeIntegralInRange<int32_t>(-1, 4);
  params.softcap = data.ConsumeBool() ? 5.0f : 0.0f;
  params.isa = data.ConsumeIntegralInRange<int>(0, ANYATTN_ISA_AVX512_AMX);
  params.dropout_p = data.ConsumeIntegralInRange<int>(0, 3) == 0 ? 0.3f : 0.0f;
  params.dropout_seed = data.ConsumeIntegral<uint64_t>();
  const int alibi_pick = data.ConsumeIntegralInRange<int>(0, 2);
  const int64_t alibi_shape[2] = {alibi_pick == 2 ? B : 1, Hq};
  FuzzTensor alibi = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, alibi_pick == 2 ? 2 : 1,
                                               alibi_pick == 2 ? alibi_shape : alibi_shape + 1,
                                               StrideKind::kContiguous, 0, 1, 0);
  for (int64_t offset : alibi.offsets()) {
    anyattn_fuzz::store_value(alibi, offset, data.ConsumeIntegralInRange<int>(0, 8) / 8.0);
  }
  if (alibi_pick > 0) params.alibi_slopes = &alibi.t;
  FuzzTensor sinks = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 1, dsinks_shape,
                                               StrideKind::kContiguous, 0, 1, 0);
  for (int64_t offset : sinks.offsets()) {
    anyattn_fuzz::store_value(sinks, offset, data.ConsumeIntegralInRange<int>(-8, 8) / 4.0);
  }
  if (data.ConsumeBool()) params.sinks = &sinks.t;

  const anyattn_tensor* lse_arg = &lse.t;
  const anyattn_tensor* dq_arg = &dq.t;
  const anyattn_tensor* dsinks_arg = params.sinks != nullptr ? &dsinks.t : nullptr;
  const int misuse = data.ConsumeIntegralInRange<int>(0, 15);
  switch (misuse) {
    case 1:
      lse_arg = nullptr;
      must_fail = true;
      break;
    case 2:  // dq is q
      dq_arg = &q.t;
      must_fail = must_fail || total_q * Hq * D > 0;
      break;
    case 3:
      dsinks_arg = dsinks_arg == nullptr ? &dsinks.t : nullptr;
      must_fail = true;
      break;
    default:
      break;
  }

  // out and lse from the reference's forward. A broadcast lse holds one value for several
  // entries, not the forward's: such calls are only checked for memory safety.
  anyattn::reference::VarlenGradients ref;
  bool numeric_check = false;
  if (!must_fail) {
    const anyattn::reference::VarlenGradients forward =
        anyattn::reference::bwd_varlen(q.t, k.t, v.t, dout.t, tcq.t, tck.t, used_arg, &params);
    anyattn_fuzz::store_all(out, forward.out);
    anyattn_fuzz::store_all(lse, forward.lse);
    ref = anyattn::reference::bwd_varlen(q.t, k.t, v.t, dout.t, tcq.t, tck.t, used_arg, &params,
                                         &out.t);
    numeric_check = (lse.t.strides[0] != 0 || Hq == 1) && (lse.t.strides[1] != 0 || total_q < 2);
  }

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  // Drawn last, so that earlier corpus entries keep their meaning. out is the reference's forward
  // rounded to the dtype, and lse the reference's rounded to f32: the forward's own up to those
  // roundings, which is what the flag promises, unless two of out's elements share an address
  // (then out holds one row's values for another). The expected gradients, those for the out
  // handed over, differ from the flag's by about those roundings, inside check_gradient's bound.
  params.bwd_own_forward = data.ConsumeBool() && !out.aliases_elements() ? 1 : 0;
  // Default, accurate or fast (P Z and dS rounded to bf16 for dV, dK and dQ of bf16 calls).
  params.precision = data.ConsumeIntegralInRange<int>(0, 2);
  const anyattn_fuzz::Snapshot dq_before(&dq), dk_before(&dk), dv_before(&dv),
      dsinks_before(&dsinks), q_before(&q), out_before(&out), lse_before(&lse);
  const anyattn_status status = anyattn_bwd_varlen(
      &dout.t, &q.t, &k.t, &v.t, &out.t, lse_arg, dq_arg, &dk.t, &dv.t, dsinks_arg, &tcq.t, &tck.t,
      used_arg, meta.max_seqlen_q, meta.max_seqlen_k, &params);
  if (!anyattn_fuzz::check_status(status, {&dq_before, &dk_before, &dv_before, &dsinks_before},
                                  {&q_before, &out_before, &lse_before})) {
    return 0;
  }
  if (must_fail) anyattn_fuzz::fail("invalid call accepted", meta.corruption * 100 + misuse, 0, 0);
  dq_before.check_padding("dq padding");
  dk_before.check_padding("dk padding");
  dv_before.check_padding("dv padding");
  dsinks_before.check_padding("dsinks padding");
  if (dsinks_arg == nullptr && !dsinks_before.unchanged()) {
    anyattn_fuzz::fail("dsinks written", 0, 0, 0);
  }
  // Rows outside every sequence keep their bytes (unless a broadcast over the rows aliases them
  // with the one row written).
  if (dq.t.strides[0] != 0) check_rows_outside("dq row outside", dq_before, ref.q_row_in_sequence);
  if (dk.t.strides[0] != 0) check_rows_outside("dk row outside", dk_before, ref.k_row_in_sequence);
  if (dv.t.strides[0] != 0) check_rows_outside("dv row outside", dv_before, ref.k_row_in_sequence);
  anyattn_fuzz::check_same_bytes_with_threads(
      threads % 3 + 1, {&dq_before, &dk_before, &dv_before, &dsinks_before}, [&] {
        return anyattn_bwd_varlen(&dout.t, &q.t, &k.t, &v.t, &out.t, lse_arg, dq_arg, &dk.t, &dv.t,
                                  dsinks_arg, &tcq.t, &tck.t, used_arg, meta.max_seqlen_q,
                                  meta.max_seqlen_k, &params);
      });
  if (!numeric_check) return 0;

  if (std::getenv("ANYATTN_FUZZ_VERBOSE") != nullptr) {
    for (const FuzzTensor* t : {&dout, &q, &k, &v, &out, &lse, &dq, &dk, &dv}) {
      anyattn_fuzz::print_tensor("tensor", &t->t);
    }
    std::fprintf(stderr, "  cu_q");
    for (int32_t x : meta.cu_q) std::fprintf(stderr, " %d", x);
    std::fprintf(stderr, "  cu_k");
    for (int32_t x : meta.cu_k) std::fprintf(stderr, " %d", x);
    std::fprintf(stderr, "  seqused %d:", meta.use_seqused);
    for (int32_t x : meta.used) std::fprintf(stderr, " %d", x);
    std::fprintf(stderr,
                 "\n  causal %d window (%d, %d) softcap %g dropout %g isa %d alibi %d sinks %d"
                 " precision %d\n",
                 params.causal, params.window_left, params.window_right, params.softcap,
                 params.dropout_p, params.isa, alibi_pick, params.sinks != nullptr,
                 params.precision);
  }
  using anyattn::reference::to_contiguous_f64;
  using anyattn_fuzz::check_gradient;
  const bool nan_inputs = poisoned >= 0;
  const std::vector<char>& q_rows_in = ref.q_row_in_sequence;
  const std::vector<char>& k_rows_in = ref.k_row_in_sequence;
  check_gradient("dq", rows_inside(to_contiguous_f64(dq.t), q_rows_in, Hq * D),
                 rows_inside(ref.dq, q_rows_in, Hq * D),
                 rows_inside(ref.dq_terms, q_rows_in, Hq * D), dtype, nan_inputs);
  check_gradient("dk", rows_inside(to_contiguous_f64(dk.t), k_rows_in, Hk * D),
                 rows_inside(ref.dk, k_rows_in, Hk * D),
                 rows_inside(ref.dk_terms, k_rows_in, Hk * D), dtype, nan_inputs);
  check_gradient("dv", rows_inside(to_contiguous_f64(dv.t), k_rows_in, Hk * Dv),
                 rows_inside(ref.dv, k_rows_in, Hk * Dv),
                 rows_inside(ref.dv_terms, k_rows_in, Hk * Dv), dtype, nan_inputs);
  if (dsinks_arg != nullptr) {
    // dsinks is f32, and so is its bound, but with the flag bf16 and f16 calls sum it from P dP
    // instead of <dout, out> (docs/backward.md): it then differs from the expected one, that of
    // the rounded out, by out's rounding, as the other gradients do.
    check_gradient("dsinks", to_contiguous_f64(dsinks.t), ref.dsinks, ref.dsinks_terms,
                   params.bwd_own_forward != 0 ? dtype : ANYATTN_DTYPE_F32, nan_inputs);
  }
  return 0;
}
