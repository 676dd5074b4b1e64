// 8-bit KV caches (fp8 e4m3, fp8 e5m2, int8) in anyattn_fwd_kvcache and
// anyattn_fwd_kvcache_varlen, against the f64 reference fed the same dequantized values
// (reference_cache.h) by the 2x rule (tests/README.md): every cache dtype with every q dtype and
// scale granularity (none, per tensor, per kv head, per sequence and kv head, per token, per token
// with a descale), contiguous and paged caches of several page sizes, cache_batch_idx, leftpad,
// the in-place append with and without rotary, decode (Sq = 1) and chunked-prefill shapes, on
// every ISA path the host runs with 1 and 2 threads. Every append also checks the cache bytes and
// token scales it wrote against the reference's quantization, and that nothing else changed.
// Then the hostile scales (0, subnormal, negative, inf, NaN, wrong shapes and dtypes) and the
// errors, each checking that the cache and out were left untouched. e4m3 cases run under both of
// the direct decode loop's reads, and cases with bf16 queries with and without its rows widened to
// bf16 for the dot products; linked against the library's objects, to reach those switches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "cache/cache_test_support.h"
#include "common/half_convert.h"
#include "common/kv8_convert.h"
#include "common/test_support.h"
#include "cpu/decode/e4m3_read.h"
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/decode/kv8_widen.h"
#include "reference/reference_cache.h"

namespace anyattn {
namespace testing {
namespace {

enum class Scales { kNone, kTensor, kHead, kSeqHead, kToken, kTokenDescale };

const char* scales_name(Scales s) {
  switch (s) {
    case Scales::kNone: return "none";
    case Scales::kTensor: return "tensor";
    case Scales::kHead: return "head";
    case Scales::kSeqHead: return "seq_head";
    case Scales::kToken: return "token";
    case Scales::kTokenDescale: return "token+descale";
  }
  return "?";
}

const char* kv_name(int32_t dtype) {
  return dtype == ANYATTN_DTYPE_FP8_E4M3 ? "e4m3" : dtype == ANYATTN_DTYPE_FP8_E5M2 ? "e5m2" : "i8";
}

struct Q8Case {
  int32_t kv_dtype = ANYATTN_DTYPE_FP8_E4M3;
  anyattn_dtype dtype = ANYATTN_DTYPE_F32;  // of q, the new keys and out
  Scales scales = Scales::kNone;
  int64_t B = 2, Sq = 1, Hq = 4, Hk = 2, D = 32, Dv = 32;
  std::vector<int32_t> seqlens = {37, 70};  // stored before the append
  int64_t capacity = 96;
  int64_t page_size = 0;  // 0: contiguous
  int64_t S_new = 0;
  int64_t rotary_dim = 0;
  bool interleaved = false;
  bool causal = false;
  bool batch_idx = false;
  bool leftpad = false;
  // Absorbed MLA's shared latent cache: v_cache (and v_new) the first Dv columns of k_cache (and
  // k_new). V then takes K's scales: v_descale is NULL or a copy of k_descale, and v_token_scale
  // NULL or k_token_scale itself, alternating with the seed.
  bool shared_latent = false;
  uint64_t seed = 1;

  std::string describe() const {
    return std::string(kv_name(kv_dtype)) + " q=" + dtype_name(dtype) + " scales=" +
           scales_name(scales) + " B=" + std::to_string(B) + " Sq=" + std::to_string(Sq) +
           " Hq=" + std::to_string(Hq) + " Hk=" + std::to_string(Hk) + " D=" + std::to_string(D) +
           " Dv=" + std::to_string(Dv) + " page=" + std::to_string(page_size) +
           " S_new=" + std::to_string(S_new) + " rotary=" + std::to_string(rotary_dim) +
           (interleaved ? "i" : "") + " causal=" + std::to_string(causal) +
           " batch_idx=" + std::to_string(batch_idx) + " leftpad=" + std::to_string(leftpad) +
           (shared_latent ? " shared_latent" : "");
  }
};

// The typical magnitude of a stored value's scale: int8 codes are integers up to 127, so their
// scales are small; fp8 values carry their own exponent.
double scale_unit(int32_t kv_dtype) { return kv_dtype == ANYATTN_DTYPE_I8 ? 1.0 / 40 : 1.0; }

// A problem: caches whose stored positions hold normal(0, 1) values quantized with the case's
// scales, NaN (fp8) or 0 (int8) bytes and NaN token scales everywhere else.
struct Q8Problem {
  explicit Q8Problem(const Q8Case& c) : c(c) {
    CacheRng rng(c.seed);
    const bool paged = c.page_size > 0;
    const int64_t max_blocks = paged ? (c.capacity + c.page_size - 1) / c.page_size : 0;
    rows0 = paged ? c.B * max_blocks + 2 : (c.batch_idx ? c.B + 1 : c.B);
    rows1 = paged ? c.page_size : c.capacity;
    q = OwnedTensor(c.dtype, {c.B, c.Sq, c.Hq, c.D});
    q.fill_normal(&rng);
    k_cache = OwnedTensor(c.kv_dtype, {rows0, rows1, c.Hk, c.D});
    v_cache = OwnedTensor(c.kv_dtype, {rows0, rows1, c.Hk, c.Dv});
    out = OwnedTensor(c.dtype, {c.B, c.Sq, c.Hq, c.Dv});
    out.fill(-768.0);
    lse = OwnedTensor(ANYATTN_DTYPE_F32, {c.B, c.Hq, c.Sq});
    lse.fill(-768.0);
    anyattn_kvcache_params_init(&cache);
    anyattn_fwd_params_init(&params);
    params.causal = c.causal ? 1 : 0;

    if (paged) {
      // A permutation of the pages: a stride coprime with their count.
      int64_t stride = 7;
      while (std::gcd(stride, rows0) != 1) stride += 2;
      std::vector<int32_t> pages(static_cast<size_t>(rows0));
      for (int64_t i = 0; i < rows0; ++i) pages[i] = static_cast<int32_t>((i * stride + 3) % rows0);
      block_table = OwnedTensor(ANYATTN_DTYPE_I32, {c.B, max_blocks});
      for (int64_t i = 0; i < c.B * max_blocks; ++i) block_table.set(i, pages[i]);
      cache.block_table = &block_table.t;
    } else if (c.batch_idx) {
      std::vector<int32_t> index(static_cast<size_t>(c.B));
      for (int64_t b = 0; b < c.B; ++b) index[b] = static_cast<int32_t>(c.B - b);  // skips row 0
      batch_idx = int_tensor(index);
      cache.cache_batch_idx = &batch_idx.t;
    }
    seqlens = int_tensor(c.seqlens);
    cache.cache_seqlens = &seqlens.t;
    if (c.leftpad) {
      std::vector<int32_t> pad(static_cast<size_t>(c.B));
      for (int64_t b = 0; b < c.B; ++b) pad[b] = std::min<int32_t>(c.seqlens[b], 3 + 2 * b);
      leftpad = int_tensor(pad);
      cache.cache_leftpad = &leftpad.t;
    }

    const double unit = scale_unit(c.kv_dtype);
    const bool token = c.scales == Scales::kToken || c.scales == Scales::kTokenDescale;
    const double descale_unit = token ? 1.0 : unit;  // token scales carry the unit otherwise
    switch (c.scales) {
      case Scales::kTensor:
      case Scales::kTokenDescale:
        k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
        v_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
        k_descale.set(0, 0.9 * descale_unit);
        v_descale.set(0, 0.8 * descale_unit);
        break;
      case Scales::kHead:
        k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {c.Hk});
        v_descale = OwnedTensor(ANYATTN_DTYPE_F32, {c.Hk});
        for (int64_t h = 0; h < c.Hk; ++h) {
          k_descale.set(h, (0.7 + 0.2 * h) * descale_unit);
          v_descale.set(h, (1.1 - 0.2 * h) * descale_unit);
        }
        break;
      case Scales::kSeqHead:
        k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {c.B, c.Hk});
        v_descale = OwnedTensor(ANYATTN_DTYPE_F32, {c.B, c.Hk});
        for (int64_t i = 0; i < c.B * c.Hk; ++i) {
          k_descale.set(i, (0.6 + 0.15 * i) * descale_unit);
          v_descale.set(i, (1.2 - 0.1 * i) * descale_unit);
        }
        break;
      default:
        break;
    }
    if (c.shared_latent && k_descale.t.ndim > 0) v_descale = k_descale;
    if (k_descale.t.ndim > 0) {
      cache.k_descale = &k_descale.t;
      cache.v_descale = c.shared_latent && c.seed % 2 == 0 ? nullptr : &v_descale.t;
    }
    if (token) {
      k_scale = OwnedTensor(ANYATTN_DTYPE_F32, {rows0, rows1, c.Hk});
      v_scale = OwnedTensor(ANYATTN_DTYPE_F32, {rows0, rows1, c.Hk});
      cache.k_token_scale = &k_scale.t;
      cache.v_token_scale = &v_scale.t;
      if (c.shared_latent) cache.v_token_scale = c.seed % 4 < 2 ? nullptr : &k_scale.t;
    }
    if (c.shared_latent) {
      // The call and the reference see the views; v_cache's own buffer stays as built.
      v_cache.t = k_cache.t;
      v_cache.t.shape[3] = c.Dv;
    }

