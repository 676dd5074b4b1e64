// anyattn_fwd_kvcache_varlen (packed queries against a KV cache: flash-attn's paged varlen) against
// the f64 reference by the 2x rule (tests/README.md): each sequence gathered from the cache and
// attended on its own, for contiguous and paged caches, cache_batch_idx, cache_leftpad, every
// score option, num_splits and each ISA path. Then: bit-for-bit equality with anyattn_fwd_kvcache
// when every sequence has the same query count, and the error paths, each leaving out and lse
// untouched.
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

constexpr double kSentinel = -768.0;  // Exact in every dtype, far from any output.

struct KvVarlenCase {
  std::vector<int32_t> lens_q = {1, 7, 0, 3, 1};    // Query rows per sequence.
  std::vector<int32_t> seqlens = {40, 9, 5, 3, 0};  // Keys in the cache per sequence.
  std::vector<int32_t> leftpad;                     // Empty: none.
  int64_t page_size = 0;                            // 0: contiguous cache.
  bool batch_idx = false;      // Contiguous: B_cache = B + 2 and a permuted cache_batch_idx.
  bool scalar_seqlen = false;  // cache->cache_seqlen = seqlens[0] for every sequence.
  int64_t Hq = 4, Hk = 2, D = 32, Dv = 32;
  anyattn_dtype dtype = ANYATTN_DTYPE_F32;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;
  bool with_lse = true;
  int32_t lead_rows = 0, trail_rows = 0;  // q rows outside every sequence.
  int32_t num_splits = 0;
  anyattn_isa isa = ANYATTN_ISA_AUTO;
  uint64_t seed = 1;

  int64_t batch() const { return static_cast<int64_t>(lens_q.size()); }
  std::string describe() const {
    std::string s = "lens_q=[";
    for (int32_t l : lens_q) s += std::to_string(l) + ",";
    s += "] seqlens=[";
    for (int32_t l : seqlens) s += std::to_string(l) + ",";
    s += "] leftpad=" + std::to_string(!leftpad.empty()) + " page=" + std::to_string(page_size) +
         " batch_idx=" + std::to_string(batch_idx) + " scalar=" + std::to_string(scalar_seqlen) +
         " Hq=" + std::to_string(Hq) + " Hk=" + std::to_string(Hk) + " D=" + std::to_string(D) +
         " Dv=" + std::to_string(Dv) + " " + dtype_name(dtype) +
         " causal=" + std::to_string(causal) + " window=(" + std::to_string(window_left) + "," +
         std::to_string(window_right) + ") softcap=" + std::to_string(softcap) +
         " alibi=" + std::to_string(static_cast<int>(alibi)) + " sinks=" + std::to_string(sinks) +
         " splits=" + std::to_string(num_splits) + " isa=" + anyattn_isa_name(isa);
    return s;
  }
};

