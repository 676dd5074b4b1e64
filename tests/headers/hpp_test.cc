// Tests of the C++ layer include/anyattn/anyattn.hpp: error mapping, tensor views, option mapping,
// optional lse and the storage types. The kernels themselves are tested by the other suites here.
#include <gtest/gtest.h>
#include <anyattn/anyattn.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using anyattn::BFloat16;
using anyattn::DType;
using anyattn::Error;
using anyattn::Float16;
using anyattn::FwdOptions;
using anyattn::TensorView;

// A small deterministic problem in (1, S, H, D) layout, f32.
struct Problem {
  int64_t sq, sk, hq, hk, d;
  std::vector<float> q, k, v;
  Problem(int64_t sq_, int64_t sk_, int64_t hq_, int64_t hk_, int64_t d_)
      : sq(sq_), sk(sk_), hq(hq_), hk(hk_), d(d_), q(sq * hq * d), k(sk * hk * d), v(sk * hk * d) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.731f * i + 0.2f);
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.377f * i - 0.1f);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(1.13f * i) * 2.0f;
  }
  TensorView qv() const { return TensorView(q.data(), {1, sq, hq, d}); }
  TensorView kv() const { return TensorView(k.data(), {1, sk, hk, d}); }
  TensorView vv() const { return TensorView(v.data(), {1, sk, hk, d}); }

  // Direct f64 attention of query (i, h) over keys j with lo <= j - (i + sk - sq) <= hi; writes the
  // output row to o and returns the log-sum-exp.
  double direct(int64_t i, int64_t h, double scale, int64_t lo, int64_t hi, double* o) const {
    const int64_t kh = h / (hq / hk);
    std::vector<double> s(sk, -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < sk; ++j) {
      const int64_t rel = j - (i + sk - sq);
      if (rel < lo || rel > hi) continue;
      double dot = 0;
      for (int64_t c = 0; c < d; ++c)
        dot += double(q[(i * hq + h) * d + c]) * k[(j * hk + kh) * d + c];
      s[j] = scale * dot;
      m = std::max(m, s[j]);
    }
    double z = 0;
    for (int64_t c = 0; c < d; ++c) o[c] = 0;
    for (int64_t j = 0; j < sk; ++j) {
      if (s[j] == -INFINITY) continue;
      const double p = std::exp(s[j] - m);
      z += p;
      for (int64_t c = 0; c < d; ++c) o[c] += p * v[(j * hk + kh) * d + c];
    }
    for (int64_t c = 0; c < d; ++c) o[c] /= z;
    return m + std::log(z);
  }

  // Max abs difference of out (and lse, if given) from direct() over all rows.
  double error(const std::vector<float>& out, const float* lse, double scale, int64_t lo,
               int64_t hi) const {
    double err = 0;
    std::vector<double> o(d);
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < sq; ++i) {
        const double l = direct(i, h, scale, lo, hi, o.data());
        if (lse) err = std::max(err, std::abs(l - lse[h * sq + i]));
        for (int64_t c = 0; c < d; ++c)
          err = std::max(err, std::abs(o[c] - out[(i * hq + h) * d + c]));
      }
    }
    return err;
  }
};

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

TEST(HppError, CarriesStatusAndLibraryMessage) {
  Problem p(4, 4, 3, 2, 8);  // Hq % Hk != 0.
  std::vector<float> out(p.q.size());
  try {
    anyattn::fwd(p.qv(), p.kv(), p.vv(), TensorView(out.data(), {1, p.sq, p.hq, p.d}));
    FAIL() << "fwd accepted Hq=3, Hk=2";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ANYATTN_E_INVALID_ARGUMENT);
    EXPECT_FALSE(e.message().empty());
    EXPECT_EQ(std::string(e.what()), "ANYATTN_E_INVALID_ARGUMENT: " + e.message());
  }
}

TEST(HppError, IsARuntimeErrorAndCheckPassesOk) {
  EXPECT_NO_THROW(anyattn::check(ANYATTN_OK));
  std::vector<float> q(8);
  TensorView bad(q.data(), {1, 2, 1, 4});
  EXPECT_THROW(anyattn::fwd(bad, TensorView(), bad, bad), std::runtime_error);
}