    // The stored positions: dequantized targets normal(0, 1), stored = Q(x / (descale * token)).
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t position = 0; position < c.seqlens[b]; ++position) {
        int64_t n = 0, r = 0;
        reference::cache_location(k_cache.t, cache, b, position, &n, &r);
        for (int64_t h = 0; h < c.Hk; ++h) {
          const int64_t slot = (n * rows1 + r) * c.Hk + h;
          double k_factor = reference::cache_descale(cache.k_descale, b, h);
          double v_factor = reference::cache_descale(cache.v_descale, b, h);
          if (token) {
            const float k_token = static_cast<float>(unit * (0.5 + rng.uniform()));
            const float v_token = static_cast<float>(unit * (0.5 + rng.uniform()));
            k_scale.set(slot, k_token);
            v_scale.set(slot, v_token);
            k_factor *= k_token;
            v_factor *= v_token;
          }
          for (int64_t d = 0; d < c.D; ++d) k_cache.set(slot * c.D + d, rng.normal() / k_factor);
          if (c.shared_latent) continue;  // V is the K rows' first Dv values
          for (int64_t d = 0; d < c.Dv; ++d) v_cache.set(slot * c.Dv + d, rng.normal() / v_factor);
        }
      }
    }

    if (c.S_new > 0) {
      k_new = OwnedTensor(c.dtype, {c.B, c.S_new, c.Hk, c.D});
      v_new = OwnedTensor(c.dtype, {c.B, c.S_new, c.Hk, c.Dv});
      k_new.fill_normal(&rng);
      v_new.fill_normal(&rng);
      cache.k_new = &k_new.t;
      cache.v_new = &v_new.t;
      if (c.shared_latent) {
        v_new.t = k_new.t;
        v_new.t.shape[3] = c.Dv;
      }
    }
    if (c.rotary_dim > 0) {
      const int64_t positions = c.capacity + 8;
      rotary_cos = OwnedTensor(ANYATTN_DTYPE_F32, {positions, c.rotary_dim / 2});
      rotary_sin = OwnedTensor(ANYATTN_DTYPE_F32, {positions, c.rotary_dim / 2});
      for (int64_t p = 0; p < positions; ++p) {
        for (int64_t t = 0; t < c.rotary_dim / 2; ++t) {
          const double angle = p * std::pow(10000.0, -2.0 * t / c.rotary_dim);
          rotary_cos.set(p * (c.rotary_dim / 2) + t, std::cos(angle));
          rotary_sin.set(p * (c.rotary_dim / 2) + t, std::sin(angle));
        }
      }
      cache.rotary_cos = &rotary_cos.t;
      cache.rotary_sin = &rotary_sin.t;
      cache.rotary_interleaved = c.interleaved ? 1 : 0;
    }
    pristine = {k_cache.bytes, v_cache.bytes, k_scale.bytes, v_scale.bytes};
    out_before = out.bytes;
  }
  Q8Problem(const Q8Problem&) = delete;

  // Restores the caches and outputs as built.
  void restore() {
    k_cache.bytes = pristine[0];
    v_cache.bytes = pristine[1];
    k_scale.bytes = pristine[2];
    v_scale.bytes = pristine[3];
    out.bytes = out_before;
  }
  bool cache_untouched() const {
    return k_cache.bytes == pristine[0] && v_cache.bytes == pristine[1] &&
           k_scale.bytes == pristine[2] && v_scale.bytes == pristine[3];
  }
  bool untouched() const { return cache_untouched() && out.bytes == out_before; }

  anyattn_status run() {
    return anyattn_fwd_kvcache(&q.t, &k_cache.t, &v_cache.t, &out.t, &lse.t, &cache, &params);
  }

  Q8Case c;
  int64_t rows0 = 0, rows1 = 0;
  OwnedTensor q, k_cache, v_cache, out, lse, block_table, batch_idx, seqlens, leftpad;
  OwnedTensor k_descale, v_descale, k_scale, v_scale, k_new, v_new, rotary_cos, rotary_sin;
  anyattn_kvcache_params cache{};
  anyattn_fwd_params params{};
  std::vector<std::vector<unsigned char>> pristine;
  std::vector<unsigned char> out_before;
};