// A problem with owned buffers. Cache positions a sequence does not use (unused pages, positions
// past its keys or before its left padding) hold NaN, so a stray read shows in the output.
struct KvVarlenProblem {
  explicit KvVarlenProblem(const KvVarlenCase& c) : c(c) {
    CacheRng rng(c.seed);
    const int64_t batch = c.batch();
    std::vector<int32_t> stored = c.seqlens;
    if (c.scalar_seqlen) stored.assign(static_cast<size_t>(batch), c.seqlens[0]);
    const int64_t longest = stored.empty() ? 0 : *std::max_element(stored.begin(), stored.end());
    const bool paged = c.page_size > 0;
    const int64_t capacity = longest + 5;
    const int64_t max_blocks = paged ? (capacity + c.page_size - 1) / c.page_size : 0;
    const int64_t rows0 = paged ? batch * max_blocks + 3 : (c.batch_idx ? batch + 2 : batch);
    const int64_t rows1 = paged ? c.page_size : capacity;
    k_cache = OwnedTensor(c.dtype, {rows0, rows1, c.Hk, c.D});
    v_cache = OwnedTensor(c.dtype, {rows0, rows1, c.Hk, c.Dv});
    anyattn_kvcache_params_init(&cache);
    if (paged) {
      std::vector<int32_t> pages(static_cast<size_t>(rows0));
      std::iota(pages.begin(), pages.end(), 0);
      for (size_t i = pages.size(); i > 1; --i) std::swap(pages[i - 1], pages[rng.below(i)]);
      block_table = OwnedTensor(ANYATTN_DTYPE_I32, {batch, max_blocks});
      for (int64_t i = 0; i < batch * max_blocks; ++i) block_table.set(i, pages[i]);
      cache.block_table = &block_table.t;
    } else if (c.batch_idx) {
      std::vector<int32_t> rows(static_cast<size_t>(rows0));
      std::iota(rows.begin(), rows.end(), 0);
      for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[rng.below(i)]);
      rows.resize(static_cast<size_t>(batch));
      batch_idx = int_tensor(rows);
      cache.cache_batch_idx = &batch_idx.t;
    }
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t first = c.leftpad.empty() ? 0 : c.leftpad[b];
      for (int64_t position = first; position < stored[b]; ++position) {
        int64_t n = 0, r = 0;
        reference::cache_location(k_cache.t, cache, b, position, &n, &r);
        for (int64_t x = 0; x < c.Hk * c.D; ++x) {
          k_cache.set((n * rows1 + r) * c.Hk * c.D + x, rng.normal());
        }
        for (int64_t x = 0; x < c.Hk * c.Dv; ++x) {
          v_cache.set((n * rows1 + r) * c.Hk * c.Dv + x, rng.normal());
        }
      }
    }
    if (c.scalar_seqlen) {
      cache.cache_seqlen = c.seqlens[0];
    } else {
      cache_seqlens = int_tensor(c.seqlens);
      cache.cache_seqlens = &cache_seqlens.t;
    }
    if (!c.leftpad.empty()) {
      leftpad = int_tensor(c.leftpad);
      cache.cache_leftpad = &leftpad.t;
    }

    std::vector<int32_t> cu{c.lead_rows};
    for (int64_t b = 0; b < batch; ++b) cu.push_back(cu.back() + c.lens_q[b]);
    cu_q = cu;
    total_q = cu.back() + c.trail_rows;
    max_q = c.lens_q.empty() ? 0 : *std::max_element(c.lens_q.begin(), c.lens_q.end());
    cu_seqlens_q = int_tensor(cu);
    q = OwnedTensor(c.dtype, {total_q, c.Hq, c.D});
    q.fill_normal(&rng);
    out = OwnedTensor(c.dtype, {total_q, c.Hq, c.Dv});
    lse = OwnedTensor(ANYATTN_DTYPE_F32, {c.Hq, total_q});
    out.fill(kSentinel);
    lse.fill(kSentinel);
    out_before = out.bytes;
    lse_before = lse.bytes;

    anyattn_fwd_params_init(&params);
    params.causal = c.causal;
    params.window_left = c.window_left;
    params.window_right = c.window_right;
    params.softcap = c.softcap;
    params.num_splits = c.num_splits;
    params.isa = c.isa;
    if (c.alibi != Alibi::kNone) {
      alibi = c.alibi == Alibi::kPerBatchHead ? OwnedTensor(ANYATTN_DTYPE_F32, {batch, c.Hq})
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
  KvVarlenProblem(const KvVarlenProblem&) = delete;

  anyattn_status run() {
    return anyattn_fwd_kvcache_varlen(&q.t, &k_cache.t, &v_cache.t, &out.t,
                                      c.with_lse ? &lse.t : nullptr, &cu_seqlens_q.t, max_q, &cache,
                                      &params);
  }
  bool outputs_untouched() const { return out.bytes == out_before && lse.bytes == lse_before; }

  // Sequence b as the reference sees it: its q rows, and the keys of cache positions
  // [leftpad_b, cache_seqlens[b]) read through the block table or batch index.
  reference::GatheredSequence gather(int64_t b) const {
    reference::GatheredSequence seq;
    const std::vector<double> qv = q.values(), kv = k_cache.values(), vv = v_cache.values();
    const int64_t stored = c.scalar_seqlen ? c.seqlens[0] : c.seqlens[b];
    const int64_t first = c.leftpad.empty() ? 0 : c.leftpad[b];
    const int64_t rows1 = k_cache.t.shape[1];
    seq.seqlen_q = c.lens_q[b];
    seq.seqlen_k = stored - first;
    seq.q.assign(qv.begin() + cu_q[b] * c.Hq * c.D, qv.begin() + cu_q[b + 1] * c.Hq * c.D);
    for (int64_t position = first; position < stored; ++position) {
      int64_t n = 0, r = 0;
      reference::cache_location(k_cache.t, cache, b, position, &n, &r);
      const int64_t row = n * rows1 + r;
      seq.k.insert(seq.k.end(), kv.begin() + row * c.Hk * c.D, kv.begin() + (row + 1) * c.Hk * c.D);
      seq.v.insert(seq.v.end(), vv.begin() + row * c.Hk * c.Dv,
                   vv.begin() + (row + 1) * c.Hk * c.Dv);
    }
    if (c.alibi != Alibi::kNone) {
      const std::vector<double> slopes = alibi.values();
      const int64_t row = c.alibi == Alibi::kPerBatchHead ? b : 0;
      seq.alibi_slopes.assign(slopes.begin() + row * c.Hq, slopes.begin() + (row + 1) * c.Hq);
    }
    if (c.sinks) seq.sinks = sinks.values();
    return seq;
  }

  KvVarlenCase c;
  std::vector<int32_t> cu_q;
  int64_t total_q = 0, max_q = 0;
  OwnedTensor q, k_cache, v_cache, out, lse, cu_seqlens_q, block_table, batch_idx, cache_seqlens,
      leftpad, alibi, sinks;
  std::vector<unsigned char> out_before, lse_before;
  anyattn_kvcache_params cache{};
  anyattn_fwd_params params{};
};