TEST(HppError, DtypeMismatchAndOutOfRangeDropout) {
  Problem p(2, 3, 1, 1, 4);
  std::vector<BFloat16> kb(p.k.size());
  std::vector<float> out(p.q.size());
  TensorView o(out.data(), {1, p.sq, p.hq, p.d});
  EXPECT_THROW(anyattn::fwd(p.qv(), TensorView(kb.data(), {1, p.sk, p.hk, p.d}), p.vv(), o), Error);
  FwdOptions opt;
  opt.dropout_p = 1.0f;
  try {
    anyattn::fwd(p.qv(), p.kv(), p.vv(), o, opt);
    FAIL() << "dropout_p = 1 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ANYATTN_E_INVALID_ARGUMENT) << e.what();
    EXPECT_NE(std::string(e.what()).find("dropout_p"), std::string::npos) << e.what();
  }
}

TEST(HppTensorView, ContiguousStridesMatchTheCAbi) {
  std::vector<float> buf(2 * 3 * 4 * 5);
  TensorView t(buf.data(), {2, 3, 4, 5});
  EXPECT_EQ(t.data(), buf.data());
  EXPECT_EQ(t.dtype(), DType::kF32);
  ASSERT_EQ(t.ndim(), 4);
  const int64_t want[4] = {60, 20, 5, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.shape(i), (std::array<int64_t, 4>{2, 3, 4, 5}[i]));
    EXPECT_EQ(t.stride(i), want[i]);
  }
  EXPECT_EQ(t.numel(), 120);
  anyattn_tensor c;
  const int64_t shape[3] = {7, 0, 3};
  ASSERT_EQ(anyattn_tensor_init_contiguous(&c, buf.data(), ANYATTN_DTYPE_F32, 3, shape),
            ANYATTN_OK);
  TensorView e(buf.data(), {7, 0, 3});
  EXPECT_EQ(std::memcmp(&c, &e.c_tensor(), sizeof c), 0);
}

TEST(HppTensorView, DeducesDtypeAndAcceptsContainers) {
  Float16 h[4];
  BFloat16 b[4];
  int32_t n[4];
  const float f[4] = {};
  EXPECT_EQ(TensorView(h, {4}).dtype(), DType::kF16);
  EXPECT_EQ(TensorView(b, {4}).dtype(), DType::kBF16);
  EXPECT_EQ(TensorView(n, {2, 2}).dtype(), DType::kI32);
  EXPECT_EQ(TensorView(f, {1, 4}).dtype(), DType::kF32);
  uint16_t raw[4];
  EXPECT_EQ(TensorView(raw, DType::kBF16, {4}).c_tensor().dtype, ANYATTN_DTYPE_BF16);

  const std::vector<int64_t> shape = {2, 1, 2};
  const std::array<int64_t, 3> strides = {1, 8, 4};
  TensorView s(f, shape, strides);
  ASSERT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.stride(0), 1);
  EXPECT_EQ(s.stride(1), 8);
  EXPECT_EQ(s.stride(2), 4);
  EXPECT_EQ(s.shape(0), 2);
}

TEST(HppTensorView, RejectsBadShapes) {
  float f[4];
  try {
    TensorView t(f, {1, 1, 1, 1, 4});
    FAIL() << "rank 5 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ANYATTN_E_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("at most 4"), std::string::npos) << e.message();
  }
  EXPECT_THROW(TensorView(f, {2, 2}, {2}), Error);
  EXPECT_THROW(TensorView(f, {2, -1}), Error);
}