// Equal element by element, NaN matching NaN.
::testing::AssertionResult same_values(const char* what, const std::vector<double>& got,
                                       const std::vector<double>& expected) {
  if (got.size() != expected.size()) return ::testing::AssertionFailure() << what << ": sizes";
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(expected[i]);
    if (!both_nan && got[i] != expected[i]) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "] is " << got[i] << ", expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs the case on path `isa` with `threads` threads against the reference: out and lse by the
// 2x rule, the caches and token scales after the append exactly.
::testing::AssertionResult run_and_check_once(Q8Problem* p, anyattn_isa isa, int threads) {
  const Q8Case& c = p->c;
  p->restore();
  p->params.isa = isa;
  const reference::KvcacheOutputs ref =
      reference::fwd_kvcache(p->q.t, p->k_cache.t, p->v_cache.t, p->cache, &p->params);
  const reference::KvcacheInputs naive_in =
      reference::gather_kvcache(p->q.t, p->k_cache.t, p->v_cache.t, p->cache, &p->params,
                                reference::Rounding::kLikeInputDtype);
  anyattn_set_num_threads(threads);
  const anyattn_status status = p->run();
  anyattn_set_num_threads(0);
  const std::string where = "\n  " + c.describe() + " isa=" + anyattn_isa_name(isa) +
                            " threads=" + std::to_string(threads);
  if (status != ANYATTN_OK) {
    return ::testing::AssertionFailure() << anyattn_status_name(status) << ": "
                                         << anyattn_last_error() << where;
  }
  const reference::HeadShape shape{c.Hq, c.Hk, c.D, c.Dv};
  const reference::ScoreOptions options = reference::resolve_options(&p->params, c.D);
  std::vector<double> naive_out(ref.out.size()), naive_lse(ref.lse.size());
  for (int64_t b = 0; b < c.B; ++b) {
    naive_gathered(naive_in.sequences[b], shape, options, c.dtype,
                   1.0f / std::sqrt(static_cast<float>(c.D)), 0.f,
                   naive_out.data() + b * c.Sq * c.Hq * c.Dv, naive_lse.data() + b * c.Hq * c.Sq,
                   c.Sq);
  }
  const std::vector<double> got_lse = p->lse.values();
  ::testing::AssertionResult r =
      check_two_x(c.dtype, p->out.values(), ref.out, naive_out, {c.B, c.Sq, c.Hq, c.Dv},
                  &got_lse, ref.lse, naive_lse, {c.B, c.Hq, c.Sq});
  if (r) r = same_values("k_cache", p->k_cache.values(), ref.k_cache);
  if (r) r = same_values("v_cache", p->v_cache.values(), ref.v_cache);
  if (r && p->cache.k_token_scale != nullptr) {
    r = same_values("k_token_scale", p->k_scale.values(), ref.k_token_scale);
  }
  if (r && p->cache.v_token_scale != nullptr) {
    r = same_values("v_token_scale", reference::to_contiguous_f64(*p->cache.v_token_scale),
                    ref.v_token_scale);
  }
  if (!r) r << where;
  return r;
}

// run_and_check_once under each of the direct decode loop's ways to read the case's cache,
// whichever this CPU would take: for e4m3 caches the f32-bits read and the read through f16
// (cpu/decode/e4m3_read.h); for bf16 queries both the f32 FMAs and, where the CPU has them, the
// rows widened to bf16 for the dot products (cpu/decode/kv8_widen.h: K rows in tasks of
// kv8_widen_key_min_rows or more query rows per kv head, V rows from kv8_widen_value_min_rows).
::testing::AssertionResult run_and_check(Q8Problem* p, anyattn_isa isa, int threads) {
  using cpu::E4m3ReadChoice;
  using cpu::Bf16DotScores;
  std::vector<E4m3ReadChoice> reads = {E4m3ReadChoice::kCpuDefault};
  if (p->c.kv_dtype == ANYATTN_DTYPE_FP8_E4M3) {
    reads = {E4m3ReadChoice::kF32Bits, E4m3ReadChoice::kViaHalf};
  }
  std::vector<Bf16DotScores> dots = {Bf16DotScores::kCpuDefault};
  if (p->c.dtype == ANYATTN_DTYPE_BF16) {
    dots = {Bf16DotScores::kWhereAvailable, Bf16DotScores::kOff};
  }
  for (E4m3ReadChoice read : reads) {
    for (Bf16DotScores dot : dots) {
      cpu::set_e4m3_read_for_tests(read);
      cpu::set_bf16_dot_scores_for_tests(dot);
      ::testing::AssertionResult r = run_and_check_once(p, isa, threads);
      cpu::set_e4m3_read_for_tests(E4m3ReadChoice::kCpuDefault);
      cpu::set_bf16_dot_scores_for_tests(Bf16DotScores::kCpuDefault);
      if (!r) {
        r << (read == E4m3ReadChoice::kF32Bits  ? " e4m3 read as f32 bits"
              : read == E4m3ReadChoice::kViaHalf ? " e4m3 read through f16"
                                                 : "");
        return r << (dot == Bf16DotScores::kWhereAvailable ? " widened rows where available"
                     : dot == Bf16DotScores::kOff          ? " f32 FMA scores"
                                                           : "");
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The case variations cycled through by case number n: layout, page size, Sq, append, rotary,
// batch index and left padding.
void vary(int64_t n, Q8Case* c) {
  const int64_t pages[] = {0, 16, 5, 0, 32, 1};
  c->page_size = pages[n % 6];
  c->batch_idx = c->page_size == 0 && n % 4 == 3;
  const int64_t sq[] = {1, 1, 3, 20};
  c->Sq = sq[n % 4];
  c->causal = c->Sq > 1 && n % 3 != 0;
  c->S_new = n % 3 == 1 ? 2 : n % 5 == 2 ? 1 : 0;
  if (c->S_new > 0 && n % 2 == 0) {
    c->rotary_dim = n % 4 == 0 ? 16 : 32;
    c->interleaved = n % 8 == 0;
  }
  c->leftpad = n % 5 == 4;
  if (n % 7 == 6) {  // head dims that leave vector tails
    c->D = 40;
    c->Dv = 24;
  }
  if (n % 6 == 5) c->Hq = 2;  // one query head per kv head
  c->seed = static_cast<uint64_t>(n) + 1;
}

TEST(Kvcache8bit, EveryDtypeScaleAndPathAgainstReference) {
  const anyattn_dtype q_dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
  const int32_t kv_dtypes[] = {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8};
  const Scales all_scales[] = {Scales::kNone,    Scales::kTensor, Scales::kHead,
                               Scales::kSeqHead, Scales::kToken,  Scales::kTokenDescale};
  int64_t n = 0;
  for (int32_t kv : kv_dtypes) {
    for (anyattn_dtype dtype : q_dtypes) {
      for (Scales scales : all_scales) {
        Q8Case c;
        c.kv_dtype = kv;
        c.dtype = dtype;
        c.scales = scales;
        vary(n++, &c);
        Q8Problem p(c);
        for (anyattn_isa isa : supported_isas()) {
          for (int threads : {1, 2}) EXPECT_TRUE(run_and_check(&p, isa, threads));
        }
      }
    }
  }
}

// Long enough for several key blocks and key splits on the direct decode loop, with GQA groups
// of 1 to 8 and a prefill chunk against the same cache.
TEST(Kvcache8bit, LongCachesDecodeAndChunkedPrefill) {
  int64_t n = 0;
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8}) {
    for (int64_t sq : {1, 2, 40}) {
      Q8Case c;
      c.kv_dtype = kv;
      c.dtype = n % 2 == 0 ? ANYATTN_DTYPE_BF16 : ANYATTN_DTYPE_F16;
      c.scales = n % 3 == 0 ? Scales::kTokenDescale : n % 3 == 1 ? Scales::kSeqHead : Scales::kToken;
      c.Sq = sq;
      c.causal = sq > 1;
      c.Hq = sq == 1 && n % 2 == 1 ? 16 : 8;  // GQA groups of 8 and 4
      c.Hk = 2;
      c.D = c.Dv = 64;
      c.capacity = 320;
      c.seqlens = {300, 190};
      c.page_size = n % 2 == 0 ? 0 : 64;
      c.seed = 100 + n++;
      Q8Problem p(c);
      for (anyattn_isa isa : supported_isas()) {
        for (int threads : {1, 2}) EXPECT_TRUE(run_and_check(&p, isa, threads));
      }
    }
  }
}

// One sequence of `stored` keys in a cache of `capacity`, one head, D = Dv = head_dim, no scales:
// the cases whose stored bytes the tests write themselves.
Q8Case one_head_case(int32_t kv, int64_t sq, int64_t head_dim, int32_t stored, int64_t capacity) {
  Q8Case c;
  c.kv_dtype = kv;
  c.Sq = sq;
  c.B = 1;
  c.Hq = c.Hk = 1;
  c.D = c.Dv = head_dim;
  c.seqlens = {stored};
  c.capacity = capacity;
  return c;
}

// Every stored code (NaN patterns excepted) in the rows, so that each path's vector conversion of
// every byte value is compared with the reference's scalar one.
// Decode with 12 bf16 query heads also reads them as rows widened to bf16 (run_and_check).
TEST(Kvcache8bit, EveryStoredCodeConvertsOnEveryPath) {
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8}) {
    for (int64_t sq : {1, 20, 0}) {
      Q8Case c = one_head_case(kv, std::max<int64_t>(sq, 1), 256, 3, 4);
      if (sq == 0) {  // decode at 12 query heads of bf16
        c.Hq = 12;
        c.dtype = ANYATTN_DTYPE_BF16;
      }
      Q8Problem p(c);
      // Scale the codes so that every value, e5m2's 57344 included, is a moderate score.
      const double largest = convert::kv8_max(static_cast<convert::Kv8>(kv));
      const float descale = static_cast<float>(1.0 / largest);
      p.k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
      p.v_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
      p.k_descale.set(0, descale);
      p.v_descale.set(0, descale);
      p.cache.k_descale = &p.k_descale.t;
      p.cache.v_descale = &p.v_descale.t;
      for (int64_t position = 0; position < 3; ++position) {
        for (int64_t d = 0; d < 256; ++d) {
          uint8_t code = static_cast<uint8_t>((d * 37 + position * 101) % 256);
          const bool nan = kv == ANYATTN_DTYPE_FP8_E4M3   ? (code & 0x7F) == 0x7F
                           : kv == ANYATTN_DTYPE_FP8_E5M2 ? (code & 0x7F) >= 0x7C
                                                          : false;
          if (nan) code = 0x01;
          p.k_cache.bytes[position * 256 + d] = code;
          p.v_cache.bytes[position * 256 + d] = static_cast<uint8_t>(code ^ 0x80);
        }
      }
      p.pristine = {p.k_cache.bytes, p.v_cache.bytes, p.k_scale.bytes, p.v_scale.bytes};
      for (anyattn_isa isa : supported_isas()) {
        for (int threads : {1, 2}) EXPECT_TRUE(run_and_check(&p, isa, threads));
      }
    }
  }
}

// A stored NaN code (e4m3 S.1111.111, e5m2 S.11111.xx with xx != 0) in a visible key's K row
// makes the rows that see that key NaN, and one in a V row the column it lies in, on every path,
// as in the reference: decode (one or four query rows per kv head) and causal chunks of 3 rows
// (the direct loop's masked block: the first row does not see the V row's key) and 20 rows (only
// the last 10 see it: the packed path, or on avx2 for e4m3 at one query head the direct loop);
// and 12 query heads of bf16, whose decode rows the direct loop widens to bf16 where it can.
// Head dims of 64 and 72, whose K code lies past the whole 64-byte lines that the direct loop's
// score pass watches as it reads them.
TEST(Kvcache8bit, StoredNanCodesGiveNanRowsOnEveryPath) {
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2}) {
    for (uint8_t nan_code : {uint8_t{0x7F}, uint8_t{0xFF}}) {
      for (int64_t sq : {1, 3, 20}) {
        for (int64_t heads_q : {1, 4, 12}) {
          if (heads_q == 12 && sq == 20) continue;  // 240 rows: the packed path, as at 4
          for (int64_t head_dim : {64, 72}) {
            for (bool k_nan : {true, false}) {
              Q8Case c = one_head_case(kv, sq, head_dim, 40, 48);
              c.Hq = heads_q;
              if (heads_q == 12) c.dtype = ANYATTN_DTYPE_BF16;  // widened rows (run_and_check)
              c.causal = sq > 1;
              Q8Problem p(c);
              for (size_t i = 0; i < p.k_cache.bytes.size(); ++i) {
                p.k_cache.bytes[i] = static_cast<uint8_t>(0x30 + i % 7);  // moderate codes
                p.v_cache.bytes[i] = static_cast<uint8_t>(0x28 + i % 5);
              }
              const int64_t v_key = sq == 20 ? 30 : 38;
              const int64_t k_dim = head_dim == 64 ? 17 : 70;
              if (k_nan) p.k_cache.bytes[5 * head_dim + k_dim] = nan_code;  // key 5
              p.v_cache.bytes[v_key * head_dim + 40] = nan_code;            // column 40
              p.pristine = {p.k_cache.bytes, p.v_cache.bytes, p.k_scale.bytes, p.v_scale.bytes};
              for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2));
            }
          }
        }
      }
    }
  }
}