::testing::AssertionResult run_and_check(const KvVarlenCase& c) {
  KvVarlenProblem p(c);
  const anyattn_status status = p.run();
  if (status != ANYATTN_OK) {
    return ::testing::AssertionFailure()
           << "anyattn_fwd_kvcache_varlen: " << anyattn_status_name(status) << ": "
           << anyattn_last_error() << "\n  " << c.describe();
  }
  const reference::HeadShape shape{c.Hq, c.Hk, c.D, c.Dv};
  const reference::ScoreOptions options = reference::resolve_options(&p.params, c.D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const int64_t out_row = c.Hq * c.Dv;
  std::vector<double> ref_out(p.total_q * out_row, 0.0), ref_lse(c.Hq * p.total_q, 0.0);
  std::vector<double> naive_out(ref_out.size(), 0.0), naive_lse(ref_lse.size(), 0.0);
  std::vector<char> in_sequence(static_cast<size_t>(p.total_q), 0);
  for (int64_t b = 0; b < c.batch(); ++b) {
    const reference::GatheredSequence seq = p.gather(b);
    const int64_t first = p.cu_q[b];
    reference::attend_gathered(seq, shape, options, ref_out.data() + first * out_row,
                               ref_lse.data() + first, p.total_q);
    naive_gathered(seq, shape, options, c.dtype, scale, c.softcap,
                   naive_out.data() + first * out_row, naive_lse.data() + first, p.total_q);
    std::fill(in_sequence.begin() + first, in_sequence.begin() + p.cu_q[b + 1], 1);
  }
  // Every output compacted to the rows inside a sequence.
  const std::vector<double> got_out = p.out.values(), got_lse = p.lse.values();
  std::vector<double> go, ro, no, gl, rl, nl;
  int64_t rows = 0;
  for (int64_t r = 0; r < p.total_q; ++r) {
    if (!in_sequence[r]) continue;
    ++rows;
    for (int64_t x = r * out_row; x < (r + 1) * out_row; ++x) {
      go.push_back(got_out[x]);
      ro.push_back(ref_out[x]);
      no.push_back(naive_out[x]);
    }
  }
  for (int64_t h = 0; h < c.Hq; ++h) {
    for (int64_t r = 0; r < p.total_q; ++r) {
      if (!in_sequence[r]) continue;
      gl.push_back(got_lse[h * p.total_q + r]);
      rl.push_back(ref_lse[h * p.total_q + r]);
      nl.push_back(naive_lse[h * p.total_q + r]);
    }
  }
  ::testing::AssertionResult r = check_two_x(c.dtype, go, ro, no, {rows, c.Hq, c.Dv},
                                             c.with_lse ? &gl : nullptr, rl, nl, {c.Hq, rows});
  if (r) {
    const int64_t out_changed = changed_outside(p.out.bytes, p.out_before, p.out.t, in_sequence,
                                                /*last_index=*/false);
    const int64_t lse_changed =
        c.with_lse ? changed_outside(p.lse.bytes, p.lse_before, p.lse.t, in_sequence, true)
                   : static_cast<int64_t>(p.lse.bytes != p.lse_before);
    if (out_changed != 0 || lse_changed != 0) {
      r = ::testing::AssertionFailure() << out_changed << " out bytes and " << lse_changed
                                        << " lse bytes written outside the sequences' rows";
    }
  }
  if (!r) r << "\n  " << c.describe();
  return r;
}

// ---- Layouts ------------------------------------------------------------------------------------

TEST(KvcacheVarlen, ContiguousPagedAndBatchIndex) {
  for (int64_t page : {0, 1, 5, 16, 256}) {
    for (bool causal : {false, true}) {
      KvVarlenCase c;
      c.page_size = page;
      c.causal = causal;
      EXPECT_TRUE(run_and_check(c));
    }
  }
  KvVarlenCase indexed;
  indexed.batch_idx = true;
  indexed.causal = true;
  EXPECT_TRUE(run_and_check(indexed));
}

// D = 576 and Dv = 512 (the limits), contiguous and paged, decode steps and a prefill chunk.
TEST(KvcacheVarlen, LargestHeadDims) {
  for (int64_t page : {0, 16}) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
      KvVarlenCase c;
      c.Hq = 4, c.Hk = 1, c.D = 576, c.Dv = 512;
      c.page_size = page;
      c.causal = true;
      c.dtype = dtype;
      EXPECT_TRUE(run_and_check(c));
    }
  }
}

