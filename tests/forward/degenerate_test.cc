// Empty and degenerate tensors on every entry point (docs/semantics.md, section 6): a batch,
// query length, head count or head dim of 0, keys of length 0, empty tensors with any strides.
// Outputs that have elements are pre-filled with a sentinel, so a missing write shows; ASan
// (scripts/test.sh) shows any read or write out of bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "anyattn/anyattn.h"

namespace anyattn {
namespace testing {
namespace {

constexpr float kSentinel = -768.f;
const float kMinusInf = -std::numeric_limits<float>::infinity();

// A contiguous f32 (or i32) descriptor over `buffer`; null data when the shape is empty.
template <typename T>
anyattn_tensor view(std::vector<T>& buffer, std::initializer_list<int64_t> shape) {
  const std::vector<int64_t> dims(shape);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n), T(kSentinel));
  anyattn_tensor t;
  const anyattn_dtype dtype = std::is_same<T, float>::value ? ANYATTN_DTYPE_F32 : ANYATTN_DTYPE_I32;
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, n == 0 ? nullptr : buffer.data(), dtype,
                                           static_cast<int32_t>(dims.size()), dims.data()),
            ANYATTN_OK);
  return t;
}

// Deterministic values in [-1, 1).
std::vector<float> values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / static_cast<float>(1 << 23) - 1.f;
  }
  return v;
}

anyattn_fwd_params defaults() {
  anyattn_fwd_params p;
  anyattn_fwd_params_init(&p);
  return p;
}

// Attention with every score 0 before ALiBi and the mask (D = 0), in f64: v (B, Sk, Hk, Dv)
// contiguous; returns out (B, Sq, Hq, Dv) and lse (B, Hq, Sq).
struct ZeroScoreCase {
  int64_t B, Sq, Sk, Hq, Hk, Dv;
  bool causal = false;
  std::vector<float> slopes, sinks;  // (Hq) or empty
};
void zero_score_attention(const ZeroScoreCase& c, const std::vector<float>& v,
                          std::vector<double>* out, std::vector<double>* lse) {
  out->assign(static_cast<size_t>(c.B * c.Sq * c.Hq * c.Dv), 0.0);
  lse->assign(static_cast<size_t>(c.B * c.Hq * c.Sq), 0.0);
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t g = h / (c.Hq / c.Hk);
      for (int64_t i = 0; i < c.Sq; ++i) {
        double den = c.sinks.empty() ? 0.0 : std::exp(static_cast<double>(c.sinks[h]));
        std::vector<double> acc(static_cast<size_t>(c.Dv), 0.0);
        for (int64_t j = 0; j < c.Sk; ++j) {
          if (c.causal && j > i + c.Sk - c.Sq) continue;
          const double s =
              c.slopes.empty() ? 0.0 : -c.slopes[h] * std::fabs(double(i + c.Sk - c.Sq - j));
          den += std::exp(s);
          for (int64_t d = 0; d < c.Dv; ++d) {
            acc[d] += std::exp(s) * v[((b * c.Sk + j) * c.Hk + g) * c.Dv + d];
          }
        }
        for (int64_t d = 0; d < c.Dv; ++d) {
          (*out)[((b * c.Sq + i) * c.Hq + h) * c.Dv + d] = den > 0 ? acc[d] / den : 0.0;
        }
        (*lse)[(b * c.Hq + h) * c.Sq + i] = std::log(den);
      }
    }
  }
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << "[" << i << "]";
    } else {
      EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << what << "[" << i << "]";
    }
  }
}

// ---- Dense forward ------------------------------------------------------------------------------

TEST(DegenerateFwd, ZeroHeadsGiveEmptyOutputs) {
  std::vector<float> q, k, v, out, lse;
  anyattn_tensor tq = view(q, {2, 3, 0, 8}), tk = view(k, {2, 4, 0, 8}), tv = view(v, {2, 4, 0, 8});
  anyattn_tensor to = view(out, {2, 3, 0, 8}), tl = view(lse, {2, 0, 3});
  EXPECT_EQ(anyattn_fwd(&tq, &tk, &tv, &to, &tl, nullptr), ANYATTN_OK) << anyattn_last_error();
  // Hq = 0 over Hk > 0 is 0 heads too (0 is a multiple of Hk).
  tk = view(k, {2, 4, 2, 8});
  tv = view(v, {2, 4, 2, 8});
  EXPECT_EQ(anyattn_fwd(&tq, &tk, &tv, &to, &tl, nullptr), ANYATTN_OK) << anyattn_last_error();
}