// The direct decode loop's e4m3 read on the x86 paths gives the values times 2^-120: each query
// row is scaled by 2^120 to match (less where the row holds |q| >= 2^8, which would overflow),
// and each probability by its V factor times 2^120 (less for kv heads whose descale is 1 or
// more, their O held in matching units), except in key blocks whose V factors are too large for
// that, which read through f16 instead. Against the reference: rows with one element or all of
// them up to 2^60 beside ordinary rows, V descales from 2^6 to 2^40, token scales that cross
// 2^7 from block to block of one cache, and 16 and 20 rows per kv head. The caches span several
// key blocks.
TEST(Kvcache8bit, E4m3DirectReadKeepsLargeQueriesAndScales) {
  auto long_case = [](Scales scales, uint64_t seed) {
    Q8Case c;
    c.scales = scales;
    c.Hq = 8;
    c.Hk = 2;
    c.D = 72;  // a tail past the whole 64-byte lines
    c.Dv = 64;
    c.capacity = 320;
    c.seqlens = {300, 190};
    c.seed = seed;
    return c;
  };
  // Large queries: odd heads' rows times 2^e, all elements or only element 3. (Not element 3
  // alone at 2^20: beside unit elements the f32 scores' rounding, 2^20 * 2^-24, moves the
  // softmax, and the naive f32 run fails the harness's conditioning check.)
  for (int e : {7, 8, 20, 60}) {
    for (bool whole_row : {true, false}) {
      if (e == 20 && !whole_row) continue;
      Q8Problem p(long_case(Scales::kHead, 7 + e));
      const int64_t D = p.c.D;
      const std::vector<double> q = p.q.values();
      for (size_t i = 0; i < q.size(); ++i) {
        const int64_t head = static_cast<int64_t>(i) / D % p.c.Hq;
        const bool large = head % 2 == 1 && (whole_row || static_cast<int64_t>(i) % D == 3);
        p.q.set(static_cast<int64_t>(i), large ? std::ldexp(q[i], e) : q[i]);
      }
      for (anyattn_isa isa : supported_isas()) {
        EXPECT_TRUE(run_and_check(&p, isa, 1)) << "e=" << e << " whole_row=" << whole_row;
      }
    }
  }
  // Large V factors: descales of 2^e and 1.5 * 2^e for the two kv heads (their O held in units of
  // 2^(e + 1) from e = 0 on), and token scales of 0.5 to 1.5 times a descale of 100, so that
  // blocks differ in whether a factor reaches 2^7 (the f16 read's threshold there).
  for (int e : {6, 7, 12, 40}) {
    Q8Problem p(long_case(Scales::kHead, 31));
    p.v_descale.set(0, std::ldexp(1.0, e));
    p.v_descale.set(1, std::ldexp(1.0, e) * 1.5);
    for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2)) << e;
  }
  Q8Problem mixed(long_case(Scales::kTokenDescale, 32));
  mixed.v_descale.set(0, 100.0);
  for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&mixed, isa, 2));
  // 16 and 20 query rows per kv head (avx2 and avx512 take e4m3 read as f32 bits direct up to 20):
  // causal chunks of 4 and 5 positions at GQA 4, one kv head's descale 300.
  for (int64_t sq : {4, 5}) {
    Q8Case c = long_case(Scales::kHead, 40 + sq);
    c.Sq = sq;
    c.causal = true;
    Q8Problem p(c);
    p.v_descale.set(1, 300.0);
    for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2)) << sq;
  }
}