TEST(KvcacheVarlen, ChunkedPrefillAmongDecodeSteps) {
  // One long prefill chunk (its queries the last 96 of 300 keys) among decode steps.
  KvVarlenCase c;
  c.lens_q = {1, 96, 1, 1, 2};
  c.seqlens = {70, 300, 1, 129, 64};
  c.page_size = 16;
  c.causal = true;
  c.lead_rows = 2;
  c.trail_rows = 3;
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16}) {
    c.dtype = dtype;
    EXPECT_TRUE(run_and_check(c));
  }
}

TEST(KvcacheVarlen, LeftpadAndScalarSeqlen) {
  KvVarlenCase c;
  c.leftpad = {5, 4, 0, 3, 0};  // Sequence 3 keeps no key: its rows are fully masked.
  c.causal = true;
  c.alibi = Alibi::kPerHead;  // Positions relative to the first unpadded key.
  EXPECT_TRUE(run_and_check(c));
  KvVarlenCase scalar;
  scalar.scalar_seqlen = true;
  scalar.seqlens = {33, 33, 33, 33, 33};
  scalar.page_size = 8;
  EXPECT_TRUE(run_and_check(scalar));
}

// ---- Score options, splits, ISA paths -----------------------------------------------------------

TEST(KvcacheVarlen, ScoreOptionsPerSequence) {
  struct Feature {
    const char* name;
    void (*apply)(KvVarlenCase*);
  };
  const Feature features[] = {
      {"window", [](KvVarlenCase* c) { c->window_left = 6, c->window_right = 2; }},
      {"causal_window", [](KvVarlenCase* c) { c->causal = true, c->window_left = 4; }},
      {"softcap", [](KvVarlenCase* c) { c->softcap = 1.5f; }},
      {"alibi_batch_head", [](KvVarlenCase* c) { c->alibi = Alibi::kPerBatchHead; }},
      {"sinks", [](KvVarlenCase* c) { c->sinks = true; }},
      {"no_lse", [](KvVarlenCase* c) { c->with_lse = false; }},
      {"gqa8_dv", [](KvVarlenCase* c) { c->Hq = 8, c->Hk = 1, c->D = 64, c->Dv = 40; }},
      {"all",
       [](KvVarlenCase* c) {
         c->causal = true, c->window_left = 12, c->softcap = 3.0f;
         c->alibi = Alibi::kPerBatchHead, c->sinks = true;
       }},
  };
  for (const Feature& f : features) {
    KvVarlenCase c;
    c.page_size = 4;
    f.apply(&c);
    c.seed = 3 + static_cast<uint64_t>(&f - features);
    EXPECT_TRUE(run_and_check(c)) << f.name;
  }
}