TEST(DegenerateFwd, NoKeyHeadsForQueryHeadsIsAnError) {
  std::vector<float> q(2 * 3 * 2 * 8, 0.f), k, v, out, lse;
  anyattn_tensor tq = view(q, {2, 3, 2, 8}), tk = view(k, {2, 4, 0, 8}), tv = view(v, {2, 4, 0, 8});
  anyattn_tensor to = view(out, {2, 3, 2, 8}), tl = view(lse, {2, 2, 3});
  EXPECT_EQ(anyattn_fwd(&tq, &tk, &tv, &to, &tl, nullptr), ANYATTN_E_INVALID_ARGUMENT);
  const std::string message = anyattn_last_error();
  EXPECT_NE(message.find("k.shape[2] (Hk) is 0"), std::string::npos) << message;
  EXPECT_NE(message.find("no key/value heads"), std::string::npos) << message;
  for (float x : out) EXPECT_EQ(x, kSentinel);
  for (float x : lse) EXPECT_EQ(x, kSentinel);
}

TEST(DegenerateFwd, EmptyTensorsWithAnyStridesAndNullData) {
  // B = 0 with every stride 0 (numpy's empty arrays), and with a non-unit last stride.
  for (int64_t last_stride : {0, 1, 7}) {
    anyattn_tensor t{};
    t.data = nullptr;
    t.dtype = ANYATTN_DTYPE_F32;
    t.ndim = 4;
    const int64_t shape[4] = {0, 4, 2, 8};
    for (int d = 0; d < 4; ++d) {
      t.shape[d] = shape[d];
      t.strides[d] = d == 3 ? last_stride : 0;
    }
    anyattn_tensor lse = t;
    lse.ndim = 3;
    lse.shape[1] = 2;
    lse.shape[2] = 4;
    EXPECT_EQ(anyattn_fwd(&t, &t, &t, &t, &lse, nullptr), ANYATTN_OK) << anyattn_last_error();
  }
}

TEST(DegenerateFwd, ValueHeadDimZeroStillGivesTheLse) {
  const int64_t B = 2, Sq = 3, Sk = 5, Hq = 4, Hk = 2, D = 8;
  std::vector<float> q = values(B * Sq * Hq * D, 1), k = values(B * Sk * Hk * D, 2);
  std::vector<float> v1 = values(B * Sk * Hk, 3), out1, lse1, v0, out0, lse0;
  anyattn_tensor tq = view(q, {B, Sq, Hq, D}), tk = view(k, {B, Sk, Hk, D});
  for (bool causal : {false, true}) {
    anyattn_fwd_params p = defaults();
    p.causal = causal;
    lse1.assign(B * Hq * Sq, kSentinel);
    lse0.assign(B * Hq * Sq, kSentinel);
    anyattn_tensor tv1 = view(v1, {B, Sk, Hk, 1}), to1 = view(out1, {B, Sq, Hq, 1});
    anyattn_tensor tl1 = view(lse1, {B, Hq, Sq}), tl0 = view(lse0, {B, Hq, Sq});
    anyattn_tensor tv0 = view(v0, {B, Sk, Hk, 0}), to0 = view(out0, {B, Sq, Hq, 0});
    ASSERT_EQ(anyattn_fwd(&tq, &tk, &tv1, &to1, &tl1, &p), ANYATTN_OK) << anyattn_last_error();
    ASSERT_EQ(anyattn_fwd(&tq, &tk, &tv0, &to0, &tl0, &p), ANYATTN_OK) << anyattn_last_error();
    expect_near_all(lse0, std::vector<double>(lse1.begin(), lse1.end()), "lse");
    // Without an lse there is nothing to write.
    ASSERT_EQ(anyattn_fwd(&tq, &tk, &tv0, &to0, nullptr, &p), ANYATTN_OK) << anyattn_last_error();
  }
}

