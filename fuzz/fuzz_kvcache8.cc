// libFuzzer harness for 8-bit KV caches in anyattn_fwd_kvcache (and, for calls that only read the
// cache, anyattn_fwd_kvcache_varlen): fp8 e4m3, fp8 e5m2 and int8 caches, contiguous or paged,
// with descales of every shape ((1), (Hk), (B, Hk)) and hostile values (0, subnormal, NaN, inf,
// negative), per-token scales, the format's NaN code in cached rows, appends that quantize (with
// rotary), and shared latent caches (absorbed MLA: v_cache a column view of k_cache) with the V
// scales the contract allows and those it rejects. Every GQA group size from 1 to 8 query heads
// per kv head, so both the direct decode loop and the packed path run.
//
// Checks: a rejected call leaves the caches, the token scales and the outputs untouched and sets
// a message; an invalid call (a bad descale, token scales given by halves, V scales of its own
// for a latent cache, rotary with a latent append, an over-long append) is rejected; an accepted
// one writes the same bytes again with another thread count, matches the f64 reference for out
// and lse, and appends exactly the reference's bytes and token scales (the append and the
// reference share the one quantization routine, so they agree bit for bit).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/kv8_convert.h"
#include "fuzz_common.h"
#include "fuzz_kvcache_common.h"
#include "reference/reference_cache.h"

using anyattn_fuzz::FuzzTensor;
using anyattn_fuzz::StrideKind;

namespace {

namespace convert = anyattn::convert;

// A descale tensor drawn from the input, with the values it gives each (sequence, kv head).
struct Descale {
  FuzzTensor tensor;
  bool given = false;
  bool invalid = false;       // rejected by every call (bad shape, NaN, inf, negative)
  bool not_appendable = false;  // 0 or subnormal: rejected when appending
  std::vector<float> values;    // (B, Hk) as the kernels read them
};

// Draws none, (1), (Hk), (B, Hk) or a wrong shape; normal entries are nominal[h] (times 2 for odd
// sequences of a (B, Hk) descale), and one entry in about eight tensors is hostile. A (B, Hk)
// descale may be a broadcast view, as FA3's callers expand one scale: strides (0, 0) read entry
// 0 everywhere, (0, 1) the first row.
Descale draw_descale(FuzzedDataProvider& data, int64_t batch, int64_t heads_k,
                     const std::vector<float>& nominal) {
  Descale d;
  const int shape_pick = data.ConsumeIntegralInRange<int>(0, 8);
  if (shape_pick <= 2) return d;  // none
  d.given = true;
  const int broadcast =
      shape_pick == 6 || shape_pick == 7 ? data.ConsumeIntegralInRange<int>(0, 2) : 0;
  int64_t shape[2] = {1, 1};
  int ndim = 1;
  if (shape_pick == 4 || shape_pick == 5) shape[0] = heads_k;
  if (shape_pick == 6 || shape_pick == 7) {
    ndim = 2;
    shape[0] = batch;
    shape[1] = heads_k;
  }
  if (shape_pick == 8) {
    shape[0] = heads_k + 1;  // neither 1 nor Hk
    d.invalid = true;
  }
  d.tensor = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, ndim, shape, StrideKind::kContiguous,
                                       0, 1, 0);
  std::vector<float> entries;
  for (int64_t i = 0; i < shape[0] * (ndim == 2 ? shape[1] : 1); ++i) {
    const int64_t b = ndim == 2 ? i / heads_k : 0;
    const int64_t h = ndim == 2 ? i % heads_k : (shape[0] == heads_k ? i : 0);
    entries.push_back(nominal[h] * (ndim == 2 && b % 2 == 1 ? 2.f : 1.f));
  }
  if (data.ConsumeIntegralInRange<int>(0, 7) == 7) {
    const float hostile[] = {0.f, 1e-40f, std::numeric_limits<float>::quiet_NaN(), INFINITY,
                             -1.f};
    const int pick = data.ConsumeIntegralInRange<int>(0, 4);
    entries[data.ConsumeIntegralInRange<size_t>(0, entries.size() - 1)] = hostile[pick];
    if (pick <= 1) d.not_appendable = true;
    if (pick >= 2) d.invalid = true;
  }
  std::memcpy(d.tensor.t.data, entries.data(), entries.size() * 4);
  if (broadcast != 0) {  // the entries the view reads, and their verdicts
    d.tensor.t.strides[0] = 0;
    if (broadcast == 1) d.tensor.t.strides[1] = 0;
    d.invalid = d.not_appendable = false;
    for (size_t i = 0; i < entries.size(); ++i) {
      entries[i] = entries[broadcast == 1 ? 0 : i % static_cast<size_t>(heads_k)];
      if (!std::isfinite(entries[i]) || entries[i] < 0.f) d.invalid = true;
      if (entries[i] == 0.f || std::fpclassify(entries[i]) == FP_SUBNORMAL) {
        d.not_appendable = true;
      }
    }
  }
  if (!d.invalid) {
    d.values.resize(static_cast<size_t>(batch * heads_k));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads_k; ++h) {
        d.values[b * heads_k + h] =
            ndim == 2 ? entries[b * heads_k + h] : entries[shape[0] == 1 ? 0 : h];
      }
    }
  }
  return d;
}

