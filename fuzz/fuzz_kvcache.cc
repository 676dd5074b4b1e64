// libFuzzer harness for anyattn_fwd_kvcache: contiguous caches (optionally via cache_batch_idx)
// and paged caches (any page size, random block tables), cache_seqlens as a tensor or a scalar,
// leftpad, in-place appends of new keys/values, rotary (interleaved or not), masks and sinks, and
// corrupted metadata the validation must reject (negative or over-capacity lengths, block table
// entries out of range, leftpad past the length, a rotary table too short). A rejected call must
// leave the cache and the outputs untouched; an accepted one must match the f64 reference for
// out, lse and the appended cache rows, and write the same bytes again (cache rows included) when
// repeated from the same cache with another thread count. Calls that only read the cache are
// repeated through anyattn_fwd_kvcache_varlen with the queries packed, against the same reference.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_common.h"
#include "fuzz_kvcache_common.h"
#include "reference/reference_cache.h"

using anyattn_fuzz::check_packed_queries;
using anyattn_fuzz::FuzzTensor;
using anyattn_fuzz::int_tensor;
using anyattn_fuzz::StrideKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  FuzzedDataProvider data(bytes, size);
  const int32_t dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
  const int32_t dtype = dtypes[data.ConsumeIntegralInRange<int>(0, 2)];
  const int64_t B = data.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t Sq = data.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t Hk = data.ConsumeIntegralInRange<int64_t>(1, 2);
  const int64_t Hq = Hk * data.ConsumeIntegralInRange<int64_t>(1, 2);
  const int64_t D = 2 * data.ConsumeIntegralInRange<int64_t>(1, 8);
  const int64_t Dv = data.ConsumeIntegralInRange<int64_t>(1, 12);
  const bool paged = data.ConsumeBool();
  const int64_t page = data.ConsumeIntegralInRange<int64_t>(1, 5);
  const int64_t max_blocks = data.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t num_blocks = data.ConsumeIntegralInRange<int64_t>(1, 3 * B);
  const int64_t cache_b = B + data.ConsumeIntegralInRange<int64_t>(0, 1);
  const int64_t S_cache = data.ConsumeIntegralInRange<int64_t>(1, 10);
  const int64_t capacity = paged ? page * max_blocks : S_cache;
  const int64_t S_new = data.ConsumeBool() ? data.ConsumeIntegralInRange<int64_t>(1, 3) : 0;

  std::vector<int32_t> seqlens(B), leftpad(B), batch_idx(B), table(B * max_blocks);
  for (int64_t b = 0; b < B; ++b) {
    seqlens[b] = data.ConsumeIntegralInRange<int32_t>(
        0, static_cast<int32_t>(std::max<int64_t>(capacity - S_new, 0)));
    leftpad[b] = data.ConsumeIntegralInRange<int32_t>(0, seqlens[b]);
    batch_idx[b] = data.ConsumeIntegralInRange<int32_t>(0, static_cast<int32_t>(cache_b - 1));
  }
  for (int32_t& entry : table) {
    entry = data.ConsumeIntegralInRange<int32_t>(0, static_cast<int32_t>(num_blocks - 1));
  }
  bool must_fail = capacity < S_new;
  const int corruption = data.ConsumeIntegralInRange<int>(0, 12);
  const int64_t victim = data.ConsumeIntegralInRange<int64_t>(0, B - 1);
  switch (corruption) {
    case 1:
      seqlens[victim] = -1;
      must_fail = true;
      break;
    case 2:
      seqlens[victim] = static_cast<int32_t>(capacity - S_new + 1);
      must_fail = true;
      break;
    case 3:  // only a page the sequence needs is checked
      if (paged && seqlens[victim] + S_new > 0 && leftpad[victim] < page) {
        table[victim * max_blocks] = static_cast<int32_t>(num_blocks);
        must_fail = true;
      }
      break;
    case 4:
      batch_idx[victim] = static_cast<int32_t>(cache_b);
      break;
    default:
      break;
  }
  const bool use_leftpad = data.ConsumeBool();
  if (use_leftpad && corruption == 5) {
    leftpad[victim] = seqlens[victim] + static_cast<int32_t>(S_new) + 1;
    must_fail = true;
  }
  const bool use_batch_idx = !paged && data.ConsumeBool();
  if (corruption == 4 && use_batch_idx) must_fail = true;

  const int64_t cache_rows = paged ? num_blocks : cache_b;
  const int64_t cache_len = paged ? page : S_cache;
  const int64_t kc_shape[4] = {cache_rows, cache_len, Hk, D};
  const int64_t vc_shape[4] = {cache_rows, cache_len, Hk, Dv};
  const int64_t q_shape[4] = {B, Sq, Hq, D}, out_shape[4] = {B, Sq, Hq, Dv};
  const int64_t kn_shape[4] = {B, S_new, Hk, D}, vn_shape[4] = {B, S_new, Hk, Dv};
  const int64_t lse_shape[3] = {B, Hq, Sq};
  auto tensor = [&](int32_t dt, int rank, const int64_t* shape, unsigned char fill, bool input) {
    return anyattn_fuzz::draw_call_tensor(data, dt, rank, shape, fill, input);
  };
  // The caches are written by appends, so they get no broadcast strides.
  FuzzTensor kc = tensor(dtype, 4, kc_shape, 0, false), vc = tensor(dtype, 4, vc_shape, 0, false);
  FuzzTensor q = tensor(dtype, 4, q_shape, 0, true);
  FuzzTensor kn = tensor(dtype, 4, kn_shape, 0, true), vn = tensor(dtype, 4, vn_shape, 0, true);
  FuzzTensor out = tensor(dtype, 4, out_shape, 0xA5, false);
  FuzzTensor lse = tensor(ANYATTN_DTYPE_F32, 3, lse_shape, 0x5A, false);
  for (const FuzzTensor* t : {&kc, &vc, &q, &kn, &vn}) anyattn_fuzz::fill_values(data, *t, false);

  const int64_t b_shape[1] = {B}, table_shape[2] = {B, max_blocks};
  FuzzTensor t_seqlens = int_tensor(seqlens, 1, b_shape);
  FuzzTensor t_leftpad = int_tensor(leftpad, 1, b_shape);
  FuzzTensor t_batch_idx = int_tensor(batch_idx, 1, b_shape);
  FuzzTensor t_table = int_tensor(table, 2, table_shape);

  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  const bool scalar_seqlen = data.ConsumeBool() && corruption == 0;
  if (scalar_seqlen) {
    cache.cache_seqlen = seqlens[0];
    for (int32_t& s : seqlens) s = seqlens[0];
    for (int64_t b = 0; b < B; ++b) leftpad[b] = std::min(leftpad[b], seqlens[0]);
    std::memcpy(t_leftpad.t.data, leftpad.data(), leftpad.size() * 4);
  } else {
    cache.cache_seqlens = &t_seqlens.t;
  }
  if (use_leftpad) cache.cache_leftpad = &t_leftpad.t;
  if (use_batch_idx) cache.cache_batch_idx = &t_batch_idx.t;
  if (paged) cache.block_table = &t_table.t;
  if (S_new > 0) {
    cache.k_new = &kn.t;
    cache.v_new = &vn.t;
  }
  // Rotary: (S_ro, rotary_dim / 2) cos/sin, long enough unless corrupted.
  const bool rotary = S_new > 0 && data.ConsumeBool();
  const int64_t rot_half = data.ConsumeIntegralInRange<int64_t>(1, D / 2);
  const int64_t needed = capacity + Sq;
  const int64_t s_ro = corruption == 6 ? 1 : needed;
  const int64_t ro_shape[2] = {s_ro, rot_half};
  FuzzTensor cos_t =
      anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 2, ro_shape, StrideKind::kContiguous, 0, 1, 0);
  FuzzTensor sin_t =
      anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 2, ro_shape, StrideKind::kContiguous, 0, 1, 0);
  for (int64_t offset : cos_t.offsets()) {
    const double angle = 0.1 * static_cast<double>(offset);
    anyattn_fuzz::store_value(cos_t, offset, std::cos(angle));
    anyattn_fuzz::store_value(sin_t, offset, std::sin(angle));
  }
  // A one-position rotary table is too short once some key needs position >= 1; when only q
  // might need more, the library may still reject, and the reference cannot run either way.
  const bool rotary_short = rotary && corruption == 6;
  for (int64_t b = 0; b < B && rotary_short; ++b) {
    if (seqlens[b] + S_new > 1) must_fail = true;
  }
  if (rotary) {
    cache.rotary_cos = &cos_t.t;
    cache.rotary_sin = &sin_t.t;
    cache.rotary_interleaved = data.ConsumeBool();
  }

  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.causal = data.ConsumeBool();
  params.window_left = data.ConsumeIntegralInRange<int32_t>(-1, 3);
  params.num_splits = data.ConsumeIntegralInRange<int32_t>(0, 3);
  const bool with_lse = data.ConsumeBool();

  // Whether the library may legitimately reject what is left (colliding appends into shared
  // pages or cache batches): then only "nothing written" is checked.
  anyattn::reference::KvcacheOutputs ref;
  const bool reference_ok = !must_fail && !rotary_short;
  const anyattn_fuzz::Snapshot kc_before(&kc), vc_before(&vc), out_before(&out), lse_before(&lse);
  if (reference_ok) {
    // The reference appends into its own copies; it reads the caches as they are now.
    ref = anyattn::reference::fwd_kvcache(q.t, kc.t, vc.t, cache, &params);
  }

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  const anyattn_status status =
      anyattn_fwd_kvcache(&q.t, &kc.t, &vc.t, &out.t, with_lse ? &lse.t : nullptr, &cache, &params);
  if (status != ANYATTN_OK) {
    if (std::strlen(anyattn_last_error()) == 0) anyattn_fuzz::fail("empty message", status, 0, 0);
    if (!kc_before.unchanged() || !vc_before.unchanged() || !out_before.unchanged() ||
        !lse_before.unchanged()) {
      anyattn_fuzz::fail("a rejected call wrote", status, 0, 0);
    }
    return 0;
  }
  if (must_fail) anyattn_fuzz::fail("invalid call accepted", corruption, 0, 0);
  out_before.check_padding("out padding");
  lse_before.check_padding("lse padding");
  kc_before.check_padding("k_cache padding");
  vc_before.check_padding("v_cache padding");
  // The caches go back to their state before the call, and the append happens again.
  anyattn_fuzz::check_same_bytes_with_threads(
      threads % 3 + 1, {&kc_before, &vc_before, &out_before, &lse_before}, [&] {
        return anyattn_fwd_kvcache(&q.t, &kc.t, &vc.t, &out.t, with_lse ? &lse.t : nullptr, &cache,
                                   &params);
      });
  if (!reference_ok) return 0;
  const double tol = anyattn_fuzz::tolerance(dtype);
  anyattn_fuzz::check_close("out", anyattn::reference::to_contiguous_f64(out.t), ref.out, tol, 2.0);
  if (with_lse) {
    // Rotary in f32 and new keys rounded to the dtype shift the scores by a few dtype ulps.
    anyattn_fuzz::check_close("lse", anyattn::reference::to_contiguous_f64(lse.t), ref.lse,
                              rotary && dtype != ANYATTN_DTYPE_F32 ? 40 * tol : 1e-4, 1.0);
  }
  anyattn_fuzz::check_close("k_cache", anyattn::reference::to_contiguous_f64(kc.t), ref.k_cache,
                            tol, 2.0);
  anyattn_fuzz::check_close("v_cache", anyattn::reference::to_contiguous_f64(vc.t), ref.v_cache,
                            tol, 2.0);
  if (S_new == 0 && !rotary) check_packed_queries(q.t, kc.t, vc.t, cache, params, ref, tol, 2.0);
  return 0;
}