TEST(DegenerateFwd, HeadDimZeroMakesEveryScoreZero) {
  const int64_t B = 2, Sq = 3, Sk = 5, Hq = 4, Hk = 2, Dv = 6;
  for (int variant = 0; variant < 4; ++variant) {
    ZeroScoreCase c{B, Sq, Sk, Hq, Hk, Dv, false, {}, {}};
    anyattn_fwd_params p = defaults();
    std::vector<float> slopes = {0.5f, -0.25f, 1.f, 0.125f}, sinks = {0.3f, -1.f, 2.f, 0.f};
    anyattn_tensor ts, tsinks;
    if (variant == 1) {
      c.causal = true;
      p.causal = 1;
      p.softcap = 5.f;  // caps 0 to 0
    }
    if (variant == 2) {
      c.slopes = slopes;
      ts = view(c.slopes, {Hq});
      p.alibi_slopes = &ts;
      p.softmax_scale = 3.f;  // scales 0 to 0
    }
    if (variant == 3) {
      c.sinks = sinks;
      tsinks = view(c.sinks, {Hq});
      p.sinks = &tsinks;
      p.causal = 1;
      c.causal = true;
    }
    SCOPED_TRACE("variant " + std::to_string(variant));
    std::vector<float> q, k, v = values(B * Sk * Hk * Dv, 4), out, lse;
    out.assign(B * Sq * Hq * Dv, kSentinel);
    lse.assign(B * Hq * Sq, kSentinel);
    anyattn_tensor tq = view(q, {B, Sq, Hq, 0}), tk = view(k, {B, Sk, Hk, 0});
    anyattn_tensor tv = view(v, {B, Sk, Hk, Dv}), to = view(out, {B, Sq, Hq, Dv});
    anyattn_tensor tl = view(lse, {B, Hq, Sq});
    ASSERT_EQ(anyattn_fwd(&tq, &tk, &tv, &to, &tl, &p), ANYATTN_OK) << anyattn_last_error();
    std::vector<double> want_out, want_lse;
    zero_score_attention(c, v, &want_out, &want_lse);
    expect_near_all(out, want_out, "out");
    expect_near_all(lse, want_lse, "lse");
  }
}

TEST(DegenerateFwd, BothHeadDimsZero) {
  std::vector<float> q, k, v, out, lse(2 * 3 * 4, kSentinel);
  anyattn_tensor tq = view(q, {2, 4, 3, 0}), tk = view(k, {2, 5, 1, 0}), tv = view(v, {2, 5, 1, 0});
  anyattn_tensor to = view(out, {2, 4, 3, 0}), tl = view(lse, {2, 3, 4});
  ASSERT_EQ(anyattn_fwd(&tq, &tk, &tv, &to, &tl, nullptr), ANYATTN_OK) << anyattn_last_error();
  for (float x : lse) EXPECT_NEAR(x, std::log(5.f), 1e-6);
}

// ---- Varlen forward -----------------------------------------------------------------------------

struct VarlenCall {
  std::vector<float> q, k, v, out, lse;
  std::vector<int32_t> cu_q, cu_k;
  int64_t total_q, total_k, Hq, Hk, D, Dv;
  anyattn_status run(int64_t max_q, int64_t max_k, const anyattn_fwd_params* p = nullptr) {
    if (q.empty()) q = values(total_q * Hq * D, 5);
    if (k.empty()) k = values(total_k * Hk * D, 6);
    if (v.empty()) v = values(total_k * Hk * Dv, 7);
    out.assign(static_cast<size_t>(total_q * Hq * Dv), kSentinel);
    lse.assign(static_cast<size_t>(Hq * total_q), kSentinel);
    const int64_t batch = static_cast<int64_t>(cu_q.size()) - 1;
    anyattn_tensor tq = view(q, {total_q, Hq, D}), tk = view(k, {total_k, Hk, D});
    anyattn_tensor tv = view(v, {total_k, Hk, Dv}), to = view(out, {total_q, Hq, Dv});
    anyattn_tensor tl = view(lse, {Hq, total_q});
    anyattn_tensor tcq = view(cu_q, {batch + 1}), tck = view(cu_k, {batch + 1});
    return anyattn_fwd_varlen(&tq, &tk, &tv, &to, &tl, &tcq, &tck, nullptr, max_q, max_k, p);
  }
};