// The format's NaN code (fp8 only; int8 has none).
uint8_t nan_code(int32_t dtype, bool negative) {
  const uint8_t code = dtype == ANYATTN_DTYPE_FP8_E4M3 ? 0x7F : 0x7E;
  return negative ? static_cast<uint8_t>(code | 0x80) : code;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  FuzzedDataProvider data(bytes, size);
  const int32_t q_dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
  const int32_t cache_dtypes[] = {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2,
                                  ANYATTN_DTYPE_I8};
  const int32_t dtype = q_dtypes[data.ConsumeIntegralInRange<int>(0, 2)];
  const int32_t cache_dtype = cache_dtypes[data.ConsumeIntegralInRange<int>(0, 2)];
  const auto format = static_cast<convert::Kv8>(cache_dtype);
  const int64_t B = data.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t Sq = data.ConsumeIntegralInRange<int64_t>(1, 4);
  const int64_t Hk = data.ConsumeIntegralInRange<int64_t>(1, 2);
  const int64_t groups[] = {1, 2, 3, 8};
  const int64_t Hq = Hk * groups[data.ConsumeIntegralInRange<int>(0, 3)];
  const bool latent = data.ConsumeBool();
  const int64_t D = 2 * data.ConsumeIntegralInRange<int64_t>(1, 8);
  const int64_t Dv = data.ConsumeIntegralInRange<int64_t>(1, latent ? D : 12);
  const bool paged = data.ConsumeBool();
  const int64_t page = data.ConsumeIntegralInRange<int64_t>(1, 5);
  const int64_t max_blocks = data.ConsumeIntegralInRange<int64_t>(1, 3);
  const int64_t num_blocks = data.ConsumeIntegralInRange<int64_t>(1, 3 * B);
  const int64_t S_cache = data.ConsumeIntegralInRange<int64_t>(1, 10);
  const int64_t capacity = paged ? page * max_blocks : S_cache;
  const int64_t S_new = data.ConsumeBool() ? data.ConsumeIntegralInRange<int64_t>(1, 3) : 0;
  const bool appending = S_new > 0;

  std::vector<int32_t> seqlens(B), leftpad(B), table(B * max_blocks);
  for (int64_t b = 0; b < B; ++b) {
    seqlens[b] = data.ConsumeIntegralInRange<int32_t>(
        0, static_cast<int32_t>(std::max<int64_t>(capacity - S_new, 0)));
    leftpad[b] = data.ConsumeIntegralInRange<int32_t>(0, seqlens[b]);
  }
  for (int32_t& entry : table) {
    entry = data.ConsumeIntegralInRange<int32_t>(0, static_cast<int32_t>(num_blocks - 1));
  }
  bool must_fail = capacity < S_new;
  if (data.ConsumeIntegralInRange<int>(0, 15) == 15) {  // one sequence past the capacity
    seqlens[data.ConsumeIntegralInRange<int64_t>(0, B - 1)] =
        static_cast<int32_t>(capacity - S_new + 1);
    must_fail = true;
  }
  const bool use_leftpad = data.ConsumeBool();

  // Shapes; a latent cache's V is K's first Dv columns, and its new values k_new's.
  const int64_t cache_rows = paged ? num_blocks : B;
  const int64_t cache_len = paged ? page : S_cache;
  const int64_t kc_shape[4] = {cache_rows, cache_len, Hk, D};
  const int64_t vc_shape[4] = {cache_rows, cache_len, Hk, Dv};
  const int64_t scale_shape[3] = {cache_rows, cache_len, Hk};
  const int64_t q_shape[4] = {B, Sq, Hq, D}, out_shape[4] = {B, Sq, Hq, Dv};
  const int64_t kn_shape[4] = {B, S_new, Hk, D}, vn_shape[4] = {B, S_new, Hk, Dv};
  const int64_t lse_shape[3] = {B, Hq, Sq};
  auto tensor = [&](int32_t dt, int rank, const int64_t* shape, unsigned char fill, bool input) {
    return anyattn_fuzz::draw_call_tensor(data, dt, rank, shape, fill, input);
  };
  FuzzTensor kc = tensor(cache_dtype, 4, kc_shape, 0, false);
  FuzzTensor vc_own = latent ? FuzzTensor{} : tensor(cache_dtype, 4, vc_shape, 0, false);
  anyattn_tensor vc = latent ? kc.t : vc_own.t;
  vc.shape[3] = Dv;
  FuzzTensor q = tensor(dtype, 4, q_shape, 0, true);
  FuzzTensor kn = tensor(dtype, 4, kn_shape, 0, true);
  FuzzTensor vn_own = latent ? FuzzTensor{} : tensor(dtype, 4, vn_shape, 0, true);
  anyattn_tensor vn = latent ? kn.t : vn_own.t;
  vn.shape[3] = Dv;
  FuzzTensor out = tensor(dtype, 4, out_shape, 0xA5, false);
  FuzzTensor lse = tensor(ANYATTN_DTYPE_F32, 3, lse_shape, 0x5A, false);
  anyattn_fuzz::fill_values(data, q, false);
  anyattn_fuzz::fill_values(data, kn, false);
  if (!latent) anyattn_fuzz::fill_values(data, vn_own, false);

  // Descales: nominal[h], twice that for odd sequences of a (B, Hk) descale, or hostile.
  const float nominals[] = {0x1p-8f, 0.125f, 1.f, 3.f, 1024.f};
  std::vector<float> nominal(Hk);
  for (float& n : nominal) n = nominals[data.ConsumeIntegralInRange<int>(0, 4)];
  Descale k_descale = draw_descale(data, B, Hk, nominal);
  Descale v_descale;
  if (latent) {
    // NULL, K's values again (a copy, possibly of another shape), or other values (rejected).
    const int pick = data.ConsumeIntegralInRange<int>(0, 3);
    if (pick == 1 && k_descale.given && !k_descale.invalid) {
      const int64_t shape[2] = {B, Hk};
      v_descale.tensor = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 2, shape,
                                                   StrideKind::kContiguous, 0, 1, 0);
      std::memcpy(v_descale.tensor.t.data, k_descale.values.data(), B * Hk * 4);
      v_descale.given = true;
      v_descale.values = k_descale.values;
    } else if (pick >= 2) {
      std::vector<float> other = nominal;
      for (float& n : other) n *= pick == 2 ? 2.f : 1.f;
      v_descale = draw_descale(data, B, Hk, other);
      const bool same = v_descale.given && !v_descale.invalid &&
                        (k_descale.given ? k_descale.values == v_descale.values
                                         : std::all_of(v_descale.values.begin(),
                                                       v_descale.values.end(),
                                                       [](float v) { return v == 1.f; }));
      if (v_descale.given && !same) must_fail = true;
    }
  } else {
    v_descale = draw_descale(data, B, Hk, nominal);
  }
  for (const Descale* d : {&k_descale, &v_descale}) {
    if (d->invalid || (appending && d->not_appendable)) must_fail = true;
  }
  // Token scales: none, K's and V's, or a wrong pairing.
  const int token_pick = data.ConsumeIntegralInRange<int>(0, 4);
  const bool with_k_token = token_pick == 1 || token_pick == 2 || token_pick == 3;
  const bool with_v_token = token_pick == 1 || token_pick == 4;
  FuzzTensor k_token = tensor(ANYATTN_DTYPE_F32, 3, scale_shape, 0, false);
  FuzzTensor v_token_own = tensor(ANYATTN_DTYPE_F32, 3, scale_shape, 0, false);
  // A latent cache's V token scales: K's tensor itself (pick 2) or another one (rejected).
  const anyattn_tensor* v_token =
      !with_v_token && !(latent && token_pick == 2) ? nullptr
      : latent && token_pick == 2                   ? &k_token.t
                                                    : &v_token_own.t;
  if (latent ? with_v_token : with_k_token != with_v_token) must_fail = true;
  const bool token_scales = with_k_token || with_v_token;

  // The cached rows: values in [-2, 2) quantized with the descale sequence 0 reads (1 when
  // absent; nominal where it is 0 or invalid) and a token scale (kept as the row's own), so the
  // dequantized values stay in about [-4, 4) whatever the factors; a few of them the format's
  // NaN code.
  auto row_descales = [&](const Descale& d) {
    std::vector<float> r = d.given ? nominal : std::vector<float>(Hk, 1.f);
    for (int64_t h = 0; h < Hk && d.given && !d.invalid; ++h) {
      if (d.values[h] >= FLT_MIN) r[h] = d.values[h];
    }
    return r;
  };
  const std::vector<float> k_row_descale = row_descales(k_descale);
  const std::vector<float> v_row_descale = row_descales(v_descale);
  const float tokens[] = {0x1p-6f, 0.125f, 1.f, 3.f, 64.f};
  std::vector<float> row_values(std::max(D, Dv));
  std::vector<uint8_t> row_bytes(std::max(D, Dv));
  const std::vector<int64_t> k_offsets = kc.offsets();
  const std::vector<int64_t> v_offsets = latent ? std::vector<int64_t>() : vc_own.offsets();
  const std::vector<int64_t> k_token_offsets = k_token.offsets();
  const std::vector<int64_t> v_token_offsets = v_token_own.offsets();
  auto fill_row = [&](const FuzzTensor& cache, const std::vector<int64_t>& offsets,
                      int64_t row, int64_t width, float descale, FuzzTensor* token,
                      const std::vector<int64_t>& token_offsets) {
    for (int64_t i = 0; i < width; ++i) {
      row_values[i] = (static_cast<float>(data.ConsumeIntegral<uint8_t>()) - 128.f) / 64.f;
    }
    const float t = token != nullptr ? tokens[data.ConsumeIntegralInRange<int>(0, 4)] : 1.f;
    convert::quantize_kv8_row(format, row_values.data(), width, descale * t, nullptr,
                              row_bytes.data());
    auto* base = static_cast<uint8_t*>(cache.t.data);
    for (int64_t i = 0; i < width; ++i) base[offsets[row * width + i]] = row_bytes[i];
    if (token != nullptr) {
      std::memcpy(static_cast<float*>(token->t.data) + token_offsets[row], &t, 4);
    }
  };
  const bool nan_codes =
      cache_dtype != ANYATTN_DTYPE_I8 && data.ConsumeIntegralInRange<int>(0, 7) == 7;
  for (int64_t row = 0; row < cache_rows * cache_len * Hk; ++row) {
    fill_row(kc, k_offsets, row, D, k_row_descale[row % Hk], token_scales ? &k_token : nullptr,
             k_token_offsets);
    if (!latent) {
      fill_row(vc_own, v_offsets, row, Dv, v_row_descale[row % Hk],
               token_scales ? &v_token_own : nullptr, v_token_offsets);
    }
  }
  if (nan_codes) {
    const FuzzTensor& target = latent || data.ConsumeBool() ? kc : vc_own;
    const std::vector<int64_t>& offsets = &target == &kc ? k_offsets : v_offsets;
    const int64_t at = data.ConsumeIntegralInRange<int64_t>(0, offsets.size() - 1);
    static_cast<uint8_t*>(target.t.data)[offsets[at]] = nan_code(cache_dtype, data.ConsumeBool());
  }

  const int64_t b_shape[1] = {B}, table_shape[2] = {B, max_blocks};
  FuzzTensor t_seqlens = anyattn_fuzz::int_tensor(seqlens, 1, b_shape);
  FuzzTensor t_leftpad = anyattn_fuzz::int_tensor(leftpad, 1, b_shape);
  FuzzTensor t_table = anyattn_fuzz::int_tensor(table, 2, table_shape);
  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  cache.cache_seqlens = &t_seqlens.t;
  if (use_leftpad) cache.cache_leftpad = &t_leftpad.t;
  if (paged) cache.block_table = &t_table.t;
  if (appending) {
    cache.k_new = &kn.t;
    cache.v_new = &vn;
  }
  if (k_descale.given) cache.k_descale = &k_descale.tensor.t;
  if (v_descale.given) cache.v_descale = &v_descale.tensor.t;
  if (with_k_token) cache.k_token_scale = &k_token.t;
  cache.v_token_scale = v_token;

  // Rotary on appends (a latent append rejects it).
  const bool rotary = appending && data.ConsumeBool();
  const int64_t rot_half = data.ConsumeIntegralInRange<int64_t>(1, D / 2);
  const int64_t ro_shape[2] = {capacity + Sq, rot_half};
  FuzzTensor cos_t = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 2, ro_shape,
                                               StrideKind::kContiguous, 0, 1, 0);
  FuzzTensor sin_t = anyattn_fuzz::make_tensor(ANYATTN_DTYPE_F32, 2, ro_shape,
                                               StrideKind::kContiguous, 0, 1, 0);
  for (int64_t offset : cos_t.offsets()) {
    const double angle = 0.1 * static_cast<double>(offset);
    anyattn_fuzz::store_value(cos_t, offset, std::cos(angle));
    anyattn_fuzz::store_value(sin_t, offset, std::sin(angle));
  }
  if (rotary) {
    cache.rotary_cos = &cos_t.t;
    cache.rotary_sin = &sin_t.t;
    cache.rotary_interleaved = data.ConsumeBool();
    if (latent) must_fail = true;
  }

  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.causal = data.ConsumeBool();
  params.window_left = data.ConsumeIntegralInRange<int32_t>(-1, 3);
  params.num_splits = data.ConsumeIntegralInRange<int32_t>(0, 3);
  params.isa = data.ConsumeIntegralInRange<int>(0, 4);
  const bool with_lse = data.ConsumeBool();

  anyattn::reference::KvcacheOutputs ref;
  if (!must_fail) ref = anyattn::reference::fwd_kvcache(q.t, kc.t, vc, cache, &params);
  const anyattn_fuzz::Snapshot kc_before(&kc), vc_before(latent ? nullptr : &vc_own),
      k_token_before(&k_token), v_token_before(&v_token_own), out_before(&out), lse_before(&lse);

  const int threads = data.ConsumeIntegralInRange<int>(1, 3);
  anyattn_set_num_threads(threads);
  auto call = [&] {
    return anyattn_fwd_kvcache(&q.t, &kc.t, &vc, &out.t, with_lse ? &lse.t : nullptr, &cache,
                               &params);
  };
  const anyattn_status status = call();
  if (!anyattn_fuzz::check_status(
          status, {&kc_before, &vc_before, &k_token_before, &v_token_before, &out_before,
                   &lse_before},
          {})) {
    return 0;  // a rejection of an apparently valid call (e.g. appends colliding in a shared page)
  }
  if (must_fail) anyattn_fuzz::fail("invalid call accepted", 0, 0, 0);
  out_before.check_padding("out padding");
  lse_before.check_padding("lse padding");
  kc_before.check_padding("k_cache padding");
  vc_before.check_padding("v_cache padding");
  k_token_before.check_padding("k_token_scale padding");
  v_token_before.check_padding("v_token_scale padding");
  anyattn_fuzz::check_same_bytes_with_threads(
      threads % 3 + 1,
      {&kc_before, &vc_before, &k_token_before, &v_token_before, &out_before, &lse_before}, call);

  const double tol = anyattn_fuzz::tolerance(dtype);
  const double out_scale = 4.0;  // the dequantized values lie in about [-4, 4)
  anyattn_fuzz::check_close("out", anyattn::reference::to_contiguous_f64(out.t), ref.out, tol,
                            out_scale);
  if (with_lse) {
    // Rotary in f32 and new keys rounded to q's dtype shift the scores by a few dtype ulps.
    anyattn_fuzz::check_close("lse", anyattn::reference::to_contiguous_f64(lse.t), ref.lse,
                              rotary && dtype != ANYATTN_DTYPE_F32 ? 40 * tol : 1e-4, 1.0);
  }
  // The append and the reference quantize alike: the same stored values and token scales.
  anyattn_fuzz::check_close("k_cache", anyattn::reference::to_contiguous_f64(kc.t), ref.k_cache,
                            0.0, 0.0);
  anyattn_fuzz::check_close("v_cache", anyattn::reference::to_contiguous_f64(vc), ref.v_cache,
                            0.0, 0.0);
  if (with_k_token) {
    anyattn_fuzz::check_close("k_token_scale", anyattn::reference::to_contiguous_f64(k_token.t),
                              ref.k_token_scale, 0.0, 0.0);
  }
  if (with_v_token && !latent) {
    anyattn_fuzz::check_close("v_token_scale",
                              anyattn::reference::to_contiguous_f64(v_token_own.t),
                              ref.v_token_scale, 0.0, 0.0);
  }
  if (!appending) {
    anyattn_fuzz::check_packed_queries(q.t, kc.t, vc, cache, params, ref, tol, out_scale);
  }
  return 0;
}