TEST(KvcacheVarlen, SplitsAndIsaPaths) {
  for (anyattn_isa isa : supported_isas()) {
    for (int32_t splits : {0, 1, 3}) {
      for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
        KvVarlenCase c;
        c.lens_q = {1, 4, 1};
        c.seqlens = {600, 200, 65};
        c.Hq = 8;
        c.Hk = 2;
        c.D = c.Dv = 128;
        c.page_size = 16;
        c.causal = true;
        c.num_splits = splits;
        c.isa = isa;
        c.dtype = dtype;
        EXPECT_TRUE(run_and_check(c));
      }
    }
  }
}

// ---- Against anyattn_fwd_kvcache ----------------------------------------------------------------

// With the same query count L for every sequence, packed q (B * L, Hq, D) is dense q (B, L, Hq, D)
// and the call is the same problem as anyattn_fwd_kvcache's: out and lse agree bit for bit.
TEST(KvcacheVarlen, EqualLengthsMatchDenseKvcacheBitForBit) {
  for (int32_t length : {1, 3}) {
    for (int64_t page : {0, 16}) {
      KvVarlenCase c;
      c.lens_q.assign(4, length);
      c.seqlens = {50, 7, 130, 2};
      c.page_size = page;
      c.causal = true;
      c.dtype = ANYATTN_DTYPE_BF16;
      KvVarlenProblem p(c);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const int64_t batch = c.batch();
      anyattn_tensor q4 = p.q.t, out4 = p.out.t;
      for (anyattn_tensor* t : {&q4, &out4}) {
        const int64_t heads = t->shape[1], dim = t->shape[2];
        t->ndim = 4;
        t->shape[0] = batch, t->shape[1] = length, t->shape[2] = heads, t->shape[3] = dim;
        t->strides[3] = 1, t->strides[2] = dim, t->strides[1] = heads * dim;
        t->strides[0] = length * heads * dim;
      }
      OwnedTensor dense_out(c.dtype, {batch, length, c.Hq, c.Dv});
      OwnedTensor dense_lse(ANYATTN_DTYPE_F32, {batch, c.Hq, length});
      out4.data = dense_out.bytes.data();
      ASSERT_EQ(anyattn_fwd_kvcache(&q4, &p.k_cache.t, &p.v_cache.t, &out4, &dense_lse.t, &p.cache,
                                    &p.params),
                ANYATTN_OK)
          << anyattn_last_error();
      EXPECT_EQ(std::memcmp(dense_out.bytes.data(), p.out.bytes.data(),
                            static_cast<size_t>(p.out.size() * 2)),
                0)
          << c.describe();
      const std::vector<double> packed = p.lse.values(), dense = dense_lse.values();
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < c.Hq; ++h) {
          for (int64_t i = 0; i < length; ++i) {
            EXPECT_EQ(packed[h * p.total_q + b * length + i], dense[(b * c.Hq + h) * length + i])
                << "b=" << b << " h=" << h << " i=" << i << " " << c.describe();
          }
        }
      }
    }
  }
}

// ---- Errors -------------------------------------------------------------------------------------

void expect_error(KvVarlenProblem* p, anyattn_status expected,
                  const std::vector<std::string>& needles) {
  const anyattn_status status = p->run();
  EXPECT_EQ(status, expected) << anyattn_status_name(status) << ": " << anyattn_last_error();
  const std::string message = anyattn_last_error();
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "error message lacks \"" << needle << "\": " << message;
  }
  EXPECT_TRUE(p->outputs_untouched()) << message;
}