TEST(DegenerateVarlen, NoSequences) {
  VarlenCall c{{}, {}, {}, {}, {}, {0}, {0}, 0, 0, 2, 1, 8, 8};
  EXPECT_EQ(c.run(0, 0), ANYATTN_OK) << anyattn_last_error();
  // Rows outside every sequence are not written.
  VarlenCall d{{}, {}, {}, {}, {}, {0}, {0}, 3, 4, 2, 1, 8, 8};
  EXPECT_EQ(d.run(0, 0), ANYATTN_OK) << anyattn_last_error();
  for (float x : d.out) EXPECT_EQ(x, kSentinel);
}

TEST(DegenerateVarlen, NoQueriesOrNoKeysOrNoHeads) {
  VarlenCall no_q{{}, {}, {}, {}, {}, {0, 0, 0}, {0, 3, 5}, 0, 5, 2, 1, 8, 8};
  EXPECT_EQ(no_q.run(0, 3), ANYATTN_OK) << anyattn_last_error();
  VarlenCall no_k{{}, {}, {}, {}, {}, {0, 2, 3}, {0, 0, 0}, 3, 0, 2, 1, 8, 8};
  ASSERT_EQ(no_k.run(2, 0), ANYATTN_OK) << anyattn_last_error();
  for (float x : no_k.out) EXPECT_EQ(x, 0.f);
  for (float x : no_k.lse) EXPECT_EQ(x, kMinusInf);
  VarlenCall no_heads{{}, {}, {}, {}, {}, {0, 2, 3}, {0, 4, 5}, 3, 5, 0, 0, 8, 8};
  EXPECT_EQ(no_heads.run(2, 4), ANYATTN_OK) << anyattn_last_error();
  VarlenCall no_k_heads{{}, {}, {}, {}, {}, {0, 2, 3}, {0, 4, 5}, 3, 5, 2, 0, 8, 8};
  EXPECT_EQ(no_k_heads.run(2, 4), ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(anyattn_last_error()).find("no key/value heads"), std::string::npos);
}

TEST(DegenerateVarlen, HeadDimZeroWithEmptySequences) {
  // Sequence 1 has no queries, sequence 2 no keys.
  VarlenCall c{{}, {}, {}, {}, {}, {0, 2, 2, 4}, {0, 3, 5, 5}, 4, 5, 2, 1, 0, 3};
  anyattn_fwd_params p = defaults();
  p.causal = 1;
  ASSERT_EQ(c.run(2, 3, &p), ANYATTN_OK) << anyattn_last_error();
  // Sequence 0 (Sq 2, Sk 3, causal): row i sees keys j <= i + 1 with equal weights.
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t d = 0; d < 3; ++d) {
        double mean = 0;
        for (int64_t j = 0; j <= i + 1; ++j) mean += c.v[j * 3 + d];
        mean /= double(i + 2);
        EXPECT_NEAR(c.out[(i * 2 + h) * 3 + d], mean, 1e-6);
      }
      EXPECT_NEAR(c.lse[h * 4 + i], std::log(double(i + 2)), 1e-6);
    }
  }
  for (int64_t i = 2; i < 4; ++i) {  // sequence 2: no keys
    for (int64_t h = 0; h < 2; ++h) EXPECT_EQ(c.lse[h * 4 + i], kMinusInf);
  }
  VarlenCall no_dv{{}, {}, {}, {}, {}, {0, 2, 2, 4}, {0, 3, 5, 5}, 4, 5, 2, 1, 8, 0};
  ASSERT_EQ(no_dv.run(2, 3, &p), ANYATTN_OK) << anyattn_last_error();
  for (float x : no_dv.lse) EXPECT_NE(x, kSentinel);
}

// ---- KV cache -----------------------------------------------------------------------------------

