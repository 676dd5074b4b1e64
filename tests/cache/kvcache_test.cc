// anyattn_fwd_kvcache against the f64 reference (reference_cache.h) by the 2x rule
// (tests/README.md):
// contiguous and paged caches, cache_batch_idx, cache_seqlens as a tensor or a scalar,
// cache_leftpad, in-place append with and without rotary, every score option, num_splits, LSE;
// the largest head dims (D = 576, Dv = 512) with append and rotary, and the shared latent cache
// of absorbed MLA (Hk = 1, v_cache a column view of k_cache, v_new of k_new): decode and a few
// causal queries, contiguous and paged, f32 and bf16, 16 and 128 query heads, with and without
// an append. Every call also checks the cache: the appended rows hold exactly the (rotated) new keys and
// values, and no other byte of either cache changed. Then the error paths of issue 5 item 5, each
// checking that neither the cache nor out was touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "cache/cache_test_support.h"
#include "reference/reference_cache.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

constexpr double kSentinel = -768.0;

struct KvCase {
  int64_t B = 3, Sq = 1, Hq = 4, Hk = 2, D = 32, Dv = 32;
  std::vector<int32_t> seqlens = {17, 0, 40};  // Keys already cached, per sequence.
  bool scalar_seqlen = false;  // cache->cache_seqlen = seqlens[0] instead of a tensor.
  bool whole_cache = false;    // cache->cache_seqlen = -1 (contiguous only).
  int64_t S_new = 0;
  int64_t capacity = 64;         // Positions per sequence: S_cache, or max_blocks * page_size.
  int64_t page_size = 0;         // 0: contiguous cache.
  bool batch_idx = false;        // Contiguous: B_cache = B + 2 and a permuted cache_batch_idx.
  std::vector<int32_t> leftpad;  // Empty: none.
  int64_t rotary_dim = 0;
  bool interleaved = false;
  anyattn_dtype rotary_dtype = ANYATTN_DTYPE_F32;
  int64_t rotary_positions = 0;  // 0: capacity + 8.
  anyattn_dtype dtype = ANYATTN_DTYPE_F32;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;
  bool with_lse = true;
  int32_t num_splits = 0;
  uint64_t seed = 1;
  // The shared latent cache of absorbed MLA: v_cache is the first Dv columns of k_cache (same
  // data and strides), v_new likewise of k_new. Needs Dv <= D.
  bool shared_latent = false;

  std::string describe() const {
    std::string s = "B=" + std::to_string(B) + " Sq=" + std::to_string(Sq) +
                    " Hq=" + std::to_string(Hq) + " Hk=" + std::to_string(Hk) +
                    " D=" + std::to_string(D) + " Dv=" + std::to_string(Dv) + " seqlens=[";
    for (int32_t l : seqlens) s += std::to_string(l) + ",";
    s += "] scalar=" + std::to_string(scalar_seqlen) + " S_new=" + std::to_string(S_new) +
         " capacity=" + std::to_string(capacity) + " page=" + std::to_string(page_size) +
         " batch_idx=" + std::to_string(batch_idx) +
         " leftpad=" + std::to_string(!leftpad.empty()) + " rotary=" + std::to_string(rotary_dim) +
         (interleaved ? "i" : "") + " " + dtype_name(dtype) + " causal=" + std::to_string(causal) +
         " window=(" + std::to_string(window_left) + "," + std::to_string(window_right) +
         ") softcap=" + std::to_string(softcap) +
         " alibi=" + std::to_string(static_cast<int>(alibi)) + " sinks=" + std::to_string(sinks) +
         " splits=" + std::to_string(num_splits) + (shared_latent ? " shared_latent" : "");
    return s;
  }
};