// The direct decode loop's rows widened to bf16 (cpu/decode/kv8_widen.h: bf16 queries, on CPUs
// with the bf16 dot products; e4m3 K rows from 4 rows per kv head, V rows and the other formats'
// from 8 or 12), each case also on the f32 FMAs (run_and_check): every format with the scale
// granularities, decode at 4, 6, 8, 12 and 16 rows per kv head and causal chunks of 6, 8, 12 and
// 18 rows (key blocks that cross the mask's boundary; e5m2 takes more than 12 rows packed), dense
// and paged caches, with and without the append, head dims with vector tails; shared latent
// caches; and large V factors, under which e4m3's widened V rows hold the read through f16's
// values.
TEST(Kvcache8bit, ManyRowsPerKvHeadOnWidenedRows) {
  struct Shape {
    int64_t hq, sq;  // with Hk = 2
  };
  const Shape shapes[] = {{16, 1}, {24, 1}, {32, 1}, {8, 2}, {8, 3},
                         {12, 3}, {8, 1},  {12, 1}, {4, 3}};
  const Scales all_scales[] = {Scales::kNone, Scales::kHead, Scales::kToken,
                               Scales::kTokenDescale};
  int64_t n = 0;
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8}) {
    for (const Shape& shape : shapes) {
      Q8Case c;
      c.kv_dtype = kv;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.scales = all_scales[n % 4];
      c.Hq = shape.hq;
      c.Hk = 2;
      c.Sq = shape.sq;
      c.causal = shape.sq > 1;
      c.D = n % 2 == 0 ? 72 : 64;
      c.Dv = n % 2 == 0 ? 40 : 64;
      c.capacity = 320;
      c.seqlens = {300, 190};
      c.page_size = n % 3 == 1 ? 16 : 0;
      c.S_new = n % 4 == 3 ? c.Sq : 0;
      c.seed = 500 + static_cast<uint64_t>(n++);
      Q8Problem p(c);
      for (anyattn_isa isa : supported_isas()) {
        for (int threads : {1, 2}) EXPECT_TRUE(run_and_check(&p, isa, threads));
      }
    }
  }
  // Shared latent caches of one kv head: decode at 12 and 16 rows (D 576, Dv 512, 64-key pages)
  // and a causal chunk of 3 positions at 4 query heads.
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8}) {
    for (int64_t shape = 0; shape < 3; ++shape) {
      Q8Case c;
      c.kv_dtype = kv;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.scales = all_scales[n % 4];
      c.shared_latent = true;
      c.Hk = 1;
      c.Hq = shape == 0 ? 12 : shape == 1 ? 16 : 4;
      c.Sq = shape == 2 ? 3 : 1;
      c.causal = shape == 2;
      c.D = shape == 1 ? 576 : 72;
      c.Dv = shape == 1 ? 512 : 40;
      c.capacity = 320;
      c.seqlens = {300, 190};
      c.page_size = shape == 1 ? 64 : 0;
      c.S_new = shape == 2 ? 3 : 0;
      c.seed = 500 + static_cast<uint64_t>(n++);
      Q8Problem p(c);
      for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2));
    }
  }
  for (int e : {12, 40}) {
    Q8Case c;
    c.dtype = ANYATTN_DTYPE_BF16;
    c.scales = Scales::kHead;
    c.Hq = 16;
    c.Hk = 2;
    c.D = c.Dv = 64;
    c.capacity = 320;
    c.seqlens = {300, 190};
    c.seed = 600 + static_cast<uint64_t>(e);
    Q8Problem p(c);
    p.v_descale.set(0, std::ldexp(1.0, e));
    p.v_descale.set(1, std::ldexp(1.0, e) * 1.5);
    for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2)) << e;
  }
}

// Queries the dot products must not take (kv8_query_unfit_for_dot) keep the f32 FMAs: in decode
// (Sq 1, rows widened to bf16) their kv head, in prefill (Sq 40, the packed path's bf16 pairs)
// their row. The second kv head's query rows hold, in one element or in all, values times 2^e,
// and its K descale is 2^-e times as large, so that the scores stay of order 1: 2^60 (taken),
// 2^64 and 2^70 (too large), 2^-70 (too small). Then every query row times 2^-120 against
// subnormal e4m3 codes and a K descale of 2^125: the products are f32 subnormals, which
// VDPBF16PS would flush while the true scores are of order 1 (and the packed path's read, whose
// factor is the descale times 2^8, must not overflow).
TEST(Kvcache8bit, WidenedRowsKeepUnfitQueriesOnTheFmas) {
  auto case_for = [](int32_t kv, uint64_t seed, int64_t sq) {
    Q8Case c;
    c.kv_dtype = kv;
    c.Sq = sq;
    c.dtype = ANYATTN_DTYPE_BF16;
    c.scales = Scales::kHead;
    c.Hq = 24;  // 12 rows per kv head: widened for each format
    c.Hk = 2;
    c.D = c.Dv = 64;
    c.capacity = 200;
    c.seqlens = {150, 90};
    c.seed = seed;
    return c;
  };
  // Query rows of kv heads from first_kv_head on, times 2^e (all elements or element 3).
  auto scale_queries = [](Q8Problem* p, int e, bool whole_row, int64_t first_kv_head) {
    const int64_t D = p->c.D;
    const int64_t group = p->c.Hq / p->c.Hk;
    const std::vector<double> q = p->q.values();
    for (size_t i = 0; i < q.size(); ++i) {
      const int64_t head = static_cast<int64_t>(i) / D % p->c.Hq;
      const bool scaled =
          head / group >= first_kv_head && (whole_row || static_cast<int64_t>(i) % D == 3);
      p->q.set(static_cast<int64_t>(i), scaled ? std::ldexp(q[i], e) : q[i]);
    }
  };
  for (int64_t sq : {1, 40}) {
    for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_I8}) {
      for (int e : {60, 64, 70, -70}) {
        for (bool whole_row : {true, false}) {
          // One element times 2^-70 leaves the other elements' scores times 2^70: the softmax of
          // 40 query rows then turns on f32 rounding, and the naive run no longer tracks the
          // reference (one decode row stays within it).
          if (sq > 1 && e < 0 && !whole_row) continue;
          Q8Problem p(case_for(kv, 700 + static_cast<uint64_t>(e + 100), sq));
          scale_queries(&p, e, whole_row, 1);
          p.k_descale.set(1, std::ldexp(p.k_descale.values()[1], -e));
          for (anyattn_isa isa : supported_isas()) {
            EXPECT_TRUE(run_and_check(&p, isa, 1))
                << "Sq=" << sq << " e=" << e << " whole_row=" << whole_row;
          }
        }
      }
    }
    Q8Problem p(case_for(ANYATTN_DTYPE_FP8_E4M3, 800, sq));
    for (size_t i = 0; i < p.k_cache.bytes.size(); ++i) {
      p.k_cache.bytes[i] = static_cast<uint8_t>(1 + i % 7 + (i % 3 == 0 ? 0x80 : 0));
    }
    p.k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
    p.k_descale.set(0, std::ldexp(1.0, 125));
    p.cache.k_descale = &p.k_descale.t;
    p.pristine = {p.k_cache.bytes, p.v_cache.bytes, p.k_scale.bytes, p.v_scale.bytes};
    scale_queries(&p, -120, true, 0);
    for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 1)) << sq;
  }
}

// The per-element test behind that choice, over every bf16 bit pattern, against its definition on
// the value: nonzero with |q| < 2^-64, |q| >= 2^64, or not finite.
TEST(Kvcache8bit, WidenedRowsUnfitQueryElementsOutsideTwoToTheMinus64To64) {
  int64_t unfit = 0;
  for (uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const float value = convert::bf16_to_f32(static_cast<uint16_t>(bits));
    const float magnitude = std::fabs(value);
    const bool expected = !std::isfinite(value) ||
                          (value != 0.f && (magnitude < std::ldexp(1.f, -64) ||
                                            magnitude >= std::ldexp(1.f, 64)));
    ASSERT_EQ(cpu::kv8_query_unfit_for_dot(static_cast<uint16_t>(bits)), expected)
        << "bits 0x" << std::hex << bits << " value " << value;
    unfit += expected;
  }
  // Per sign: 127 subnormals and the 62 * 128 normals below 2^-64 (exponent fields 1 to 62); the
  // 65 * 128 codes from 2^64 up (exponent fields 191 to 255: infinity and the NaNs among them).
  EXPECT_EQ(unfit, 2 * (127 + 62 * 128 + 65 * 128));
}