TEST(DegenerateKvcache, EmptyBatchQueriesCacheAndHeads) {
  struct Shape {
    int64_t B, Sq, Hq, Hk, S_cache, D, Dv;
  };
  for (const Shape s : {Shape{0, 1, 2, 1, 16, 8, 8}, Shape{2, 0, 2, 1, 16, 8, 8},
                        Shape{2, 1, 0, 0, 16, 8, 8}, Shape{2, 3, 2, 1, 0, 8, 8},
                        Shape{2, 3, 2, 1, 6, 0, 4}, Shape{2, 3, 2, 1, 6, 4, 0}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " Sq=" << s.Sq << " Hq=" << s.Hq
                                      << " S_cache=" << s.S_cache << " D=" << s.D
                                      << " Dv=" << s.Dv);
    std::vector<float> q = values(s.B * s.Sq * s.Hq * s.D, 8);
    std::vector<float> kc = values(s.B * s.S_cache * s.Hk * s.D, 9);
    std::vector<float> vc = values(s.B * s.S_cache * s.Hk * s.Dv, 10), out, lse;
    anyattn_tensor tq = view(q, {s.B, s.Sq, s.Hq, s.D});
    anyattn_tensor tk = view(kc, {s.B, s.S_cache, s.Hk, s.D});
    anyattn_tensor tv = view(vc, {s.B, s.S_cache, s.Hk, s.Dv});
    anyattn_tensor to = view(out, {s.B, s.Sq, s.Hq, s.Dv}), tl = view(lse, {s.B, s.Hq, s.Sq});
    ASSERT_EQ(anyattn_fwd_kvcache(&tq, &tk, &tv, &to, &tl, nullptr, nullptr), ANYATTN_OK)
        << anyattn_last_error();
    if (s.S_cache == 0) {
      for (float x : out) EXPECT_EQ(x, 0.f);
      for (float x : lse) EXPECT_EQ(x, kMinusInf);
    } else {
      for (float x : lse) EXPECT_TRUE(std::isfinite(x));
    }
  }
}

TEST(DegenerateKvcache, AppendWithNoQueriesOrHeadDimZero) {
  // Sq = 0 still appends; D = 0 appends the values and attends with equal weights.
  for (int64_t D : {8, 0}) {
    const int64_t B = 2, Sq = D == 0 ? 1 : 0, Hq = 2, Hk = 1, S = 4, S_new = 2, Dv = 3;
    std::vector<float> q, kc(B * S * Hk * D, 0.f), vc(B * S * Hk * Dv, 0.f), out, lse;
    std::vector<float> kn = values(B * S_new * Hk * D, 11), vn = values(B * S_new * Hk * Dv, 12);
    std::vector<int32_t> seqlens = {1, 2};
    anyattn_tensor tq = view(q, {B, Sq, Hq, D}), tk = view(kc, {B, S, Hk, D});
    anyattn_tensor tv = view(vc, {B, S, Hk, Dv}), to = view(out, {B, Sq, Hq, Dv});
    anyattn_tensor tl = view(lse, {B, Hq, Sq}), tkn = view(kn, {B, S_new, Hk, D});
    anyattn_tensor tvn = view(vn, {B, S_new, Hk, Dv}), tsl = view(seqlens, {B});
    anyattn_kvcache_params cache;
    anyattn_kvcache_params_init(&cache);
    cache.k_new = &tkn;
    cache.v_new = &tvn;
    cache.cache_seqlens = &tsl;
    ASSERT_EQ(anyattn_fwd_kvcache(&tq, &tk, &tv, &to, &tl, &cache, nullptr), ANYATTN_OK)
        << anyattn_last_error();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < S_new; ++t) {
        for (int64_t d = 0; d < Dv; ++d) {
          EXPECT_EQ(vc[(b * S + seqlens[b] + t) * Dv + d], vn[(b * S_new + t) * Dv + d]);
        }
      }
    }
    if (D == 0) {  // sequence b: seqlens[b] zeros, then the new values, equal weights
      for (int64_t b = 0; b < B; ++b) {
        const int64_t keys = seqlens[b] + S_new;
        for (int64_t d = 0; d < Dv; ++d) {
          double sum = 0;
          for (int64_t t = 0; t < S_new; ++t) sum += vn[(b * S_new + t) * Dv + d];
          for (int64_t h = 0; h < Hq; ++h) EXPECT_NEAR(out[(b * Hq + h) * Dv + d], sum / keys, 1e-6);
        }
        for (int64_t h = 0; h < Hq; ++h) EXPECT_NEAR(lse[b * Hq + h], std::log(double(keys)), 1e-6);
      }
    }
  }
}