// A KV-cache problem with owned buffers. The cache holds normal values at every position a
// sequence has stored, and NaN everywhere else (unused pages, positions past the stored keys or
// before the left padding), so a read of an unused slot shows.
struct KvProblem {
  explicit KvProblem(const KvCase& c) : c(c) {
    CacheRng rng(c.seed);
    const bool paged = c.page_size > 0;
    const int64_t max_blocks = paged ? (c.capacity + c.page_size - 1) / c.page_size : 0;
    const int64_t rows0 = paged ? c.B * max_blocks + 3 : (c.batch_idx ? c.B + 2 : c.B);
    const int64_t rows1 = paged ? c.page_size : c.capacity;
    q = OwnedTensor(c.dtype, {c.B, c.Sq, c.Hq, c.D});
    q.fill_normal(&rng);
    k_cache = OwnedTensor(c.dtype, {rows0, rows1, c.Hk, c.D});
    v_cache = OwnedTensor(c.dtype, {rows0, rows1, c.Hk, c.Dv});
    anyattn_kvcache_params_init(&cache);
    if (paged) {
      // Pages of all sequences shuffled together, three never used.
      std::vector<int32_t> pages(static_cast<size_t>(rows0));
      std::iota(pages.begin(), pages.end(), 0);
      for (size_t i = pages.size(); i > 1; --i) std::swap(pages[i - 1], pages[rng.below(i)]);
      block_table = OwnedTensor(ANYATTN_DTYPE_I32, {c.B, max_blocks});
      for (int64_t i = 0; i < c.B * max_blocks; ++i) block_table.set(i, pages[i]);
      cache.block_table = &block_table.t;
    } else if (c.batch_idx) {
      std::vector<int32_t> rows(static_cast<size_t>(rows0));
      std::iota(rows.begin(), rows.end(), 0);
      for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[rng.below(i)]);
      rows.resize(static_cast<size_t>(c.B));
      batch_idx = int_tensor(rows);
      cache.cache_batch_idx = &batch_idx.t;
    }
    std::vector<int32_t> stored = c.seqlens;
    if (c.whole_cache)
      stored.assign(static_cast<size_t>(c.B), static_cast<int32_t>(c.capacity - c.S_new));
    if (c.scalar_seqlen) stored.assign(static_cast<size_t>(c.B), c.seqlens[0]);
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t first = c.leftpad.empty() ? 0 : c.leftpad[b];
      for (int64_t position = first; position < std::min<int64_t>(stored[b], c.capacity);
           ++position) {
        int64_t n = 0, r = 0;
        reference::cache_location(k_cache.t, cache, b, position, &n, &r);
        for (int64_t x = 0; x < c.Hk * c.D; ++x)
          k_cache.set((n * rows1 + r) * c.Hk * c.D + x, rng.normal());
        for (int64_t x = 0; x < c.Hk * c.Dv; ++x)
          v_cache.set((n * rows1 + r) * c.Hk * c.Dv + x, rng.normal());
      }
    }
    if (c.whole_cache) {
      cache.cache_seqlen = -1;
    } else if (c.scalar_seqlen) {
      cache.cache_seqlen = c.seqlens[0];
    } else {
      cache_seqlens = int_tensor(c.seqlens);
      cache.cache_seqlens = &cache_seqlens.t;
    }
    if (!c.leftpad.empty()) {
      leftpad = int_tensor(c.leftpad);
      cache.cache_leftpad = &leftpad.t;
    }
    if (c.S_new > 0) {
      k_new = OwnedTensor(c.dtype, {c.B, c.S_new, c.Hk, c.D});
      v_new = OwnedTensor(c.dtype, {c.B, c.S_new, c.Hk, c.Dv});
      k_new.fill_normal(&rng);
      v_new.fill_normal(&rng);
      cache.k_new = &k_new.t;
      cache.v_new = &v_new.t;
    }
    if (c.rotary_dim > 0) {
      const int64_t positions = c.rotary_positions > 0 ? c.rotary_positions : c.capacity + 8;
      const int64_t half = c.rotary_dim / 2;
      rotary_cos = OwnedTensor(c.rotary_dtype, {positions, half});
      rotary_sin = OwnedTensor(c.rotary_dtype, {positions, half});
      for (int64_t p = 0; p < positions; ++p) {
        for (int64_t t = 0; t < half; ++t) {
          const double angle = p * std::pow(10000.0, -2.0 * t / c.rotary_dim);
          rotary_cos.set(p * half + t, std::cos(angle));
          rotary_sin.set(p * half + t, std::sin(angle));
        }
      }
      cache.rotary_cos = &rotary_cos.t;
      cache.rotary_sin = &rotary_sin.t;
      cache.rotary_interleaved = c.interleaved;
    }
    if (c.shared_latent) {
      // v_cache's and v_new's own buffers stay allocated (and unchanged: untouched() and
      // check_cache compare them), but the call and the reference see the views.
      v_cache.t = k_cache.t;
      v_cache.t.shape[3] = c.Dv;
      if (c.S_new > 0) {
        v_new.t = k_new.t;
        v_new.t.shape[3] = c.Dv;
      }
    }
    out = OwnedTensor(c.dtype, {c.B, c.Sq, c.Hq, c.Dv});
    lse = OwnedTensor(ANYATTN_DTYPE_F32, {c.B, c.Hq, c.Sq});
    out.fill(kSentinel);
    lse.fill(kSentinel);
    k_before = k_cache.bytes;
    v_before = v_cache.bytes;
    out_before = out.bytes;
    lse_before = lse.bytes;

    anyattn_fwd_params_init(&params);
    params.causal = c.causal;
    params.window_left = c.window_left;
    params.window_right = c.window_right;
    params.softcap = c.softcap;
    params.num_splits = c.num_splits;
    if (c.alibi != Alibi::kNone) {
      alibi = c.alibi == Alibi::kPerBatchHead ? OwnedTensor(ANYATTN_DTYPE_F32, {c.B, c.Hq})
                                              : OwnedTensor(ANYATTN_DTYPE_F32, {c.Hq});
      for (int64_t i = 0; i < alibi.size(); ++i) {
        alibi.set(i, std::exp2(-8.0 * (i % c.Hq + 1) / c.Hq) * (1.0 + 0.5 * (i / c.Hq)));
      }
      params.alibi_slopes = &alibi.t;
    }
    if (c.sinks) {
      sinks = OwnedTensor(ANYATTN_DTYPE_F32, {c.Hq});
      sinks.fill_normal(&rng, 2.0);
      params.sinks = &sinks.t;
    }
  }
  KvProblem(const KvProblem&) = delete;

  anyattn_status run() {
    return anyattn_fwd_kvcache(&q.t, &k_cache.t, &v_cache.t, &out.t, c.with_lse ? &lse.t : nullptr,
                               &cache, &params);
  }
  bool untouched() const {
    return k_cache.bytes == k_before && v_cache.bytes == v_before && out.bytes == out_before &&
           lse.bytes == lse_before;
  }

  KvCase c;
  OwnedTensor q, k_cache, v_cache, k_new, v_new, out, lse, block_table, batch_idx, cache_seqlens,
      leftpad, rotary_cos, rotary_sin, alibi, sinks;
  std::vector<unsigned char> k_before, v_before, out_before, lse_before;
  anyattn_kvcache_params cache{};
  anyattn_fwd_params params{};
};