#if defined(__x86_64__) || defined(__i386__)
// A caller that set MXCSR.DAZ (denormals are zero) gets e4m3 subnormal codes read as their values
// all the same (the f32-bits read makes them f32 subnormals, and the loop clears DAZ while it runs;
// the read through f16 makes them normal f32 values), and gets DAZ back set.
TEST(Kvcache8bit, E4m3SubnormalCodesReadUnderCallersDenormalsAreZero) {
  constexpr unsigned kDenormalsAreZero = 1u << 6;
  for (int64_t sq : {1, 3}) {
    Q8Case c;
    c.Sq = sq;
    c.Hq = 8;
    c.Hk = 2;
    c.D = c.Dv = 64;
    c.capacity = 160;
    c.seqlens = {150, 90};
    Q8Problem p(c);
    // Every third byte a subnormal code, 0x01 .. 0x07 or 0x81 .. 0x87; the others moderate.
    for (size_t i = 0; i < p.k_cache.bytes.size(); ++i) {
      const uint8_t subnormal = static_cast<uint8_t>(1 + i % 7 + (i % 2 == 0 ? 0x80 : 0));
      if (i % 3 == 0) p.k_cache.bytes[i] = subnormal;
      if (i % 3 == 1) p.v_cache.bytes[i] = subnormal;
    }
    // Scales that make the subnormal values' products matter: their magnitudes are 2^-9 to 2^-6.
    p.k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
    p.v_descale = OwnedTensor(ANYATTN_DTYPE_F32, {1});
    p.k_descale.set(0, 8.0);
    p.v_descale.set(0, 4.0);
    p.cache.k_descale = &p.k_descale.t;
    p.cache.v_descale = &p.v_descale.t;
    p.pristine = {p.k_cache.bytes, p.v_cache.bytes, p.k_scale.bytes, p.v_scale.bytes};
    for (anyattn_isa isa : supported_isas()) {
      const unsigned caller = _mm_getcsr();
      _mm_setcsr(caller | kDenormalsAreZero);
      const ::testing::AssertionResult checked = run_and_check(&p, isa, 1);
      const unsigned after = _mm_getcsr();
      _mm_setcsr(caller);
      EXPECT_TRUE(checked) << "sq=" << sq;
      EXPECT_NE(after & kDenormalsAreZero, 0u) << anyattn_isa_name(isa);
    }
  }
}
#endif

// Head dims of 0: the rows without columns have no cache bytes, but their token scales are
// written (0, as for an all-zero row) and read.
TEST(Kvcache8bit, EmptyHeadDimsWriteZeroTokenScales) {
  for (int64_t empty : {0, 1}) {
    Q8Case c;
    c.kv_dtype = ANYATTN_DTYPE_I8;
    c.scales = Scales::kTokenDescale;
    c.S_new = 2;
    (empty == 0 ? c.D : c.Dv) = 0;
    Q8Problem p(c);
    for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2));
  }
}

// ---- anyattn_fwd_kvcache_varlen -----------------------------------------------------------------

TEST(Kvcache8bit, VarlenMixesDecodeAndPrefill) {
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_I8, ANYATTN_DTYPE_FP8_E5M2}) {
    for (int64_t page_size : {int64_t{0}, int64_t{16}, int64_t{-16}}) {
      Q8Case c;
      // A negative page size: that page size and a shared latent cache (V the first 24 columns).
      c.shared_latent = page_size < 0;
      page_size = std::abs(page_size);
      if (c.shared_latent) c.Dv = 24;
      c.kv_dtype = kv;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.scales = page_size == 0 || c.shared_latent ? Scales::kTokenDescale : Scales::kSeqHead;
      c.B = 3;
      c.seqlens = {40, 30, 70};
      c.page_size = page_size;
      c.leftpad = page_size == 0;
      c.Sq = 1;
      Q8Problem p(c);
      // Packed queries: sequence 0 decodes one row, 1 a prefill chunk of 9, 2 three rows.
      const std::vector<int32_t> lens = {1, 9, 3};
      const std::vector<int32_t> cu = {0, 1, 10, 13};
      const int64_t total = cu.back();
      CacheRng rng(77);
      OwnedTensor q(c.dtype, {total, c.Hq, c.D}), out(c.dtype, {total, c.Hq, c.Dv});
      OwnedTensor lse(ANYATTN_DTYPE_F32, {c.Hq, total});
      q.fill_normal(&rng);
      const OwnedTensor cu_q = int_tensor(cu);
      anyattn_fwd_params params;
      anyattn_fwd_params_init(&params);
      params.causal = 1;
      // The reference: each sequence's queries against its dequantized keys.
      const reference::HeadShape shape{c.Hq, c.Hk, c.D, c.Dv};
      const reference::ScoreOptions options = reference::resolve_options(&params, c.D);
      std::vector<double> ref_out(static_cast<size_t>(total * c.Hq * c.Dv));
      std::vector<double> ref_lse(static_cast<size_t>(c.Hq * total));
      std::vector<double> naive_out(ref_out.size()), naive_lse(ref_lse.size());
      const std::vector<double> qv = q.values(), kv_values = p.k_cache.values();
      const std::vector<double> vv = p.v_cache.values();
      const std::vector<double> ks = p.k_scale.t.ndim > 0 ? p.k_scale.values() : std::vector<double>{};
      const std::vector<double> vs = p.v_scale.t.ndim > 0 ? p.v_scale.values() : std::vector<double>{};
      for (int64_t b = 0; b < c.B; ++b) {
        reference::GatheredSequence seq;
        const int64_t first = c.leftpad ? std::min<int32_t>(c.seqlens[b], 3 + 2 * b) : 0;
        seq.seqlen_q = lens[b];
        seq.seqlen_k = c.seqlens[b] - first;
        seq.q.assign(qv.begin() + cu[b] * c.Hq * c.D, qv.begin() + cu[b + 1] * c.Hq * c.D);
        for (int64_t position = first; position < c.seqlens[b]; ++position) {
          int64_t n = 0, r = 0;
          reference::cache_location(p.k_cache.t, p.cache, b, position, &n, &r);
          for (int64_t h = 0; h < c.Hk; ++h) {
            const int64_t slot = (n * p.rows1 + r) * c.Hk + h;
            double kf = reference::cache_descale(p.cache.k_descale, b, h);
            double vf = reference::cache_descale(p.cache.v_descale, b, h);
            if (!ks.empty()) {
              kf *= ks[slot];
              vf *= vs[slot];
            }
            if (c.shared_latent) vf = kf;  // V is the K row's prefix
            for (int64_t d = 0; d < c.D; ++d) seq.k.push_back(kv_values[slot * c.D + d] * kf);
            for (int64_t d = 0; d < c.Dv; ++d) seq.v.push_back(vv[slot * c.Dv + d] * vf);
          }
        }
        reference::attend_gathered(seq, shape, options, ref_out.data() + cu[b] * c.Hq * c.Dv,
                                   ref_lse.data() + cu[b], total);
        reference::GatheredSequence rounded = seq;
        for (double& x : rounded.q) x = round_to_dtype(c.dtype, x);
        naive_gathered(rounded, shape, options, c.dtype, 1.0f / std::sqrt(static_cast<float>(c.D)),
                       0.f, naive_out.data() + cu[b] * c.Hq * c.Dv, naive_lse.data() + cu[b],
                       total);
      }
      for (anyattn_isa isa : supported_isas()) {
        for (int threads : {1, 2}) {
          params.isa = isa;
          anyattn_set_num_threads(threads);
          const anyattn_status status = anyattn_fwd_kvcache_varlen(
              &q.t, &p.k_cache.t, &p.v_cache.t, &out.t, &lse.t, &cu_q.t, 9, &p.cache, &params);
          anyattn_set_num_threads(0);
          ASSERT_EQ(status, ANYATTN_OK) << anyattn_last_error();
          const std::vector<double> got_lse = lse.values();
          EXPECT_TRUE(check_two_x(c.dtype, out.values(), ref_out, naive_out,
                                  {total, c.Hq, c.Dv}, &got_lse, ref_lse, naive_lse,
                                  {c.Hq, total}))
              << c.describe() << " isa=" << anyattn_isa_name(isa) << " threads=" << threads;
          EXPECT_TRUE(p.cache_untouched());
        }
      }
    }
  }
}

// ---- Hostile scales and errors ------------------------------------------------------------------

// A small problem whose k_descale is (Hk) = (2) for the hostile values.
Q8Case hostile_case(int64_t S_new) {
  Q8Case c;
  c.scales = Scales::kHead;
  c.S_new = S_new;
  return c;
}

// Reading: a descale of 0 reads its kv head's values as 0, a subnormal one scales them; both are
// legal and agree with the reference.
TEST(Kvcache8bit, ZeroAndSubnormalDescalesReadAsScaled) {
  for (float value : {0.f, std::numeric_limits<float>::denorm_min(), 1e-40f}) {
    for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_I8}) {
      Q8Case c = hostile_case(0);
      c.kv_dtype = kv;
      Q8Problem p(c);
      p.k_descale.set(1, value);
      p.v_descale.set(0, value);
      for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2)) << value;
    }
  }
}