TEST(KvcacheVarlenErrors, AppendAndRotaryAreUnsupported) {
  KvVarlenCase c;
  KvVarlenProblem p(c);
  OwnedTensor k_new(c.dtype, {c.batch(), 1, c.Hk, c.D}), v_new(c.dtype, {c.batch(), 1, c.Hk, c.Dv});
  p.cache.k_new = &k_new.t;
  p.cache.v_new = &v_new.t;
  expect_error(&p, ANYATTN_E_UNSUPPORTED, {"anyattn_fwd_kvcache_varlen", "cache->k_new"});
  KvVarlenProblem rotary(c);
  OwnedTensor table(ANYATTN_DTYPE_F32, {64, 8});
  rotary.cache.rotary_cos = &table.t;
  rotary.cache.rotary_sin = &table.t;
  expect_error(&rotary, ANYATTN_E_UNSUPPORTED, {"cache->rotary_cos"});
}

TEST(KvcacheVarlenErrors, CuSeqlensQ) {
  KvVarlenCase c;
  KvVarlenProblem decreasing(c);
  decreasing.cu_seqlens_q.set(2, 0);  // cu = {0, 1, 0, ...}
  expect_error(&decreasing, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_q", "non-decreasing"});
  KvVarlenProblem beyond(c);
  beyond.cu_seqlens_q.set(c.batch(), static_cast<double>(beyond.total_q + 1));
  expect_error(&beyond, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_q", "total_q"});
  KvVarlenProblem short_max(c);
  short_max.max_q = 6;  // Sequence 1 has 7 rows.
  expect_error(&short_max, ANYATTN_E_INVALID_ARGUMENT, {"max_seqlen_q", "6"});
  KvVarlenProblem missing(c);
  const anyattn_status status =
      anyattn_fwd_kvcache_varlen(&missing.q.t, &missing.k_cache.t, &missing.v_cache.t,
                                 &missing.out.t, nullptr, nullptr, 8, &missing.cache, nullptr);
  EXPECT_EQ(status, ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(anyattn_last_error()).find("cu_seqlens_q"), std::string::npos);
}

TEST(KvcacheVarlenErrors, CacheBounds) {
  KvVarlenCase c;
  c.page_size = 16;
  KvVarlenProblem page(c);
  page.block_table.set(0, 1000);  // Sequence 0's first page.
  expect_error(&page, ANYATTN_E_INVALID_ARGUMENT, {"block_table[0][0]", "1000"});
  KvVarlenProblem capacity(c);
  capacity.cache_seqlens.set(1, 4000);
  expect_error(&capacity, ANYATTN_E_INVALID_ARGUMENT, {"sequence 1", "4000"});
  KvVarlenProblem negative(c);
  negative.cache_seqlens.set(2, -1);
  expect_error(&negative, ANYATTN_E_INVALID_ARGUMENT, {"cache_seqlens[2]", "-1"});
}

TEST(KvcacheVarlenErrors, HeadDimsPastTheLimits) {
  KvVarlenCase c;
  c.D = 577;
  KvVarlenProblem wide_k(c);
  expect_error(&wide_k, ANYATTN_E_INVALID_ARGUMENT,
               {"q.shape[2] (head dim D) is 577; supported: 0..576"});
  c.D = 32;
  c.Dv = 513;
  KvVarlenProblem wide_v(c);
  expect_error(&wide_v, ANYATTN_E_INVALID_ARGUMENT,
               {"v_cache.shape[3] (head dim Dv) is 513; supported: 0..512"});
}

TEST(KvcacheVarlenErrors, Shapes) {
  KvVarlenCase c;
  KvVarlenProblem dense_q(c);
  dense_q.q.t.ndim = 4;  // (total_q, Hq, D, 1) read as 4-D
  dense_q.q.t.shape[3] = 1;
  dense_q.q.t.strides[3] = 1;
  expect_error(&dense_q, ANYATTN_E_INVALID_ARGUMENT, {"q", "(total_q, Hq, D)"});
  KvVarlenProblem lse(c);
  lse.lse.t.shape[1] -= 1;
  expect_error(&lse, ANYATTN_E_INVALID_ARGUMENT, {"lse.shape", "(Hq, total_q)"});
  KvVarlenProblem out(c);
  out.out.t.shape[2] = c.Dv - 1;
  expect_error(&out, ANYATTN_E_INVALID_ARGUMENT, {"out.shape", "(total_q, Hq, Dv)"});
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