// The unit roundoff of a dtype.
double unit_roundoff(anyattn_dtype dtype) {
  return dtype == ANYATTN_DTYPE_F32 ? 0x1.0p-24 : dtype == ANYATTN_DTYPE_F16 ? 0x1.0p-11 : 0x1.0p-8;
}

// The cache after the call: appended rows equal the new values (v and the unrotated part of k
// bit for bit; the rotated part of k within one rounding of the f64 rotation, i.e. within
// (u_dtype + 2^-22) (|x_a| + |x_b|) of it), and every other byte of both buffers unchanged.
::testing::AssertionResult check_cache(const KvProblem& p, const reference::KvcacheOutputs& ref) {
  const KvCase& c = p.c;
  const int64_t rows1 = p.k_cache.t.shape[1];
  std::vector<unsigned char> k_masked = p.k_cache.bytes, v_masked = p.v_cache.bytes;
  const std::vector<double> k_got = p.k_cache.values(), v_got = p.v_cache.values();
  const std::vector<double> k_new = c.S_new > 0 ? p.k_new.values() : std::vector<double>();
  const double tol_scale = unit_roundoff(c.dtype) + 0x1.0p-22;
  const int64_t half = c.rotary_dim / 2;
  for (size_t a = 0; a < ref.appended_rows.size() / 2; ++a) {
    const int64_t n = ref.appended_rows[2 * a], r = ref.appended_rows[2 * a + 1];
    const int64_t b = static_cast<int64_t>(a) / c.S_new, t = static_cast<int64_t>(a) % c.S_new;
    for (int64_t h = 0; h < c.Hk; ++h) {
      const int64_t k_row = ((n * rows1 + r) * c.Hk + h) * c.D;
      const int64_t new_row = ((b * c.S_new + t) * c.Hk + h) * c.D;
      for (int64_t d = 0; d < c.D; ++d) {
        const double got = k_got[k_row + d], want = ref.k_cache[k_row + d];
        double tol = 0.0;
        if (d < c.rotary_dim) {
          const int64_t partner = c.interleaved ? (d ^ 1) : (d < half ? d + half : d - half);
          tol = tol_scale * (std::fabs(k_new[new_row + d]) + std::fabs(k_new[new_row + partner]));
        }
        if (!(std::fabs(got - want) <= tol)) {
          return ::testing::AssertionFailure()
                 << "k_cache[" << n << "][" << r << "][" << h << "][" << d << "] = " << got
                 << ", expected " << want << " (tolerance " << tol << ") for new key (" << b << ","
                 << t << ")\n  " << c.describe();
        }
      }
      const int64_t v_row = ((n * rows1 + r) * c.Hk + h) * c.Dv;
      for (int64_t d = 0; d < c.Dv; ++d) {
        if (v_got[v_row + d] != ref.v_cache[v_row + d]) {
          return ::testing::AssertionFailure() << "v_cache[" << n << "][" << r << "][" << h << "]["
                                               << d << "] = " << v_got[v_row + d] << ", expected "
                                               << ref.v_cache[v_row + d] << "\n  " << c.describe();
        }
      }
      const int64_t es = dtype_size(c.dtype);
      std::memcpy(&k_masked[k_row * es], &p.k_before[k_row * es], c.D * es);
      std::memcpy(&v_masked[v_row * es], &p.v_before[v_row * es], c.Dv * es);
    }
  }
  if (k_masked != p.k_before || v_masked != p.v_before) {
    return ::testing::AssertionFailure()
           << "a cache byte outside the appended rows changed\n  " << c.describe();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult run_and_check_kv(const KvCase& c) {
  KvProblem p(c);
  // The reference and naive read the cache before the library appends to it.
  const reference::KvcacheOutputs ref =
      reference::fwd_kvcache(p.q.t, p.k_cache.t, p.v_cache.t, p.cache, &p.params);
  const reference::KvcacheInputs naive_in = reference::gather_kvcache(
      p.q.t, p.k_cache.t, p.v_cache.t, p.cache, &p.params, reference::Rounding::kLikeInputDtype);
  const anyattn_status status = p.run();
  if (status != ANYATTN_OK) {
    return ::testing::AssertionFailure() << "anyattn_fwd_kvcache: " << anyattn_status_name(status)
                                         << ": " << anyattn_last_error() << "\n  " << c.describe();
  }
  const reference::HeadShape shape{c.Hq, c.Hk, c.D, c.Dv};
  const reference::ScoreOptions options = reference::resolve_options(&p.params, c.D);
  std::vector<double> naive_out(ref.out.size()), naive_lse(ref.lse.size());
  for (int64_t b = 0; b < c.B; ++b) {
    naive_gathered(naive_in.sequences[b], shape, options, c.dtype,
                   1.0f / std::sqrt(static_cast<float>(c.D)), c.softcap,
                   naive_out.data() + b * c.Sq * c.Hq * c.Dv, naive_lse.data() + b * c.Hq * c.Sq,
                   c.Sq);
  }
  const std::vector<double> got_lse = p.lse.values();
  ::testing::AssertionResult r =
      check_two_x(c.dtype, p.out.values(), ref.out, naive_out, {c.B, c.Sq, c.Hq, c.Dv},
                  c.with_lse ? &got_lse : nullptr, ref.lse, naive_lse, {c.B, c.Hq, c.Sq});
  if (r && !c.with_lse && p.lse.bytes != p.lse_before) {
    r = ::testing::AssertionFailure() << "lse written although not requested";
  }
  if (!r) return r << "\n  " << c.describe();
  return check_cache(p, ref);
}

// ---- Contiguous and paged caches ----------------------------------------------------------------

TEST(Kvcache, ContiguousDecodeAndPrefill) {
  for (int64_t sq : {1, 3, 8}) {
    for (bool causal : {false, true}) {
      KvCase c;
      c.Sq = sq;
      c.causal = causal;
      EXPECT_TRUE(run_and_check_kv(c));
    }
  }
}

TEST(Kvcache, CacheBatchIdx) {
  for (int64_t s_new : {0, 2}) {
    KvCase c;
    c.batch_idx = true;
    c.S_new = s_new;
    c.Sq = 2;
    c.causal = true;
    EXPECT_TRUE(run_and_check_kv(c));
  }
}

TEST(Kvcache, PagedPageSizes) {
  for (int64_t page : {1, 3, 7, 16, 256}) {
    for (int64_t s_new : {0, 5}) {
      KvCase c;
      c.page_size = page;
      c.capacity = page == 256 ? 512 : 70;
      c.seqlens = {17, 0, page == 256 ? 300 : 60};
      c.S_new = s_new;
      c.Sq = 2;
      c.causal = true;
      c.dtype = page == 7 ? ANYATTN_DTYPE_BF16 : ANYATTN_DTYPE_F32;
      EXPECT_TRUE(run_and_check_kv(c)) << "page_size=" << page;
    }
  }
}

TEST(Kvcache, ScalarSeqlen) {
  KvCase c;
  c.scalar_seqlen = true;
  c.seqlens = {30, 30, 30};
  c.S_new = 1;
  EXPECT_TRUE(run_and_check_kv(c));
  c.page_size = 16;
  EXPECT_TRUE(run_and_check_kv(c));
  KvCase whole;  // cache_seqlen -1: the whole cache (minus the new keys).
  whole.whole_cache = true;
  whole.S_new = 2;
  whole.seqlens = {0, 0, 0};
  whole.leftpad = {};
  EXPECT_TRUE(run_and_check_kv(whole));
}

TEST(Kvcache, Leftpad) {
  for (int64_t page : {0, 16, 5}) {
    for (int64_t s_new : {0, 3}) {
      for (bool causal : {false, true}) {
        KvCase c;
        c.page_size = page;
        c.seqlens = {17, 4, 40};
        c.leftpad = {5, 4, 33};  // Sequence 1 keeps only its new keys.
        c.S_new = s_new;
        c.Sq = 3;
        c.causal = causal;
        c.alibi = Alibi::kPerHead;  // Positions relative to the first unpadded key.
        EXPECT_TRUE(run_and_check_kv(c));
      }
    }
  }
}

// ---- Append and rotary --------------------------------------------------------------------------

TEST(Kvcache, AppendWithoutRotary) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16}) {
    for (int64_t s_new : {1, 4, 24}) {
      KvCase c;
      c.dtype = dtype;
      c.S_new = s_new;
      c.Sq = s_new;
      c.causal = true;
      EXPECT_TRUE(run_and_check_kv(c));
    }
  }
}