TEST(DegenerateKvcache, PagedCacheWithoutBlocksForEmptySequences) {
  const int64_t B = 2, Sq = 1, Hq = 2, Hk = 1, D = 8;
  std::vector<float> q = values(B * Sq * Hq * D, 13), kc, vc, out, lse;
  std::vector<int32_t> table = {0, 0}, seqlens = {0, 0};
  anyattn_tensor tq = view(q, {B, Sq, Hq, D}), tk = view(kc, {0, 4, Hk, D});
  anyattn_tensor tv = view(vc, {0, 4, Hk, D}), to = view(out, {B, Sq, Hq, D});
  anyattn_tensor tl = view(lse, {B, Hq, Sq}), tt = view(table, {B, 1}), ts = view(seqlens, {B});
  anyattn_kvcache_params cache;
  anyattn_kvcache_params_init(&cache);
  cache.block_table = &tt;
  cache.cache_seqlens = &ts;
  ASSERT_EQ(anyattn_fwd_kvcache(&tq, &tk, &tv, &to, &tl, &cache, nullptr), ANYATTN_OK)
      << anyattn_last_error();
  for (float x : out) EXPECT_EQ(x, 0.f);
  for (float x : lse) EXPECT_EQ(x, kMinusInf);
  // The packed-query form, with no sequences at all.
  std::vector<int32_t> cu = {0}, no_table, no_seqlens;
  anyattn_tensor tq0 = view(q, {0, Hq, D}), to0 = view(out, {0, Hq, D}), tl0 = view(lse, {Hq, 0});
  anyattn_tensor tcu = view(cu, {1}), tt0 = view(no_table, {0, 1}), ts0 = view(no_seqlens, {0});
  cache.block_table = &tt0;
  cache.cache_seqlens = &ts0;
  EXPECT_EQ(anyattn_fwd_kvcache_varlen(&tq0, &tk, &tv, &to0, &tl0, &tcu, 0, &cache, nullptr),
            ANYATTN_OK)
      << anyattn_last_error();
}

// ---- Merge --------------------------------------------------------------------------------------

TEST(DegenerateMerge, NoTokensAndNoColumns) {
  std::vector<float> a, b, o, la, lb, lo;
  anyattn_tensor ta = view(a, {0, 2, 8}), tb = view(b, {0, 2, 8}), to = view(o, {0, 2, 8});
  anyattn_tensor tla = view(la, {2, 0}), tlb = view(lb, {2, 0}), tlo = view(lo, {2, 0});
  EXPECT_EQ(anyattn_merge_attention_states(&ta, &tla, &tb, &tlb, &to, &tlo), ANYATTN_OK)
      << anyattn_last_error();
  // Dv = 0: only the LSEs merge.
  la = {0.f, 1.f, kMinusInf};
  lb = {0.f, kMinusInf, kMinusInf};
  lo.assign(3, kSentinel);
  ta = view(a, {3, 1, 0});
  tb = view(b, {3, 1, 0});
  to = view(o, {3, 1, 0});
  tla = view(la, {1, 3});
  tlb = view(lb, {1, 3});
  tlo = view(lo, {1, 3});
  ASSERT_EQ(anyattn_merge_attention_states(&ta, &tla, &tb, &tlb, &to, &tlo), ANYATTN_OK)
      << anyattn_last_error();
  EXPECT_NEAR(lo[0], std::log(2.f), 1e-6);
  EXPECT_NEAR(lo[1], 1.f, 1e-6);
  EXPECT_EQ(lo[2], kMinusInf);
}

// ---- Backward -----------------------------------------------------------------------------------