TEST(HppOptions, DefaultsEqualTheCInit) {
  anyattn_fwd_params c;
  anyattn_fwd_params_init(&c);
  const anyattn_fwd_params p = FwdOptions().to_c();
  EXPECT_EQ(p.struct_size, sizeof(anyattn_fwd_params));
  EXPECT_EQ(p.softmax_scale, c.softmax_scale);
  EXPECT_EQ(p.softcap, c.softcap);
  EXPECT_EQ(p.causal, c.causal);
  EXPECT_EQ(p.window_left, c.window_left);
  EXPECT_EQ(p.window_right, c.window_right);
  EXPECT_EQ(p.alibi_slopes, nullptr);
  EXPECT_EQ(p.sinks, nullptr);
  EXPECT_EQ(p.dropout_p, c.dropout_p);
  EXPECT_EQ(p.num_splits, c.num_splits);
  EXPECT_EQ(p.isa, c.isa);
  EXPECT_EQ(p.precision, c.precision);
}

TEST(HppOptions, FieldsMapOneToOne) {
  float slopes[2] = {0.5f, 0.25f}, sinks[2] = {0.f, 1.f};
  FwdOptions o;
  o.softmax_scale = 0.125f;
  o.causal = true;
  o.window_size = {5, 7};
  o.softcap = 30.f;
  o.alibi_slopes = TensorView(slopes, {2});
  o.sinks = TensorView(sinks, {2});
  o.num_splits = 3;
  o.isa = anyattn::Isa::kPortable;
  o.precision = anyattn::Precision::kFast;
  const anyattn_fwd_params p = o.to_c();
  EXPECT_EQ(p.softmax_scale, 0.125f);
  EXPECT_EQ(p.causal, 1);
  EXPECT_EQ(p.window_left, 5);
  EXPECT_EQ(p.window_right, 7);
  EXPECT_EQ(p.softcap, 30.f);
  ASSERT_NE(p.alibi_slopes, nullptr);
  EXPECT_EQ(p.alibi_slopes->data, slopes);
  ASSERT_NE(p.sinks, nullptr);
  EXPECT_EQ(p.sinks->data, sinks);
  EXPECT_EQ(p.num_splits, 3);
  EXPECT_EQ(p.isa, ANYATTN_ISA_PORTABLE);
  EXPECT_EQ(p.precision, ANYATTN_PRECISION_FAST);
}

TEST(HppOptions, ExplicitZeroScaleIsRejected) {
  FwdOptions o;
  o.softmax_scale = 0.0f;
  try {
    o.to_c();
    FAIL() << "explicit softmax_scale 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ANYATTN_E_INVALID_ARGUMENT);
    EXPECT_NE(e.message().find("softmax_scale"), std::string::npos);
  }
}

TEST(HppFwd, OptionalLseAndScale) {
  Problem p(5, 7, 4, 2, 16);
  std::vector<float> out(p.q.size()), out2(p.q.size()), lse(p.hq * p.sq);
  const TensorView o(out.data(), {1, p.sq, p.hq, p.d});
  anyattn::fwd(p.qv(), p.kv(), p.vv(), o, TensorView(lse.data(), {1, p.hq, p.sq}));
  EXPECT_LT(p.error(out, lse.data(), 0.25, -kInf, kInf), 1e-5);
  anyattn::fwd(p.qv(), p.kv(), p.vv(), TensorView(out2.data(), {1, p.sq, p.hq, p.d}));
  EXPECT_EQ(out, out2);

  FwdOptions opt;
  opt.softmax_scale = 0.7f;
  anyattn::fwd(p.qv(), p.kv(), p.vv(), o, TensorView(lse.data(), {1, p.hq, p.sq}), opt);
  EXPECT_LT(p.error(out, lse.data(), double(0.7f), -kInf, kInf), 1e-5);
}

TEST(HppFwd, CausalAndWindowMapToTheBottomRightMask) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{3, 7}, {7, 7}, {6, 9}}) {
    Problem p(sq, sk, 2, 1, 8);
    std::vector<float> out(p.q.size()), lse(p.hq * p.sq);
    const TensorView o(out.data(), {1, p.sq, p.hq, p.d});
    const TensorView l(lse.data(), {1, p.hq, p.sq});
    const double scale = 1.0 / std::sqrt(8.0);
    FwdOptions opt;
    opt.causal = true;
    anyattn::fwd(p.qv(), p.kv(), p.vv(), o, l, opt);
    EXPECT_LT(p.error(out, lse.data(), scale, -kInf, 0), 1e-5) << sq << "x" << sk;
    opt.causal = false;
    opt.window_size = {2, 1};
    anyattn::fwd(p.qv(), p.kv(), p.vv(), o, l, opt);
    EXPECT_LT(p.error(out, lse.data(), scale, -2, 1), 1e-5) << sq << "x" << sk;
  }
}