// With bf16 probabilities allowed, V's factor multiplies each probability before it is rounded to
// bf16, for factors 0 and in [2^-60, 2^60]; blocks with others (subnormal, tiny or huge
// descales) take the f32 products, where p times the factor would flush or the products
// overflow: in the packed path (bf16 q, 40 query rows per kv head) and in the direct decode loop
// (8 rows per kv head, several whole key blocks: V rows widened into the value pairs, which stay
// off for the rest of the task once a block's factors do not fit).
// Each agrees with the reference.
TEST(Kvcache8bit, FastPrecisionTakesValueFactorsOrTheF32Products) {
  for (float value : {0.f, std::numeric_limits<float>::denorm_min(), 1e-40f, 0x1.0p-61f,
                      0x1.0p-60f, 0x1.0p40f, 0x1.0p61f, 0x1.0p100f}) {
    for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_I8}) {
      for (bool decode : {false, true}) {
        Q8Case c = hostile_case(0);
        c.kv_dtype = kv;
        c.dtype = ANYATTN_DTYPE_BF16;
        c.Sq = decode ? 1 : 20;
        c.Hq = decode ? 16 : 4;
        c.Hk = 2;
        if (decode) {
          c.seqlens = {150, 200};
          c.capacity = 256;
        }
        Q8Problem p(c);
        p.params.precision = ANYATTN_PRECISION_FAST;
        // Both kv heads: the acceptance rule's eps follows the largest output.
        p.v_descale.set(0, value);
        p.v_descale.set(1, value);
        for (anyattn_isa isa : supported_isas()) {
          EXPECT_TRUE(run_and_check(&p, isa, 2)) << value << " " << c.describe();
        }
      }
    }
  }
}

// The decode loop's value pairs on widened rows (bf16 q; 4 and 16 rows per kv head for e4m3, 8
// and 16 for int8: the fewest that take them, and many; one V descale for both kv heads): a
// block whose factors, as multiplied into p, fit (value_factor_fits_pairs) rounds p times the
// factor to bf16, so fast and accurate outputs differ; one whose factors do not keeps the kv head
// on the f32 products for the rest of the task, the accurate call's code, so the two agree to the
// bit, on every path. int8's factor is its descale; e4m3's takes the
// power of two of its read (KeyScales), so only descales that fit, or not, under both e4m3 reads
// are listed for it. The avx512 path has the widened rows and the value pairs where the CPU has
// AVX512_VBMI and the bf16 dot products.
TEST(Kvcache8bit, FastDecodeValuePairsOnlyForFittingFactors) {
  struct Factor {
    int32_t kv;
    float descale;
    bool fits;
  };
  const Factor factors[] = {
      {ANYATTN_DTYPE_I8, 1e-40f, false},         {ANYATTN_DTYPE_I8, 0x1.0p-61f, false},
      {ANYATTN_DTYPE_I8, 0x1.0p-60f, true},      {ANYATTN_DTYPE_I8, 0x1.0p-3f, true},
      {ANYATTN_DTYPE_I8, 0x1.0p60f, true},       {ANYATTN_DTYPE_I8, 0x1.0p61f, false},
      {ANYATTN_DTYPE_I8, 0x1.0p100f, false},     {ANYATTN_DTYPE_FP8_E4M3, 1e-40f, false},
      {ANYATTN_DTYPE_FP8_E4M3, 0x1.0p-100f, false}, {ANYATTN_DTYPE_FP8_E4M3, 0x1.0p-3f, true},
      {ANYATTN_DTYPE_FP8_E4M3, 0x1.0p20f, true}};
  const bool pairs = cpu::kv8_widening_available() && cpu::bf16_dot_scores_available();
  for (const Factor& factor : factors) {
    for (int64_t hq : {factor.kv == ANYATTN_DTYPE_FP8_E4M3 ? 8 : 16, 32}) {
      Q8Case c = hostile_case(0);
      c.kv_dtype = factor.kv;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.Hq = hq;
      c.seqlens = {150, 200};
      c.capacity = 256;
      Q8Problem p(c);
      p.v_descale.set(0, factor.descale);
      p.v_descale.set(1, factor.descale);
      for (anyattn_isa isa : supported_isas()) {
        std::vector<unsigned char> out[2];
        for (anyattn_precision precision :
             {ANYATTN_PRECISION_ACCURATE, ANYATTN_PRECISION_FAST}) {
          p.restore();
          p.params.isa = isa;
          p.params.precision = precision;
          ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
          out[precision == ANYATTN_PRECISION_FAST] = p.out.bytes;
        }
        const std::string where =
            std::to_string(factor.descale) + " " + c.describe() + " " + anyattn_isa_name(isa);
        if (!factor.fits) {
          EXPECT_EQ(out[0], out[1]) << where;
        } else if (pairs && isa == ANYATTN_ISA_AVX512) {
          EXPECT_NE(out[0], out[1]) << where;
        }
      }
    }
  }
}

// Descales passed as broadcast views, as FA3's callers expand one scale to (B, Hk): k_descale
// with strides (0, 0) (every entry the first value), v_descale with strides (0, 1) (every row
// the first row). They read and append as the contiguous (B, Hk) tensors of the same entries,
// to the bit, and against the reference.
TEST(Kvcache8bit, BroadcastDescalesReadAsTheirEntries) {
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_I8}) {
    for (int64_t S_new : {0, 1}) {
      Q8Case c = hostile_case(S_new);
      c.kv_dtype = kv;
      c.scales = Scales::kSeqHead;
      Q8Problem broadcast(c);
      broadcast.k_descale.t.strides[0] = broadcast.k_descale.t.strides[1] = 0;
      broadcast.v_descale.t.strides[0] = 0;
      for (anyattn_isa isa : supported_isas()) {
        EXPECT_TRUE(run_and_check(&broadcast, isa, 2)) << c.describe();
      }
      Q8Problem expanded(c);
      for (int64_t i = 0; i < c.B * c.Hk; ++i) {
        expanded.k_descale.set(i, broadcast.k_descale.values()[0]);
        expanded.v_descale.set(i, broadcast.v_descale.values()[i % c.Hk]);
      }
      broadcast.restore();
      expanded.restore();
      ASSERT_EQ(broadcast.run(), ANYATTN_OK) << anyattn_last_error();
      ASSERT_EQ(expanded.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_EQ(broadcast.out.bytes, expanded.out.bytes) << c.describe();
      EXPECT_EQ(broadcast.lse.bytes, expanded.lse.bytes) << c.describe();
      EXPECT_EQ(broadcast.k_cache.bytes, expanded.k_cache.bytes) << c.describe();
      EXPECT_EQ(broadcast.v_cache.bytes, expanded.v_cache.bytes) << c.describe();
    }
  }
}

// Runs `p` expecting ANYATTN_E_INVALID_ARGUMENT with a message containing every part of `parts`,
// and nothing written.
void expect_rejected(Q8Problem* p, const std::vector<std::string>& parts) {
  p->restore();
  EXPECT_EQ(p->run(), ANYATTN_E_INVALID_ARGUMENT) << p->c.describe();
  const std::string message = anyattn_last_error();
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
  EXPECT_TRUE(p->untouched()) << message;
}

TEST(Kvcache8bit, NonFiniteAndNegativeDescalesAreRejected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t S_new : {0, 1}) {
    for (float value : {nan, inf, -inf, -1.f, -0.5f}) {
      Q8Problem p(hostile_case(S_new));
      p.k_descale.set(1, value);
      expect_rejected(&p, {"cache->k_descale[1]", "finite and >= 0"});
    }
  }
  Q8Case c = hostile_case(0);
  c.scales = Scales::kSeqHead;
  Q8Problem p(c);
  p.v_descale.set(3, nan);  // (B, Hk) = (2, 2): entry [1][1]
  expect_rejected(&p, {"cache->v_descale[1][1]", "nan"});
}