// A dense forward then backward; gradients pre-filled with the sentinel.
struct BwdCall {
  BwdCall(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hk, int64_t D, int64_t Dv,
          bool sinks = false)
      : B(B), Sq(Sq), Sk(Sk), Hq(Hq), Hk(Hk), D(D), Dv(Dv), sinks(sinks) {}
  int64_t B, Sq, Sk, Hq, Hk, D, Dv;
  bool sinks;
  std::vector<float> q, k, v, out, lse, dout, dq, dk, dv, sink, dsink;
  anyattn_status run() {
    q = values(B * Sq * Hq * D, 14);
    k = values(B * Sk * Hk * D, 15);
    v = values(B * Sk * Hk * Dv, 16);
    dout = values(B * Sq * Hq * Dv, 17);
    sink = values(Hq, 18);
    out.assign(static_cast<size_t>(B * Sq * Hq * Dv), 0.f);
    lse.assign(static_cast<size_t>(B * Hq * Sq), 0.f);
    dq.assign(static_cast<size_t>(B * Sq * Hq * D), kSentinel);
    dk.assign(static_cast<size_t>(B * Sk * Hk * D), kSentinel);
    dv.assign(static_cast<size_t>(B * Sk * Hk * Dv), kSentinel);
    dsink.assign(static_cast<size_t>(Hq), kSentinel);
    anyattn_tensor tq = view(q, {B, Sq, Hq, D}), tk = view(k, {B, Sk, Hk, D});
    anyattn_tensor tv = view(v, {B, Sk, Hk, Dv}), to = view(out, {B, Sq, Hq, Dv});
    anyattn_tensor tl = view(lse, {B, Hq, Sq}), tdo = view(dout, {B, Sq, Hq, Dv});
    anyattn_tensor tdq = view(dq, {B, Sq, Hq, D}), tdk = view(dk, {B, Sk, Hk, D});
    anyattn_tensor tdv = view(dv, {B, Sk, Hk, Dv}), ts = view(sink, {Hq});
    anyattn_tensor tds = view(dsink, {Hq});
    anyattn_fwd_params p = defaults();
    if (sinks) p.sinks = &ts;
    const anyattn_status fwd = anyattn_fwd(&tq, &tk, &tv, &to, &tl, &p);
    if (fwd != ANYATTN_OK) return fwd;
    return anyattn_bwd(&tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv, sinks ? &tds : nullptr,
                       &p);
  }
};

TEST(DegenerateBwd, EmptyShapesGiveZerosWhereNothingIsAttended) {
  {  // No queries: dk and dv are 0.
    BwdCall c{2, 0, 5, 2, 1, 8, 4, true};
    ASSERT_EQ(c.run(), ANYATTN_OK) << anyattn_last_error();
    for (float x : c.dk) EXPECT_EQ(x, 0.f);
    for (float x : c.dv) EXPECT_EQ(x, 0.f);
    for (float x : c.dsink) EXPECT_EQ(x, 0.f);
  }
  {  // No keys: dq is 0.
    BwdCall c{2, 3, 0, 2, 1, 8, 4};
    ASSERT_EQ(c.run(), ANYATTN_OK) << anyattn_last_error();
    for (float x : c.dq) EXPECT_EQ(x, 0.f);
  }
  for (const BwdCall& shape : {BwdCall{0, 3, 5, 2, 1, 8, 4, true}, BwdCall{2, 3, 5, 0, 0, 8, 4},
                               BwdCall{2, 3, 5, 0, 1, 8, 4}, BwdCall{2, 3, 5, 0, 1, 0, 4}}) {
    BwdCall c = shape;
    EXPECT_EQ(c.run(), ANYATTN_OK) << anyattn_last_error();
    // B = 0: the sink gradient is an empty sum. Hq = 0 with Hk = 1: no query attends any key.
    for (float x : c.dsink) EXPECT_EQ(x, 0.f);
    for (float x : c.dk) EXPECT_EQ(x, 0.f);
    for (float x : c.dv) EXPECT_EQ(x, 0.f);
  }
}