TEST(HppFwd, EveryIsaRunsThroughOptions) {
  EXPECT_NE(anyattn::default_isa(), anyattn::Isa::kAuto);
  EXPECT_TRUE(anyattn::isa_supported(anyattn::Isa::kPortable));
  EXPECT_TRUE(anyattn::isa_supported(anyattn::default_isa()));
  Problem p(9, 11, 2, 2, 24);
  std::vector<float> out(p.q.size());
  const TensorView o(out.data(), {1, p.sq, p.hq, p.d});
  for (auto isa : {anyattn::Isa::kPortable, anyattn::Isa::kAvx2, anyattn::Isa::kAvx512}) {
    FwdOptions opt;
    opt.isa = isa;
    if (anyattn::isa_supported(isa)) {
      anyattn::fwd(p.qv(), p.kv(), p.vv(), o, opt);
      EXPECT_LT(p.error(out, nullptr, 1.0 / std::sqrt(24.0), -kInf, kInf), 1e-5)
          << anyattn::isa_name(isa);
    } else {
      try {
        anyattn::fwd(p.qv(), p.kv(), p.vv(), o, opt);
        FAIL() << "unsupported isa accepted: " << anyattn::isa_name(isa);
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), ANYATTN_E_UNSUPPORTED);
      }
    }
  }
}

TEST(HppFwd, Bf16StorageRuns) {
  Problem p(4, 6, 2, 2, 8);
  std::vector<BFloat16> q, k, v, out(p.q.size());
  for (float x : p.q) q.push_back(BFloat16::from_float(x));
  for (float x : p.k) k.push_back(BFloat16::from_float(x));
  for (float x : p.v) v.push_back(BFloat16::from_float(x));
  for (size_t i = 0; i < q.size(); ++i) p.q[i] = q[i].to_float();
  for (size_t i = 0; i < k.size(); ++i) {
    p.k[i] = k[i].to_float();
    p.v[i] = v[i].to_float();
  }
  anyattn::fwd(TensorView(q.data(), {1, 4, 2, 8}), TensorView(k.data(), {1, 6, 2, 8}),
               TensorView(v.data(), {1, 6, 2, 8}), TensorView(out.data(), {1, 4, 2, 8}));
  std::vector<float> outf;
  for (BFloat16 x : out) outf.push_back(x.to_float());
  // One bf16 rounding of outputs of magnitude <= 2: at most 2^-8 * 2.
  EXPECT_LT(p.error(outf, nullptr, 1.0 / std::sqrt(8.0), -kInf, kInf), 1.0 / 128);
}

TEST(HppThreads, SetAndRestore) {
  const int def = anyattn::get_num_threads();
  EXPECT_GE(def, 1);
  anyattn::set_num_threads(3);
  EXPECT_EQ(anyattn::get_num_threads(), 3);
  anyattn::set_num_threads(0);
  EXPECT_EQ(anyattn::get_num_threads(), def);
}