TEST(Kvcache, AppendWithRotary) {
  for (bool interleaved : {false, true}) {
    for (int64_t rotary_dim : {64, 32, 2}) {
      for (bool causal : {false, true}) {
        for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
          KvCase c;
          c.D = 64;
          c.Dv = 48;
          c.S_new = 3;
          c.Sq = 3;
          c.rotary_dim = rotary_dim;
          c.interleaved = interleaved;
          c.causal = causal;
          c.dtype = dtype;
          c.rotary_dtype = dtype;
          EXPECT_TRUE(run_and_check_kv(c));
        }
      }
    }
  }
}

// D = 576 and Dv = 512 (the limits) through every step of the call: append, rotary of q and of
// the new keys, contiguous and paged caches, decode and a few causal queries.
TEST(Kvcache, LargestHeadDimsWithAppendAndRotary) {
  for (int64_t page_size : {0, 16}) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
      KvCase c;
      c.B = 2;
      c.Hq = 4;
      c.Hk = 2;
      c.D = 576;
      c.Dv = 512;
      c.seqlens = {70, 9};
      c.capacity = 80;
      c.page_size = page_size;
      c.S_new = page_size > 0 ? 1 : 4;
      c.Sq = c.S_new;
      c.causal = true;
      c.rotary_dim = 64;
      c.dtype = dtype;
      c.rotary_dtype = dtype;
      EXPECT_TRUE(run_and_check_kv(c));
    }
  }
}

