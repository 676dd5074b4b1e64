// libFuzzer harness for anyattn_merge_attention_states: (T, H, Dv) or (B, S, H, Dv) partial
// results in f32/f16/bf16 with random strides, LSEs with -inf / +inf / NaN entries, the in-place
// forms (out is out_a or out_b), and misuse the validation must reject (mismatched shapes, null
// data, an output overlapping an input it is not identical to). Accepted calls must match the f64
// reference (reference_cache.h), write nothing outside out / lse_out, and write the same bytes
// again when repeated (from the same inputs) with another thread count.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_common.h"
#include "reference/reference_cache.h"

using anyattn_fuzz::FuzzTensor;
using anyattn_fuzz::StrideKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  FuzzedDataProvider data(bytes, size);
  const int32_t dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
  const int32_t dtype = dtypes[data.ConsumeIntegralInRange<int>(0, 2)];
  const bool four_d = data.ConsumeBool();
  const int64_t B = data.ConsumeIntegralInRange<int64_t>(0, 3);
  const int64_t S = data.ConsumeIntegralInRange<int64_t>(0, 9);
  const int64_t H = data.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t Dv = data.ConsumeIntegralInRange<int64_t>(1, 40);
  const int ndim = four_d ? 4 : 3;
  const int64_t o4[4] = {B, S, H, Dv}, l4[3] = {B, H, S};
  const int64_t o3[3] = {S, H, Dv}, l3[2] = {H, S};
  const int64_t* o_shape = four_d ? o4 : o3;
  const int64_t* l_shape = four_d ? l4 : l3;
  auto tensor = [&](int32_t dt, int rank, const int64_t* shape, unsigned char fill) {
    const auto kind = static_cast<StrideKind>(data.ConsumeIntegralInRange<int>(0, 4));
    const int which = data.ConsumeIntegralInRange<int>(0, 3);
    return anyattn_fuzz::make_tensor(dt, rank, shape, kind, which, 2, fill);
  };
  FuzzTensor oa = tensor(dtype, ndim, o_shape, 0), ob = tensor(dtype, ndim, o_shape, 0);
  FuzzTensor la = tensor(ANYATTN_DTYPE_F32, ndim - 1, l_shape, 0);
  FuzzTensor lb = tensor(ANYATTN_DTYPE_F32, ndim - 1, l_shape, 0);
  FuzzTensor out = tensor(dtype, ndim, o_shape, 0xA5);
  FuzzTensor lse = tensor(ANYATTN_DTYPE_F32, ndim - 1, l_shape, 0x5A);
  const bool hostile = data.ConsumeBool();
  anyattn_fuzz::fill_values(data, oa, hostile);
  anyattn_fuzz::fill_values(data, ob, hostile);
  for (const FuzzTensor* l : {&la, &lb}) {
    for (int64_t offset : l->offsets()) {
      double value = data.ConsumeIntegralInRange<int>(-40, 40) / 4.0;
      switch (data.ConsumeIntegralInRange<int>(0, 12)) {
        case 0:
          value = -std::numeric_limits<double>::infinity();
          break;
        case 1:
          value = hostile ? std::numeric_limits<double>::infinity() : value;
          break;
        case 2:
          value = hostile ? std::numeric_limits<double>::quiet_NaN() : value;
          break;
        case 3:
          value = hostile ? 1e30 : value;
          break;
        default:
          break;
      }
      anyattn_fuzz::store_value(*l, offset, value);
    }
  }

  // In-place forms and misuse.
  const int form = data.ConsumeIntegralInRange<int>(0, 9);
  const anyattn_tensor* out_arg = &out.t;
  const anyattn_tensor* lse_arg = data.ConsumeBool() ? &lse.t : nullptr;
  const FuzzTensor* written_out = &out;
  const FuzzTensor* written_lse = lse_arg ? &lse : nullptr;
  anyattn_tensor bad = out.t;
  bool must_fail = false;
  const int64_t n = four_d ? B * S * H * Dv : S * H * Dv;
  switch (form) {
    case 1:
      out_arg = &oa.t;
      written_out = &oa;
      break;
    case 2:
      out_arg = &ob.t;
      written_out = &ob;
      if (lse_arg != nullptr) {
        lse_arg = &lb.t;
        written_lse = &lb;
      }
      break;
    case 3:  // null data
      bad = oa.t;
      bad.data = nullptr;
      must_fail = n > 0;
      break;
    case 4:  // shape mismatch between the partials
      bad = ob.t;
      bad.shape[ndim - 1] = Dv + 1;
      must_fail = true;
      break;
    case 5:  // lse_out of the wrong dtype
      if (lse_arg != nullptr) {
        bad = lse.t;
        bad.dtype = ANYATTN_DTYPE_F16;
        lse_arg = &bad;
        must_fail = true;
      }
      break;
    default:
      break;
  }
  const anyattn_tensor* a_arg = form == 3 ? &bad : &oa.t;
  const anyattn_tensor* b_arg = form == 4 ? &bad : &ob.t;
  for (int d = 0; d < ndim - 1; ++d) {
    if (out_arg == &out.t && out.t.strides[d] == 0 && out.t.shape[d] > 1 && n > 0) {
      must_fail = true;
    }
    if (lse_arg == &lse.t && lse.t.strides[d] == 0 && lse.t.shape[d] > 1 && n > 0) {
      must_fail = true;
    }
  }
  if (form == 1 || form == 2) {
    // In place: written tensors must not overlap themselves either.
    const FuzzTensor& o = form == 1 ? oa : ob;
    for (int d = 0; d < ndim - 1; ++d) {
      if (o.t.strides[d] == 0 && o.t.shape[d] > 1 && n > 0) must_fail = true;
      if (lse_arg == &lb.t && lb.t.strides[d] == 0 && lb.t.shape[d] > 1 && n > 0) {
        must_fail = true;
      }
    }
  }

  anyattn::reference::MergeOutputs ref;
  if (!must_fail) ref = anyattn::reference::merge_states(oa.t, la.t, ob.t, lb.t);

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  const anyattn_fuzz::Snapshot out_before(written_out);
  const anyattn_fuzz::Snapshot lse_before(written_lse);
  const anyattn_fuzz::Snapshot lse_spare(&lse);
  const anyattn_status status =
      anyattn_merge_attention_states(a_arg, &la.t, b_arg, &lb.t, out_arg, lse_arg);
  if (status != ANYATTN_OK) {
    if (std::strlen(anyattn_last_error()) == 0) anyattn_fuzz::fail("empty message", status, 0, 0);
    if (!out_before.unchanged() || !lse_before.unchanged()) {
      anyattn_fuzz::fail("a rejected call wrote", status, 0, 0);
    }
    return 0;
  }
  if (must_fail) {
    anyattn_fuzz::print_tensor("out_a", a_arg);
    anyattn_fuzz::print_tensor("lse_a", &la.t);
    anyattn_fuzz::print_tensor("out_b", b_arg);
    anyattn_fuzz::print_tensor("lse_b", &lb.t);
    anyattn_fuzz::print_tensor("out", out_arg);
    anyattn_fuzz::print_tensor("lse_out", lse_arg);
    anyattn_fuzz::fail("invalid call accepted", form, 0, 0);
  }
  out_before.check_padding("out padding");
  lse_before.check_padding("lse padding");
  if (lse_arg == nullptr && !lse_spare.unchanged()) anyattn_fuzz::fail("lse written", 0, 0, 0);
  // In-place forms: the restored snapshots put the overwritten input back first.
  anyattn_fuzz::check_same_bytes_with_threads(threads % 3 + 1, {&out_before, &lse_before}, [&] {
    return anyattn_merge_attention_states(a_arg, &la.t, b_arg, &lb.t, out_arg, lse_arg);
  });
  anyattn_fuzz::check_close("out", anyattn::reference::to_contiguous_f64(written_out->t), ref.out,
                            anyattn_fuzz::tolerance(dtype), 2.0);
  if (written_lse != nullptr) {
    anyattn_fuzz::check_close("lse", anyattn::reference::to_contiguous_f64(written_lse->t), ref.lse,
                              1e-5, 1.0);
  }
  return 0;
}