TEST(DegenerateBwd, ValueHeadDimZeroGivesZeroGradients) {
  BwdCall c{2, 3, 5, 2, 1, 8, 0, true};
  ASSERT_EQ(c.run(), ANYATTN_OK) << anyattn_last_error();
  for (float x : c.dq) EXPECT_EQ(x, 0.f);
  for (float x : c.dk) EXPECT_EQ(x, 0.f);
  for (float x : c.dsink) EXPECT_EQ(x, 0.f);
}

TEST(DegenerateBwd, HeadDimZeroGivesTheValueGradient) {
  // Every weight is 1 / Sk: dv[b, j, g] = sum over the group's heads and all rows of dout / Sk.
  BwdCall c{2, 3, 5, 2, 1, 0, 4};
  ASSERT_EQ(c.run(), ANYATTN_OK) << anyattn_last_error();
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t j = 0; j < c.Sk; ++j) {
      for (int64_t d = 0; d < c.Dv; ++d) {
        double want = 0;
        for (int64_t i = 0; i < c.Sq; ++i) {
          for (int64_t h = 0; h < c.Hq; ++h) want += c.dout[((b * c.Sq + i) * c.Hq + h) * c.Dv + d];
        }
        EXPECT_NEAR(c.dv[(b * c.Sk + j) * c.Dv + d], want / c.Sk, 1e-5);
      }
    }
  }
}

TEST(DegenerateBwd, VarlenEmptySequencesAndBatch) {
  const int64_t Hq = 2, Hk = 1, D = 8, Dv = 4;
  // Sequence 0: 2 queries, 3 keys; sequence 1: no queries, 2 keys; sequence 2: 1 query, no keys.
  for (int64_t batch : {3, 0}) {
    std::vector<int32_t> cu_q = batch ? std::vector<int32_t>{0, 2, 2, 3} : std::vector<int32_t>{0};
    std::vector<int32_t> cu_k = batch ? std::vector<int32_t>{0, 3, 5, 5} : std::vector<int32_t>{0};
    const int64_t tq_n = cu_q.back(), tk_n = cu_k.back();
    std::vector<float> q = values(tq_n * Hq * D, 19), k = values(tk_n * Hk * D, 20);
    std::vector<float> v = values(tk_n * Hk * Dv, 21), dout = values(tq_n * Hq * Dv, 22);
    std::vector<float> out(tq_n * Hq * Dv, 0.f), lse(Hq * tq_n, 0.f);
    std::vector<float> dq(tq_n * Hq * D, kSentinel), dk(tk_n * Hk * D, kSentinel);
    std::vector<float> dv(tk_n * Hk * Dv, kSentinel);
    anyattn_tensor tq = view(q, {tq_n, Hq, D}), tk = view(k, {tk_n, Hk, D});
    anyattn_tensor tv = view(v, {tk_n, Hk, Dv}), to = view(out, {tq_n, Hq, Dv});
    anyattn_tensor tl = view(lse, {Hq, tq_n}), tdo = view(dout, {tq_n, Hq, Dv});
    anyattn_tensor tdq = view(dq, {tq_n, Hq, D}), tdk = view(dk, {tk_n, Hk, D});
    anyattn_tensor tdv = view(dv, {tk_n, Hk, Dv});
    anyattn_tensor tcq = view(cu_q, {batch + 1}), tck = view(cu_k, {batch + 1});
    ASSERT_EQ(anyattn_fwd_varlen(&tq, &tk, &tv, &to, &tl, &tcq, &tck, nullptr, 2, 3, nullptr),
              ANYATTN_OK)
        << anyattn_last_error();
    ASSERT_EQ(anyattn_bwd_varlen(&tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv, nullptr, &tcq,
                                 &tck, nullptr, 2, 3, nullptr),
              ANYATTN_OK)
        << anyattn_last_error();
    if (batch == 0) continue;
    for (int64_t j = 3; j < 5; ++j) {  // sequence 1's keys: no queries attend to them
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dk[j * D + d], 0.f);
      for (int64_t d = 0; d < Dv; ++d) EXPECT_EQ(dv[j * Dv + d], 0.f);
    }
    for (int64_t h = 0; h < Hq; ++h) {  // sequence 2's query: no keys
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(dq[(2 * Hq + h) * D + d], 0.f);
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