// Absorbed MLA decode: many query heads against one latent kv head (D = 576 = 512 latent + 64
// rotary dims), V the latent's first 512 columns, the cache passed as both k_cache and v_cache.
KvCase shared_latent_case(int64_t hq, int64_t sq, int64_t s_new, int64_t page_size,
                          anyattn_dtype dtype) {
  KvCase c;
  c.B = 2;
  c.Hq = hq;
  c.Hk = 1;
  c.D = 576;
  c.Dv = 512;
  c.Sq = sq;
  c.causal = sq > 1;
  c.S_new = s_new;
  c.seqlens = {70, 129};
  c.capacity = 144;
  c.page_size = page_size;
  c.dtype = dtype;
  c.shared_latent = true;
  return c;
}

TEST(Kvcache, SharedLatentCacheMla) {
  uint64_t seed = 1;
  for (int64_t page_size : {0, 16}) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
      for (int64_t sq : {1, 4}) {
        for (bool append : {false, true}) {
          KvCase c = shared_latent_case(16, sq, append ? sq : 0, page_size, dtype);
          c.seed = seed++;
          EXPECT_TRUE(run_and_check_kv(c));
        }
      }
    }
  }
  // 128 query heads (the packed path rather than streaming tasks), and a split key range.
  for (int64_t page_size : {0, 16}) {
    KvCase c = shared_latent_case(128, 1, 1, page_size, ANYATTN_DTYPE_BF16);
    c.seed = seed++;
    EXPECT_TRUE(run_and_check_kv(c));
  }
  KvCase split = shared_latent_case(16, 1, 1, 16, ANYATTN_DTYPE_F32);
  split.num_splits = 3;
  EXPECT_TRUE(run_and_check_kv(split));
}