TEST(Kvcache8bit, AppendRejectsZeroAndSubnormalDescales) {
  for (float value : {0.f, -0.f, std::numeric_limits<float>::denorm_min(), 1e-39f}) {
    Q8Problem p(hostile_case(2));
    p.v_descale.set(0, value);
    expect_rejected(&p, {"cache->v_descale[0]", "normal positive"});
  }
}

TEST(Kvcache8bit, ScaleShapesAndDtypesAreChecked) {
  {
    Q8Problem p(hostile_case(0));
    p.k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {3});
    p.cache.k_descale = &p.k_descale.t;
    expect_rejected(&p, {"cache->k_descale.shape is (3)", "(1), (Hk) = (2) or (B, Hk) = (2, 2)"});
  }
  {
    Q8Problem p(hostile_case(0));
    p.k_descale = OwnedTensor(ANYATTN_DTYPE_F32, {2, 3});
    p.cache.k_descale = &p.k_descale.t;
    expect_rejected(&p, {"cache->k_descale.shape is (2, 3)"});
  }
  {
    Q8Problem p(hostile_case(0));
    p.v_descale = OwnedTensor(ANYATTN_DTYPE_F16, {2});
    p.cache.v_descale = &p.v_descale.t;
    expect_rejected(&p, {"cache->v_descale.dtype is f16", "supported: f32"});
  }
  {
    Q8Case c = hostile_case(0);
    c.scales = Scales::kToken;
    Q8Problem p(c);
    p.cache.v_token_scale = nullptr;
    expect_rejected(&p, {"k_token_scale and cache->v_token_scale must be given together"});
  }
  {
    Q8Case c = hostile_case(0);
    c.scales = Scales::kToken;
    Q8Problem p(c);
    p.v_scale = OwnedTensor(ANYATTN_DTYPE_F32, {p.rows0, p.rows1, 3});
    p.cache.v_token_scale = &p.v_scale.t;
    expect_rejected(&p, {"cache->v_token_scale.shape is", "Hk is 2"});
  }
  {
    Q8Case c = hostile_case(1);
    c.scales = Scales::kToken;
    Q8Problem p(c);
    p.k_scale.t.data = p.k_cache.t.data;  // overlaps the cache it scales
    p.k_scale.t.dtype = ANYATTN_DTYPE_F32;
    expect_rejected(&p, {"overlaps"});
  }
}

TEST(Kvcache8bit, DtypeRulesAreChecked) {
  {
    Q8Problem p(hostile_case(0));
    p.v_cache.t.dtype = ANYATTN_DTYPE_I8;
    expect_rejected(&p, {"v_cache.dtype is i8 but k_cache.dtype is fp8_e4m3",
                         "k_cache and v_cache share one dtype"});
  }
  {
    Q8Problem p(hostile_case(0));
    p.q.t.dtype = ANYATTN_DTYPE_FP8_E4M3;
    expect_rejected(&p, {"q.dtype is fp8_e4m3", "supported: f32, f16, bf16"});
  }
  {
    // Scales with a float cache.
    Q8Case c = hostile_case(0);
    c.kv_dtype = ANYATTN_DTYPE_F32;
    Q8Problem p(c);
    expect_rejected(&p, {"cache->k_descale is given but k_cache.dtype is f32",
                         "only to an 8-bit cache"});
  }
  {
    Q8Case c = hostile_case(1);
    Q8Problem p(c);
    p.k_new.t.dtype = ANYATTN_DTYPE_I8;
    expect_rejected(&p, {"cache->k_new.dtype is i8"});
  }
}

// Absorbed MLA's shared latent cache in 8 bits: v_cache (and v_new) the first Dv columns of
// k_cache (and k_new), V reading the K rows' stored values with K's scales. Every format and scale
// granularity, contiguous and paged, decode and prefill, with and without the append, at small
// head dims with vector tails and at the MLA dims (D = 576, Dv = 512) with 16 query heads (the
// direct decode loop) and 128 (packed blocks).
TEST(Kvcache8bit, SharedLatentCacheTakesTheKeyScales) {
  const Scales all_scales[] = {Scales::kNone,    Scales::kTensor, Scales::kHead,
                               Scales::kSeqHead, Scales::kToken,  Scales::kTokenDescale};
  int64_t n = 0;
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8}) {
    for (Scales scales : all_scales) {
      Q8Case c;
      c.kv_dtype = kv;
      const anyattn_dtype q_dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16, ANYATTN_DTYPE_F16};
      c.dtype = q_dtypes[n % 3];
      c.scales = scales;
      c.shared_latent = true;
      c.Hk = n % 2 == 0 ? 1 : 2;
      c.Hq = 8;
      c.D = 40;
      c.Dv = n % 4 == 0 ? 40 : 24;
      const int64_t pages[] = {0, 16, 5};
      c.page_size = pages[n % 3];
      c.Sq = n % 5 == 4 ? 20 : n % 5 == 2 ? 3 : 1;
      c.causal = c.Sq > 1;
      c.S_new = n % 2 == 0 ? c.Sq : 0;
      c.seed = static_cast<uint64_t>(n++) + 1;
      Q8Problem p(c);
      for (anyattn_isa isa : supported_isas()) {
        for (int threads : {1, 2}) EXPECT_TRUE(run_and_check(&p, isa, threads));
      }
    }
  }
  for (int32_t kv : {ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8}) {
    for (int64_t hq : {16, 128}) {
      Q8Case c;
      c.kv_dtype = kv;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.scales = hq == 16 ? Scales::kTokenDescale : Scales::kHead;
      c.shared_latent = true;
      c.Hq = hq;
      c.Hk = 1;
      c.D = 576;
      c.Dv = 512;
      c.seqlens = {70, 129};
      c.capacity = 144;
      c.page_size = hq == 16 ? 64 : 0;
      c.S_new = 1;
      c.seed = static_cast<uint64_t>(n++) + 1;
      Q8Problem p(c);
      for (anyattn_isa isa : supported_isas()) EXPECT_TRUE(run_and_check(&p, isa, 2));
    }
  }
}

// A shared latent cache's V takes K's scales: a v_descale of other values, a v_token_scale other
// than k_token_scale itself (a malformed one included), or one without k_token_scale is rejected
// before anything is written.
TEST(Kvcache8bit, SharedLatentCacheRejectsScalesOfItsOwnForV) {
  auto latent = [](Scales scales) {
    Q8Case c;
    c.Hk = 1;
    c.D = 32;
    c.Dv = 16;
    c.scales = scales;
    c.shared_latent = true;
    c.S_new = 1;
    c.seed = 3;  // odd: v_descale given, as a copy of k_descale
    return c;
  };
  {
    Q8Problem p(latent(Scales::kHead));
    p.v_descale.set(0, 0.5);
    p.cache.v_descale = &p.v_descale.t;
    expect_rejected(&p, {"cache->v_descale is 0.5 but cache->k_descale is", "shared latent"});
  }
  {
    Q8Problem p(latent(Scales::kToken));
    p.cache.v_token_scale = &p.v_scale.t;
    expect_rejected(&p, {"cache->v_token_scale is not cache->k_token_scale"});
  }
  {
    Q8Problem p(latent(Scales::kToken));
    p.cache.v_token_scale = &p.k_scale.t;
    p.cache.k_token_scale = nullptr;
    expect_rejected(&p, {"cache->v_token_scale is given without cache->k_token_scale"});
  }
  {
    // Two descriptors of rank 100: compared before the descriptors are checked, without
    // reading past their shapes.
    Q8Problem p(latent(Scales::kToken));
    anyattn_tensor bad_k = p.k_scale.t, bad_v = p.k_scale.t;
    bad_k.ndim = bad_v.ndim = 100;
    p.cache.k_token_scale = &bad_k;
    p.cache.v_token_scale = &bad_v;
    expect_rejected(&p, {"cache->v_token_scale is not cache->k_token_scale"});
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