TEST(HppVersion, MatchesTheHeader) {
  EXPECT_EQ(anyattn::version(), ANYATTN_VERSION);
  EXPECT_EQ(std::string(anyattn::version_string()),
            std::to_string(ANYATTN_VERSION_MAJOR) + "." + std::to_string(ANYATTN_VERSION_MINOR) +
                "." + std::to_string(ANYATTN_VERSION_PATCH));
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(HppStorage, Float16KnownValuesAndRoundTrip) {
  EXPECT_EQ(Float16::from_float(1.0f).bits, 0x3C00);
  EXPECT_EQ(Float16::from_float(-2.0f).bits, 0xC000);
  EXPECT_EQ(Float16::from_float(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(Float16::from_float(65519.0f).bits, 0x7BFF);
  EXPECT_EQ(Float16::from_float(65520.0f).bits, 0x7C00);  // Tie rounds to even: infinity.
  EXPECT_EQ(Float16::from_float(std::ldexp(1.0f, -24)).bits, 0x0001);
  EXPECT_EQ(Float16::from_float(std::ldexp(1.0f, -25)).bits, 0x0000);  // Tie to even: zero.
  EXPECT_EQ(Float16::from_float(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(Float16::from_float(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 ulp: tie to even.
  EXPECT_EQ(Float16::from_float(1.0f + std::ldexp(1.0f, -11)).bits, 0x3C00);  // Tie to even.
  EXPECT_EQ(Float16::from_float(1.0f + std::ldexp(3.0f, -11)).bits, 0x3C02);  // Tie to even.
  EXPECT_EQ(Float16::from_float(FromBits(0x7F800000u)).bits, 0x7C00);
  EXPECT_TRUE(std::isnan(Float16::from_float(std::nanf("")).to_float()));
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const Float16 h{static_cast<uint16_t>(b)};
    const float f = h.to_float();
    if (std::isnan(f)) {
      EXPECT_EQ(b & 0x7C00u, 0x7C00u);
      continue;
    }
    ASSERT_EQ(Float16::from_float(f).bits, b) << std::hex << b;
  }
#if defined(__FLT16_MAX__) && (defined(__clang__) || defined(__x86_64__) || __GNUC__ >= 13)
  // Cross-check against the compiler's own conversion over a sweep of float bit patterns (C++
  // _Float16: clang, GCC 13 and later, and GCC 12 on x86-64 only).
  for (uint32_t u = 0; u < 0xFF800000u; u += 0x1F3Bu) {
    const float f = FromBits(u);
    const _Float16 c = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &c, sizeof want);
    ASSERT_EQ(Float16::from_float(f).bits, want) << std::hex << u;
  }
#endif
}

TEST(HppStorage, BFloat16KnownValuesAndRoundTrip) {
  EXPECT_EQ(BFloat16::from_float(1.0f).bits, 0x3F80);
  EXPECT_EQ(BFloat16::from_float(1.0f + std::ldexp(1.0f, -8)).bits, 0x3F80);  // Tie to even.
  EXPECT_EQ(BFloat16::from_float(1.0f + std::ldexp(3.0f, -8)).bits, 0x3F82);  // Tie to even.
  EXPECT_EQ(BFloat16::from_float(-3.0f).bits, 0xC040);
  EXPECT_EQ(BFloat16::from_float(FromBits(0x7F7FFFFFu)).bits, 0x7F80);  // Rounds to infinity.
  EXPECT_TRUE(std::isnan(BFloat16::from_float(FromBits(0x7F800001u)).to_float()));
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = BFloat16{static_cast<uint16_t>(b)}.to_float();
    if (std::isnan(f)) continue;
    ASSERT_EQ(BFloat16::from_float(f).bits, b) << std::hex << b;
  }
}

}  // namespace

namespace {

// The varlen, KV-cache and merge wrappers reach their C entry points and report errors as Error.
TEST(HppCacheAndVarlen, VarlenMatchesDensePerSequence) {
  const int64_t h = 1, d = 8;
  std::vector<float> q(5 * h * d), k(7 * h * d), v(7 * h * d), out(q.size()), dense(3 * h * d);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.3f * i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.2f * i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * i;
  std::vector<int32_t> cu_q{0, 2, 5}, cu_k{0, 3, 7};
  anyattn::FwdOptions opt;
  opt.causal = true;
  anyattn::fwd_varlen({q.data(), {5, h, d}}, {k.data(), {7, h, d}}, {v.data(), {7, h, d}},
                      {out.data(), {5, h, d}}, {cu_q.data(), {3}}, {cu_k.data(), {3}}, 3, 4,
                      std::nullopt, std::nullopt, opt);
  // Sequence 1 (q rows 2..4, k rows 3..6) by the dense entry point.
  anyattn::fwd({q.data() + 2 * d, {1, 3, h, d}}, {k.data() + 3 * d, {1, 4, h, d}},
               {v.data() + 3 * d, {1, 4, h, d}}, {dense.data(), {1, 3, h, d}}, opt);
  for (int64_t i = 0; i < 3 * d; ++i) EXPECT_EQ(out[2 * d + i], dense[i]) << i;
}

TEST(HppCacheAndVarlen, KvCacheAppendsAndRejectsOverflow) {
  const int64_t d = 4;
  std::vector<float> k_cache(6 * d, 0.f), v_cache(6 * d, 0.f), q(d, 0.5f), out(d);
  std::vector<float> k_new(2 * d, 1.f), v_new(2 * d, 2.f);
  anyattn::KvCacheOptions cache;
  cache.k_new = anyattn::TensorView(k_new.data(), {1, 2, 1, d});
  cache.v_new = anyattn::TensorView(v_new.data(), {1, 2, 1, d});
  cache.cache_seqlen = 3;
  anyattn::fwd_kvcache({q.data(), {1, 1, 1, d}}, {k_cache.data(), {1, 6, 1, d}},
                       {v_cache.data(), {1, 6, 1, d}}, {out.data(), {1, 1, 1, d}}, cache);
  EXPECT_EQ(k_cache[3 * d], 1.f);
  EXPECT_EQ(v_cache[4 * d + d - 1], 2.f);
  EXPECT_EQ(k_cache[5 * d], 0.f);
  cache.cache_seqlen = 5;  // 5 + 2 > 6 positions
  try {
    anyattn::fwd_kvcache({q.data(), {1, 1, 1, d}}, {k_cache.data(), {1, 6, 1, d}},
                         {v_cache.data(), {1, 6, 1, d}}, {out.data(), {1, 1, 1, d}}, cache);
    FAIL() << "an overflowing append was accepted";
  } catch (const anyattn::Error& e) {
    EXPECT_EQ(e.status(), ANYATTN_E_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("cache"), std::string::npos) << e.what();
  }
  EXPECT_EQ(k_cache[5 * d], 0.f) << "a rejected call wrote the cache";
}

TEST(HppCacheAndVarlen, KvCacheVarlenMatchesOneSequenceCalls) {
  // A paged cache of 4 pages of 2 positions: sequence 0 holds 3 keys in pages {2, 0}, sequence 1
  // holds 4 keys in pages {1, 3}; 2 and 1 queries.
  const int64_t h = 1, d = 4, page = 2;
  std::vector<float> k_cache(4 * page * d), v_cache(k_cache.size()), q(3 * d), out(3 * d, -1.f);
  for (size_t i = 0; i < k_cache.size(); ++i) k_cache[i] = std::sin(0.7f * i);
  for (size_t i = 0; i < v_cache.size(); ++i) v_cache[i] = 0.05f * i;
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(0.4f * i);
  std::vector<int32_t> block_table{2, 0, 1, 3}, seqlens{3, 4}, cu_q{0, 2, 3};
  const anyattn::TensorView k_view(k_cache.data(), {4, page, h, d});
  const anyattn::TensorView v_view(v_cache.data(), {4, page, h, d});
  anyattn::KvCacheOptions cache;
  cache.block_table = anyattn::TensorView(block_table.data(), {2, 2});
  cache.cache_seqlens = anyattn::TensorView(seqlens.data(), {2});
  anyattn::FwdOptions opt;
  opt.causal = true;
  anyattn::fwd_kvcache_varlen({q.data(), {3, h, d}}, k_view, v_view, {out.data(), {3, h, d}},
                              {cu_q.data(), {3}}, 2, cache, std::nullopt, opt);
  const int64_t q_start[2] = {0, 2}, q_len[2] = {2, 1};
  for (int b = 0; b < 2; ++b) {
    std::vector<float> one(q_len[b] * d);
    anyattn::KvCacheOptions one_cache;
    one_cache.block_table = anyattn::TensorView(block_table.data() + 2 * b, {1, 2});
    one_cache.cache_seqlen = seqlens[b];
    anyattn::fwd_kvcache({q.data() + q_start[b] * d, {1, q_len[b], h, d}}, k_view, v_view,
                         {one.data(), {1, q_len[b], h, d}}, one_cache, std::nullopt, opt);
    for (int64_t i = 0; i < q_len[b] * d; ++i) {
      EXPECT_FLOAT_EQ(out[q_start[b] * d + i], one[i]) << "sequence " << b << " element " << i;
    }
  }
  std::vector<float> k_new(2 * d, 1.f);
  cache.k_new = anyattn::TensorView(k_new.data(), {2, 1, h, d});
  cache.v_new = cache.k_new;
  const std::vector<float> before = out;
  try {
    anyattn::fwd_kvcache_varlen({q.data(), {3, h, d}}, k_view, v_view, {out.data(), {3, h, d}},
                                {cu_q.data(), {3}}, 2, cache);
    FAIL() << "an append through the varlen cache call was accepted";
  } catch (const anyattn::Error& e) {
    EXPECT_EQ(e.status(), ANYATTN_E_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("k_new"), std::string::npos) << e.what();
  }
  EXPECT_EQ(out, before) << "a rejected call wrote out";
}

TEST(HppStorage, Float8RoundTripsEveryPatternAndRoundsToNearestEvenWithSaturation) {
  for (int b = 0; b < 256; ++b) {
    const anyattn::Float8E4M3 e4{static_cast<uint8_t>(b)};
    const anyattn::Float8E5M2 e5{static_cast<uint8_t>(b)};
    if (!std::isnan(e4.to_float())) {
      EXPECT_EQ(anyattn::Float8E4M3::from_float(e4.to_float()).bits, b) << b;
    }
    if (std::isfinite(e5.to_float())) {
      EXPECT_EQ(anyattn::Float8E5M2::from_float(e5.to_float()).bits, b) << b;
    }
  }
  EXPECT_EQ(anyattn::Float8E4M3{0x7E}.to_float(), 448.f);
  EXPECT_EQ(anyattn::Float8E5M2{0x7B}.to_float(), 57344.f);
  // Ties go to the even mantissa: 1.0625 lies between 1.0 (0x38) and 1.125 (0x39).
  EXPECT_EQ(anyattn::Float8E4M3::from_float(1.0625f).bits, 0x38);
  EXPECT_EQ(anyattn::Float8E4M3::from_float(1.1875f).bits, 0x3A);
  // Saturation instead of NaN/inf; NaN stays NaN.
  EXPECT_EQ(anyattn::Float8E4M3::from_float(1e6f).bits, 0x7E);
  EXPECT_EQ(anyattn::Float8E4M3::from_float(-INFINITY).bits, 0xFE);
  EXPECT_EQ(anyattn::Float8E5M2::from_float(1e9f).bits, 0x7B);
  EXPECT_TRUE(std::isnan(anyattn::Float8E4M3::from_float(NAN).to_float()));
  // The smallest subnormal of e4m3 is 2^-9; half of it rounds to zero (even).
  EXPECT_EQ(anyattn::Float8E4M3::from_float(std::ldexp(1.f, -9)).bits, 0x01);
  EXPECT_EQ(anyattn::Float8E4M3::from_float(std::ldexp(1.f, -10)).bits, 0x00);
  const anyattn::Float8E4M3 f8[2] = {};
  const int8_t i8[2] = {};
  EXPECT_EQ(TensorView(f8, {2}).dtype(), DType::kFP8E4M3);
  EXPECT_EQ(TensorView(i8, {2}).dtype(), DType::kI8);
  EXPECT_EQ(TensorView(f8, {2}).c_tensor().dtype, ANYATTN_DTYPE_FP8_E4M3);
}

TEST(HppCacheAndVarlen, Int8CacheWithDescaleMatchesTheDequantizedF32Cache) {
  // Two keys/values per head, two kv heads; per-head descales read the int8 cache as f32.
  const int64_t hk = 2, s = 2, d = 4;
  std::vector<int8_t> k8(s * hk * d), v8(s * hk * d);
  for (size_t i = 0; i < k8.size(); ++i) k8[i] = static_cast<int8_t>(int(i * 37 % 255) - 127);
  for (size_t i = 0; i < v8.size(); ++i) v8[i] = static_cast<int8_t>(int(i * 91 % 255) - 127);
  std::vector<float> k_descale{0.01f, 0.02f}, v_descale{0.5f, 0.25f};
  std::vector<float> kf(k8.size()), vf(v8.size());
  for (size_t i = 0; i < kf.size(); ++i) kf[i] = k8[i] * k_descale[(i / d) % hk];
  for (size_t i = 0; i < vf.size(); ++i) vf[i] = v8[i] * v_descale[(i / d) % hk];
  std::vector<float> q(hk * d), out8(hk * d), outf(hk * d);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(0.9f * i);
  anyattn::KvCacheOptions quantized;
  quantized.k_descale = TensorView(k_descale.data(), {hk});
  quantized.v_descale = TensorView(v_descale.data(), {hk});
  anyattn::fwd_kvcache({q.data(), {1, 1, hk, d}}, {k8.data(), {1, s, hk, d}},
                       {v8.data(), {1, s, hk, d}}, {out8.data(), {1, 1, hk, d}}, quantized);
  anyattn::fwd_kvcache({q.data(), {1, 1, hk, d}}, {kf.data(), {1, s, hk, d}},
                       {vf.data(), {1, s, hk, d}}, {outf.data(), {1, 1, hk, d}}, {});
  for (size_t i = 0; i < out8.size(); ++i) EXPECT_NEAR(out8[i], outf[i], 1e-5f) << i;
}

TEST(HppCacheAndVarlen, Fp8AppendStoresTheRoundedKeysOverTheDescale) {
  const int64_t d = 4;
  std::vector<anyattn::Float8E4M3> k_cache(3 * d, {0}), v_cache(3 * d, {0});
  std::vector<float> q(d, 0.25f), out(d), k_new{0.3f, -1.7f, 500.f, 0.001f}, v_new{1, 2, 3, 4};
  std::vector<float> descale{0.5f};
  anyattn::KvCacheOptions cache;
  cache.k_new = TensorView(k_new.data(), {1, 1, 1, d});
  cache.v_new = TensorView(v_new.data(), {1, 1, 1, d});
  cache.cache_seqlen = 1;
  cache.k_descale = TensorView(descale.data(), {1});
  anyattn::fwd_kvcache({q.data(), {1, 1, 1, d}}, {k_cache.data(), {1, 3, 1, d}},
                       {v_cache.data(), {1, 3, 1, d}}, {out.data(), {1, 1, 1, d}}, cache);
  for (int64_t i = 0; i < d; ++i) {
    EXPECT_EQ(k_cache[d + i].bits, anyattn::Float8E4M3::from_float(k_new[i] / 0.5f).bits) << i;
    EXPECT_EQ(v_cache[d + i].bits, anyattn::Float8E4M3::from_float(v_new[i]).bits) << i;
  }
  EXPECT_EQ(k_cache[2 * d].bits, 0) << "the append wrote past its position";
}

TEST(HppCacheAndVarlen, MergeInPlace) {
  std::vector<float> a{1.f, 2.f}, b{3.f, 4.f}, lse_a{0.f}, lse_b{0.f}, lse_out{0.f};
  anyattn::merge_attention_states(
      {a.data(), {1, 1, 2}}, {lse_a.data(), {1, 1}}, {b.data(), {1, 1, 2}}, {lse_b.data(), {1, 1}},
      {a.data(), {1, 1, 2}}, anyattn::TensorView(lse_out.data(), {1, 1}));
  EXPECT_FLOAT_EQ(a[0], 2.f);
  EXPECT_FLOAT_EQ(a[1], 3.f);
  EXPECT_FLOAT_EQ(lse_out[0], std::log(2.f));
}

}  // namespace