TEST(Kvcache, RotaryWithWindowPagedAndLeftpad) {
  KvCase c;
  c.D = c.Dv = 64;
  c.rotary_dim = 48;
  c.interleaved = true;
  c.S_new = 2;
  c.Sq = 4;
  c.window_left = 5;
  c.window_right = 1;  // Windowed: q rotated per row.
  c.page_size = 16;
  c.leftpad = {3, 0, 10};
  c.dtype = ANYATTN_DTYPE_F16;
  c.rotary_dtype = ANYATTN_DTYPE_F32;
  EXPECT_TRUE(run_and_check_kv(c));
}

// ---- Score options, splits, LSE -----------------------------------------------------------------

TEST(Kvcache, ScoreOptions) {
  struct Feature {
    const char* name;
    void (*apply)(KvCase*);
  };
  const Feature features[] = {
      {"window", [](KvCase* c) { c->window_left = 9, c->window_right = 0; }},
      {"window_right", [](KvCase* c) { c->window_left = -1, c->window_right = 2; }},
      {"softcap", [](KvCase* c) { c->softcap = 2.0f; }},
      {"alibi_head", [](KvCase* c) { c->alibi = Alibi::kPerHead; }},
      {"alibi_batch_head", [](KvCase* c) { c->alibi = Alibi::kPerBatchHead; }},
      {"sinks", [](KvCase* c) { c->sinks = true; }},
      {"no_lse", [](KvCase* c) { c->with_lse = false; }},
      {"mqa", [](KvCase* c) { c->Hk = 1, c->Hq = 8; }},
      {"all",
       [](KvCase* c) {
         c->causal = true, c->window_left = 20, c->softcap = 5.0f, c->sinks = true;
         c->alibi = Alibi::kPerBatchHead, c->rotary_dim = 16;
       }},
  };
  for (int64_t page : {0, 16}) {
    for (const Feature& f : features) {
      KvCase c;
      c.Sq = 2;
      c.S_new = 2;
      c.page_size = page;
      f.apply(&c);
      EXPECT_TRUE(run_and_check_kv(c)) << f.name;
    }
  }
}

TEST(Kvcache, NumSplits) {
  for (int32_t splits : {1, 2, 5, 64}) {
    KvCase c;
    c.capacity = 600;
    c.seqlens = {511, 3, 257};
    c.S_new = 1;
    c.Hq = 8;
    c.Hk = 2;
    c.num_splits = splits;
    c.sinks = true;
    c.dtype = ANYATTN_DTYPE_BF16;
    EXPECT_TRUE(run_and_check_kv(c)) << "num_splits=" << splits;
    c.page_size = 16;
    EXPECT_TRUE(run_and_check_kv(c)) << "paged num_splits=" << splits;
  }
}

TEST(Kvcache, MoreQueriesThanKeys) {
  KvCase c;
  c.Sq = 5;
  c.seqlens = {0, 2, 1};
  c.S_new = 1;
  c.causal = true;  // Early rows of each sequence see no key: out 0, lse -inf.
  EXPECT_TRUE(run_and_check_kv(c));
  c.sinks = true;
  EXPECT_TRUE(run_and_check_kv(c));
}

// ---- Equivalences -------------------------------------------------------------------------------

TEST(Kvcache, PagedEqualsContiguousBitwise) {
  for (int64_t page : {1, 16, 7}) {
    KvCase c;
    c.Sq = 2;
    c.S_new = 2;
    c.causal = true;
    c.rotary_dim = 16;
    c.capacity = 112;
    c.seqlens = {17, 0, 100};
    KvProblem contiguous(c);
    c.page_size = page;
    KvProblem paged(c);
    // The same logical keys: copy each used position of the contiguous cache into its page.
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t position = 0; position < c.capacity; ++position) {
        int64_t n = 0, r = 0;
        reference::cache_location(paged.k_cache.t, paged.cache, b, position, &n, &r);
        const int64_t es = dtype_size(c.dtype);
        std::memcpy(&paged.k_cache.bytes[(n * page + r) * c.Hk * c.D * es],
                    &contiguous.k_cache.bytes[(b * c.capacity + position) * c.Hk * c.D * es],
                    c.Hk * c.D * es);
        std::memcpy(&paged.v_cache.bytes[(n * page + r) * c.Hk * c.Dv * es],
                    &contiguous.v_cache.bytes[(b * c.capacity + position) * c.Hk * c.Dv * es],
                    c.Hk * c.Dv * es);
      }
    }
    paged.q.bytes = contiguous.q.bytes;
    paged.k_new.bytes = contiguous.k_new.bytes;
    paged.v_new.bytes = contiguous.v_new.bytes;
    ASSERT_EQ(contiguous.run(), ANYATTN_OK) << anyattn_last_error();
    ASSERT_EQ(paged.run(), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(contiguous.out.bytes == paged.out.bytes) << "page_size=" << page;
    EXPECT_TRUE(contiguous.lse.bytes == paged.lse.bytes) << "page_size=" << page;
  }
}

TEST(Kvcache, AppendThenAttendEqualsPrefilledCache) {
  for (int64_t page : {0, 16}) {
    KvCase c;
    c.Sq = 3;
    c.S_new = 3;
    c.causal = true;
    c.page_size = page;
    c.seqlens = {17, 0, 40};
    KvProblem append(c);
    ASSERT_EQ(append.run(), ANYATTN_OK) << anyattn_last_error();
    // The same call on the appended cache, with the lengths advanced and no new keys.
    KvProblem prefilled(c);
    prefilled.q.bytes = append.q.bytes;
    prefilled.k_cache.bytes = append.k_cache.bytes;
    prefilled.v_cache.bytes = append.v_cache.bytes;
    for (int64_t b = 0; b < c.B; ++b) prefilled.cache_seqlens.set(b, c.seqlens[b] + c.S_new);
    prefilled.cache.k_new = nullptr;
    prefilled.cache.v_new = nullptr;
    ASSERT_EQ(prefilled.run(), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(append.out.bytes == prefilled.out.bytes) << "page_size=" << page;
    EXPECT_TRUE(append.lse.bytes == prefilled.lse.bytes) << "page_size=" << page;
  }
}

// ---- Errors: each leaves the cache, out and lse untouched ---------------------------------------

void expect_error(KvProblem* p, const std::vector<std::string>& needles) {
  EXPECT_EQ(p->run(), ANYATTN_E_INVALID_ARGUMENT);
  const std::string message = anyattn_last_error();
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message \"" << message << "\" lacks \"" << needle << "\"";
  }
  EXPECT_TRUE(p->untouched()) << message;
}

KvCase appending_case() {
  KvCase c;
  c.S_new = 2;
  c.Sq = 2;
  c.causal = true;
  return c;
}

TEST(KvcacheErrors, BlockTableEntryOutsideCache) {
  KvCase c = appending_case();
  c.page_size = 16;
  for (int32_t bad : {-1, 0}) {
    KvProblem p(c);
    // The last sequence's last used page: earlier sequences are valid, so a partial append would
    // show.
    const int64_t num_blocks = p.k_cache.t.shape[0];
    const int32_t entry = bad < 0 ? -1 : static_cast<int32_t>(num_blocks);
    p.block_table.set(2 * p.block_table.t.shape[1] + 2, entry);  // Position 41 of sequence 2.
    expect_error(&p, {"block_table[2][2]", std::to_string(entry), "num_blocks"});
  }
}

TEST(KvcacheErrors, TwoSequencesAppendingIntoOneCacheRow) {
  KvCase c = appending_case();
  c.page_size = 16;
  c.seqlens = {17, 0, 33};  // Sequences 0 and 2 append at rows 1 and 2 of their page.
  KvProblem p(c);
  const int64_t columns = p.block_table.t.shape[1];
  const int32_t shared_page = static_cast<const int32_t*>(p.block_table.t.data)[0 * columns + 1];
  p.block_table.set(2 * columns + 2, shared_page);
  expect_error(&p, {"sequences 0 and 2", "both append", "page " + std::to_string(shared_page)});
}

TEST(KvcacheErrors, SeqlensPlusNewBeyondCapacity) {
  for (int64_t page : {0, 16}) {
    KvCase c = appending_case();
    c.page_size = page;
    c.seqlens = {17, 0, 63};  // 63 + 2 > 64.
    KvProblem p(c);
    expect_error(&p, {"sequence 2", "65", "64"});
  }
  KvCase scalar = appending_case();
  scalar.scalar_seqlen = true;
  scalar.seqlens = {63, 63, 63};
  KvProblem p(scalar);
  expect_error(&p, {"65", "64"});
}

TEST(KvcacheErrors, NegativeLengths) {
  KvCase c = appending_case();
  c.seqlens = {17, -1, 40};
  KvProblem p(c);
  expect_error(&p, {"cache_seqlens[1]", "-1"});
  KvCase scalar = appending_case();
  scalar.scalar_seqlen = true;
  scalar.seqlens = {-3, -3, -3};
  KvProblem ps(scalar);
  expect_error(&ps, {"cache_seqlen", "-3"});
  KvCase pad = appending_case();
  pad.leftpad = {0, 0, -2};
  KvProblem pp(pad);
  expect_error(&pp, {"cache_leftpad[2]", "-2"});
}

TEST(KvcacheErrors, LeftpadBeyondSeqlen) {
  KvCase c = appending_case();
  c.leftpad = {0, 1, 0};  // Sequence 1 has 0 keys cached.
  KvProblem p(c);
  expect_error(&p, {"cache_leftpad[1]", "1"});
}

TEST(KvcacheErrors, RotaryTableTooShort) {
  KvCase c = appending_case();
  c.rotary_dim = 16;
  c.rotary_positions = 42;  // Sequence 2 writes positions 40, 41 and reads q at 40, 41: fits.
  KvProblem fits(c);
  EXPECT_EQ(fits.run(), ANYATTN_OK) << anyattn_last_error();
  c.rotary_positions = 41;  // Position 41 is missing.
  KvProblem p(c);
  expect_error(&p, {"rotary_cos", "41", "sequence 2"});
  c.Sq = 4;  // Causal q rows at 40..43 need 44 positions even though only 2 keys are new.
  c.rotary_positions = 43;
  KvProblem pq(c);
  expect_error(&pq, {"rotary_cos", "43"});
}

TEST(KvcacheErrors, RotaryDimTooLarge) {
  KvCase c = appending_case();
  c.rotary_dim = 34;  // D is 32.
  KvProblem p(c);
  expect_error(&p, {"rotary_dim", "34"});
}

TEST(KvcacheErrors, CacheBatchIdx) {
  KvCase c = appending_case();
  c.batch_idx = true;
  KvProblem p(c);
  p.batch_idx.set(2, 5);  // B_cache is 5.
  expect_error(&p, {"cache_batch_idx[2]", "5"});
  KvProblem repeated(c);
  repeated.batch_idx.set(2, static_cast<const int32_t*>(repeated.batch_idx.t.data)[0]);
  expect_error(&repeated, {"cache_batch_idx", "repeats"});
}

TEST(KvcacheErrors, HeadDimsPastTheLimits) {
  KvCase c = appending_case();
  c.D = 577;
  KvProblem wide_k(c);
  expect_error(&wide_k, {"q.shape[3] (head dim D) is 577; supported: 0..576"});
  c.D = 32;
  c.Dv = 513;
  KvProblem wide_v(c);
  expect_error(&wide_v, {"v_cache.shape[3] (head dim Dv) is 513; supported: 0..512"});
}

// A shared latent cache appends each row once, from k_new: v_new must be the same view of k_new.
TEST(KvcacheErrors, SharedLatentCacheWithSeparateNewValues) {
  KvCase c = shared_latent_case(16, 1, 1, 16, ANYATTN_DTYPE_F32);
  KvProblem separate(c);
  separate.v_new = OwnedTensor(c.dtype, {c.B, c.S_new, c.Hk, c.Dv});  // not a view of k_new
  separate.cache.v_new = &separate.v_new.t;
  expect_error(&separate, {"cache->v_new must be the same view of cache->k_new"});
}

TEST(KvcacheErrors, SharedLatentCacheWithRotary) {
  KvCase c = shared_latent_case(16, 1, 1, 0, ANYATTN_DTYPE_F32);
  c.rotary_dim = 64;
  KvProblem p(c);
  EXPECT_EQ(p.run(), ANYATTN_E_UNSUPPORTED);
  const std::string message = anyattn_last_error();
  EXPECT_NE(message.find("rotary embedding with a shared latent cache"), std::string::npos)
      << message;
  EXPECT_TRUE(p.untouched()) << message;
}

// Caches that overlap other than as a column view (v_cache 64 columns into k_cache) would change
// each other when appended to: still rejected. So is an out that overlaps the shared cache.
TEST(KvcacheErrors, CachesOverlappingOtherwiseOrOutOverlappingTheCache) {
  KvCase c = shared_latent_case(16, 1, 1, 0, ANYATTN_DTYPE_F32);
  c.Dv = 256;
  KvProblem shifted(c);
  shifted.v_cache.t.data = static_cast<float*>(shifted.k_cache.t.data) + 64;
  expect_error(&shifted, {"k_cache overlaps v_cache"});
  KvProblem out_in_cache(shared_latent_case(1, 1, 0, 0, ANYATTN_DTYPE_F32));
  out_in_cache.out.t.data = out_in_cache.k_cache.t.data;
  expect_error(&out_in_cache, {"out overlaps k_cache"});
}

TEST(KvcacheErrors, OnlyOneOfKnewVnew) {
  KvProblem p(appending_case());
  p.cache.v_new = nullptr;
  expect_error(&p, {"k_new", "v_new"});
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
