// anyattn_bwd against the f64 reference by the 2x rule (tests/README.md), feature by feature:
// shapes (Sq != Sk both ways, D != Dv, block edges), causal, window, softcap, ALiBi, sinks,
// GQA/MQA, dtypes, layouts, every ISA path, and the empty and fully masked edge cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backward/bwd_test_support.h"

namespace anyattn {
namespace testing {
namespace {

Case base_case() {
  Case c;
  c.B = 1;
  c.Sq = 70;
  c.Sk = 90;
  c.Hq = 2;
  c.Hk = 1;
  c.D = 40;
  c.Dv = 24;
  return c;
}

void expect_all(const std::vector<BwdCase>& cases) {
  for (const BwdCase& c : cases) EXPECT_TRUE(run_and_check_bwd(c));
}

BwdCase with(const Case& c) {
  BwdCase b;
  b.fwd = c;
  return b;
}

TEST(BwdGrad, ShapesF32) {
  std::vector<BwdCase> cases;
  const int64_t seqlens[][2] = {{1, 2},   {3, 2},     {7, 65},   {64, 64},
                                {65, 63}, {130, 257}, {257, 130}};
  const int64_t dims[][2] = {{64, 64}, {59, 111}, {8, 32}, {128, 16}};
  uint64_t seed = 1;
  for (const auto& s : seqlens) {
    for (const auto& d : dims) {
      Case c = base_case();
      c.Sq = s[0];
      c.Sk = s[1];
      c.D = d[0];
      c.Dv = d[1];
      c.seed = seed++;
      if (s[0] * s[1] > 20000 && d[0] + d[1] > 120) continue;  // keep the reference fast
      cases.push_back(with(c));
    }
  }
  expect_all(cases);
}

// With one key and no sink P = 1, so dS = dP - rowsum(dout * out) = 0 and dq = dk = 0 exactly:
// the 2x rule has no scale there (the reference and the naive result are both exactly 0). Bound
// the library's result a priori instead: dP and rowsum(dout * out) are f32 dot products of Dv
// terms of size <= max|dout| max|v|, each off by at most Dv 2^-24 of that (plus P's and out's
// rounding, a few ulps), so |dq| <= scale max|k| 4 Dv 2^-23 max|dout| max|v|, likewise dk.
TEST(BwdGrad, SingleKeyWithoutSinkGivesZeroDqDk) {
  Case c = base_case();
  c.Sq = 1;
  c.Sk = 1;
  c.D = 64;
  c.Dv = 64;
  BwdProblem p(with(c));
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK);
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  auto max_abs = [](const std::vector<double>& x) {
    double m = 0;
    for (double e : x) m = std::max(m, std::fabs(e));
    return m;
  };
  const double dout_max = max_abs(reference::to_contiguous_f64(p.dout));
  const double v_max = max_abs(reference::to_contiguous_f64(p.fwd.v));
  const double term = 4.0 * c.Dv * 0x1.0p-23 * dout_max * v_max / std::sqrt(64.0);
  const Gradients g = p.gradients();
  EXPECT_LE(max_abs(g.dq), term * max_abs(reference::to_contiguous_f64(p.fwd.k)));
  EXPECT_LE(max_abs(g.dk), term * max_abs(reference::to_contiguous_f64(p.fwd.q)));
  // dv is not degenerate: dv = dout summed over the query heads.
  const reference::DenseGradients ref = p.reference();
  EXPECT_TRUE(within_two_x_naive("dv", g.dv, ref.dv, p.naive_same_dtype().dv,
                                 out_eps(c.dtype, max_abs(ref.dv)), {c.B, c.Sk, c.Hk, c.Dv}));
}

TEST(BwdGrad, SingleKeyWithSink) {
  Case c = base_case();
  c.Sq = 1;
  c.Sk = 1;
  c.sinks = true;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

TEST(BwdGrad, CausalAndWindow) {
  std::vector<BwdCase> cases;
  for (const auto& s : {std::pair<int64_t, int64_t>{100, 100}, {60, 150}, {150, 60}}) {
    Case c = base_case();
    c.Sq = s.first;
    c.Sk = s.second;
    c.causal = true;
    cases.push_back(with(c));
    c.causal = false;
    c.window_left = 20;
    c.window_right = 5;
    cases.push_back(with(c));
    c.window_left = -1;
    c.window_right = 0;
    cases.push_back(with(c));
    c.window_left = 0;
    c.window_right = -1;
    cases.push_back(with(c));
  }
  expect_all(cases);
}

TEST(BwdGrad, Softcap) {
  Case c = base_case();
  c.softcap = 5.f;
  c.softmax_scale = 0.5f;  // scores large enough for the cap to bend them
  EXPECT_TRUE(run_and_check_bwd(with(c)));
  c.causal = true;
  c.softcap = 1.5f;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

TEST(BwdGrad, Alibi) {
  Case c = base_case();
  c.Hq = 4;
  c.alibi = Alibi::kPerHead;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
  c.B = 2;
  c.alibi = Alibi::kPerBatchHead;
  c.causal = true;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

TEST(BwdGrad, SinksWithDsink) {
  Case c = base_case();
  c.Hq = 4;
  c.Hk = 2;
  c.B = 2;
  c.sinks = true;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
  c.window_left = 10;
  c.window_right = 0;
  c.Sq = 120;
  c.Sk = 70;  // rows before the diagonal see no key: lse = sink, dsink term 0
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

TEST(BwdGrad, GqaAndMqa) {
  std::vector<BwdCase> cases;
  for (const auto& heads : {std::pair<int64_t, int64_t>{4, 2}, {8, 2}, {8, 1}, {3, 3}}) {
    Case c = base_case();
    c.Hq = heads.first;
    c.Hk = heads.second;
    c.Sq = 66;
    c.Sk = 129;
    c.causal = heads.first == 8;
    cases.push_back(with(c));
  }
  expect_all(cases);
}

TEST(BwdGrad, AllFeaturesCombined) {
  Case c = base_case();
  c.B = 2;
  c.Hq = 4;
  c.Hk = 2;
  c.Sq = 100;
  c.Sk = 140;
  c.causal = true;
  c.window_left = 50;
  c.softcap = 4.f;
  c.alibi = Alibi::kPerBatchHead;
  c.sinks = true;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

TEST(BwdGrad, HalfPrecisionDtypes) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16}) {
    Case c = base_case();
    c.dtype = dtype;
    c.Sq = 96;
    c.Sk = 130;
    c.D = 64;
    c.Dv = 48;
    EXPECT_TRUE(run_and_check_bwd(with(c)));
    c.Hq = 4;
    c.Hk = 2;
    c.causal = true;
    c.softcap = 6.f;
    c.alibi = Alibi::kPerHead;
    c.sinks = true;
    EXPECT_TRUE(run_and_check_bwd(with(c)));
  }
}

TEST(BwdGrad, EveryIsaPath) {
  for (anyattn_isa isa : supported_isas()) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
      Case c = base_case();
      c.isa = isa;
      c.dtype = dtype;
      c.Hq = 4;
      c.Hk = 2;
      c.Sq = 77;
      c.Sk = 150;
      c.D = 72;
      c.Dv = 40;
      c.causal = true;
      c.window_left = 70;
      c.softcap = 5.f;
      c.alibi = Alibi::kPerHead;
      c.sinks = true;
      EXPECT_TRUE(run_and_check_bwd(with(c))) << anyattn_isa_name(isa);
    }
  }
}

// D = 576 and Dv = 512 (the limits) and dims just past the tuned ones, on every ISA path, f32
// and bf16, with several key chunks and query blocks.
TEST(BwdGrad, LargestHeadDims) {
  const int64_t dims[][2] = {{576, 512}, {257, 511}, {512, 33}};
  int64_t n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
      for (const auto& d : dims) {
        Case c = base_case();
        c.isa = isa;
        c.dtype = dtype;
        c.Hq = 2;
        c.Hk = 1;
        c.Sq = 33;
        c.Sk = 70;
        c.D = d[0];
        c.Dv = d[1];
        c.causal = n % 2 == 1;
        c.sinks = n % 3 == 0;
        c.seed = static_cast<uint64_t>(++n);
        EXPECT_TRUE(run_and_check_bwd(with(c))) << anyattn_isa_name(isa);
      }
    }
  }
}

TEST(BwdGrad, StridedLayouts) {
  for (Layout layout : {Layout::kPacked, Layout::kTransposedBatch, Layout::kPaddedStrides,
                        Layout::kBroadcast, Layout::kNegativeStrides}) {
    Case c = base_case();
    c.B = 2;
    c.Hq = 4;
    c.Hk = 2;
    c.layout = layout;
    BwdCase b = with(c);
    b.padded_grads = true;
    EXPECT_TRUE(run_and_check_bwd(b)) << layout_name(layout);
  }
}

// B * Hk >= 16 gives one key chunk and one head split per (batch, kv head): tasks write dq, dk and
// dv directly rather than through the partials the smaller cases use (bwd_layout.h). Also with
// Sq > Sk causal, where leading query rows see no key and must get dq = 0.
TEST(BwdGrad, OneChunkPerKvHead) {
  Case c = base_case();
  c.B = 2;
  c.Hq = 16;
  c.Hk = 8;
  c.D = 32;
  c.Dv = 48;
  c.causal = true;
  c.sinks = true;
  BwdCase bc = with(c);
  EXPECT_TRUE(run_and_check_bwd(bc));
  c.Sq = 100;
  c.Sk = 40;
  c.softcap = 3.f;
  bc = with(c);
  bc.dropout_p = 0.2f;
  EXPECT_TRUE(run_and_check_bwd(bc));
}

// Fewer than 16 (batch, kv head) pairs split the keys into chunks of at least 8 blocks, then each
// GQA group's query heads, then into shorter chunks (plan/bwd_plan.cc): B2 Hq8/Hk4 Sk90 runs 2
// head splits of 2 heads and one key chunk (dk and dv summed from the splits' partials, dq written
// directly); B1 Hq6/Hk1 Sk200 6 splits of one head and 3 key chunks (both kinds of partials), with
// a window, softcap, ALiBi and dropout; B1 Hq16/Hk1 Sk1100 2 chunks of 9 blocks and 8 head splits
// of 2 heads.
TEST(BwdGrad, HeadSplits) {
  Case c = base_case();
  c.B = 2;
  c.Hq = 8;
  c.Hk = 4;
  c.causal = true;
  c.sinks = true;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
  c.B = 1;
  c.Hq = 6;
  c.Hk = 1;
  c.Sq = 90;
  c.Sk = 200;
  c.causal = false;
  c.window_left = 70;
  c.window_right = 20;
  c.softcap = 4.f;
  c.alibi = Alibi::kPerHead;
  BwdCase bc = with(c);
  bc.dropout_p = 0.15f;
  EXPECT_TRUE(run_and_check_bwd(bc));
  c = base_case();
  c.Hq = 16;
  c.Sq = 64;
  c.Sk = 1100;
  c.causal = true;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

// With bwd_own_forward, f32 rows whose keys lie in one block of 64 are normalised from their own
// scores and take delta = sum_j P_ij dP_ij (bwd_kernel-inl.h, tile_gradients). Every feature that
// changes P or delta, on short rows: sinks (their probability joins the row's sum), a sink over a
// fully masked row, causal rows of one key, windows, softcap, ALiBi, dropout (Z in the delta),
// GQA, on every ISA path.
TEST(BwdGrad, OwnForwardShortRowsF32) {
  std::vector<BwdCase> cases;
  for (anyattn_isa isa : supported_isas()) {
    for (int variant = 0; variant < 6; ++variant) {
      Case c = base_case();
      c.isa = isa;
      c.Sq = 40;
      c.Sk = 17;
      c.D = 16;
      c.Dv = 16;
      c.Hq = 4;
      c.Hk = 2;
      c.seed = 100 + variant;
      BwdCase b;
      switch (variant) {
        case 0: c.sinks = true; break;
        case 1: c.sinks = true; c.causal = true; break;
        case 2: c.causal = true; c.Dv = 40; break;
        case 3: c.window_left = 5; c.window_right = 2; c.softcap = 2.f; c.Sk = 50; break;
        case 4: c.alibi = Alibi::kPerHead; c.Sq = 30; c.Sk = 64; break;
        default: c.Sq = 23; c.Sk = 29; break;
      }
      b.fwd = c;
      b.own_forward = true;
      if (variant == 5) b.dropout_p = 0.25f;
      cases.push_back(b);
    }
  }
  expect_all(cases);
}

// A row that sees one key has P = 1 and dS = dP - delta, exactly 0 in exact arithmetic. With
// bwd_own_forward its delta is that key's dP itself, so dq of the row is exactly 0 (f32), where
// delta = <dout, out> could differ from dP by a rounding.
TEST(BwdGrad, OwnForwardRowOfOneKeyGetsZeroDq) {
  for (anyattn_isa isa : supported_isas()) {
    Case c = base_case();
    c.isa = isa;
    c.Sq = 24;
    c.Sk = 9;
    c.causal = true;  // rows 0..14 see no key, row 15 sees key 0 alone
    BwdCase b = with(c);
    b.own_forward = true;
    BwdProblem p(b);
    ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const Gradients g = p.gradients();
    for (int64_t i = 0; i <= c.Sq - c.Sk; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t d = 0; d < c.D; ++d) {
          const size_t at = static_cast<size_t>((i * c.Hq + h) * c.D + d);
          ASSERT_EQ(g.dq[at], 0.0) << "isa " << isa << " row " << i << " head " << h;
        }
      }
    }
  }
}

// With bwd_own_forward the 2x rule holds for every dtype over many seeds of short sequences,
// where a row's few keys leave the roundings of out and lse the largest errors, and with sinks,
// whose gradient is then summed from the tiles' P Z dP rather than from <dout, out> (before, 105
// of these bf16 and f16 problems failed it: dsinks in about one in seven with sinks, dq or dk of
// rows of one or two keys): 12 seeds of Sq 1, 3, 8 against Sk 2, 3, 5, 17, 100 and 300, sinks
// and causal rows on some, dropout on half, on every ISA path; then the head-split and chunked
// plans, whose sink terms are summed over several tasks.
TEST(BwdGrad, OwnForwardOverManySeeds) {
  std::vector<BwdCase> cases;
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16, ANYATTN_DTYPE_F16}) {
    for (anyattn_isa isa : supported_isas()) {
      for (int seed = 0; seed < 12; ++seed) {
        for (const int64_t sq : {1, 3, 8}) {
          for (const int64_t sk : {2, 3, 5, 17, 100, 300}) {
            Case c = base_case();
            c.isa = isa;
            c.dtype = dtype;
            c.Sq = sq;
            c.Sk = sk;
            c.D = c.Dv = 32;
            c.seed = static_cast<uint64_t>(1000 + seed);
            c.sinks = seed % 3 != 2;
            c.causal = seed % 4 == 1;
            BwdCase b = with(c);
            b.own_forward = true;
            if (seed % 2 == 0) b.dropout_p = 0.3f;
            cases.push_back(b);
          }
        }
      }
    }
  }
  for (const anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
    Case c = base_case();
    c.dtype = dtype;
    c.sinks = true;
    c.Hq = 6;
    c.Sq = 90;
    c.Sk = 200;  // 6 head splits of one head, 3 key chunks
    BwdCase b = with(c);
    b.own_forward = true;
    cases.push_back(b);
    c.Hq = 16;
    c.Sq = 64;
    c.Sk = 1100;
    c.causal = true;  // 2 chunks of 9 blocks, 8 head splits of 2 heads
    b = with(c);
    b.own_forward = true;
    cases.push_back(b);
  }
  expect_all(cases);
}

// A row that sees no key has no tile, so with the flag its dsinks term still comes from
// <dout, out> (run_bwd): a NaN in its dout reaches dsink_h as the reference's arithmetic has it
// (0 * NaN), with or without the flag, and the other head's dsink stays finite. Found by
// fuzz_bwd_varlen (a sequence with seqused_k = 0).
TEST(BwdGrad, NanDoutOfAKeylessRowReachesItsDsink) {
  for (const anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16, ANYATTN_DTYPE_F16}) {
    for (const bool own_forward : {false, true}) {
      Case c = base_case();
      c.dtype = dtype;
      c.Sq = 10;
      c.Sk = 4;
      c.causal = true;  // rows 0..5 see no key
      c.sinks = true;
      BwdCase b = with(c);
      b.own_forward = own_forward;
      BwdProblem p(b);
      ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
      const int64_t index[4] = {0, 2, 1, 3};  // row 2 of head 1
      store(p.dout, index, std::nan(""));
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const Gradients g = p.gradients();
      EXPECT_TRUE(std::isfinite(g.dsinks[0])) << b.describe();
      EXPECT_TRUE(std::isnan(g.dsinks[1])) << b.describe();
    }
  }
}

TEST(BwdGrad, EmptyAndFullyMasked) {
  Case c = base_case();
  c.sinks = true;
  c.Sq = 0;  // dk and dv are all zeros, dsinks 0
  EXPECT_TRUE(run_and_check_bwd(with(c)));
  c.Sq = 20;
  c.Sk = 0;  // dq is all zeros, dsinks 0 (lse = sink, out = 0)
  EXPECT_TRUE(run_and_check_bwd(with(c)));
  c.Sk = 30;
  c.Sq = 100;
  c.causal = true;  // the first 70 rows see no key
  c.sinks = false;
  EXPECT_TRUE(run_and_check_bwd(with(c)));
}

// D_i = <dout_i, out_i> comes from the out the caller hands over, whatever it is: gradients match
// the reference given that out (bwd_dense's out_given), including a fully masked row's non-zero
// out, which reaches the sink's gradient only. The out replaced here is far enough from the
// forward's that the exact-out reference would fail, so the comparison tells the two apart.
TEST(BwdGrad, GradientsAreThoseOfTheOutHandedOver) {
  Case c = base_case();
  c.Sq = 100;
  c.Sk = 30;
  c.causal = true;  // the first 70 rows see no key
  c.sinks = true;
  BwdProblem p(with(c));
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK);
  int64_t index[4] = {0, 0, 0, 0};
  for (index[1] = 0; index[1] < c.Sq; ++index[1]) {
    for (index[2] = 0; index[2] < c.Hq; ++index[2]) {
      for (index[3] = 0; index[3] < c.Dv; ++index[3]) {
        store(p.fwd.out, index, 0.25 + 0.01 * static_cast<double>((index[1] + index[3]) % 7));
      }
    }
  }
  ASSERT_EQ(p.run(), ANYATTN_OK);
  const Gradients got = p.gradients();
  const reference::DenseGradients given =
      reference::bwd_dense(p.fwd.q, p.fwd.k, p.fwd.v, p.dout, &p.fwd.params, &p.fwd.out);
  const reference::DenseGradients exact = p.reference();
  auto max_error = [](const std::vector<double>& a, const std::vector<double>& b) {
    double worst = 0.0, size = 1.0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::fabs(a[i] - b[i]));
      size = std::max(size, std::fabs(b[i]));
    }
    return worst / size;
  };
  EXPECT_LT(max_error(got.dq, given.dq), 2e-5);
  EXPECT_LT(max_error(got.dk, given.dk), 2e-5);
  EXPECT_LT(max_error(got.dv, given.dv), 2e-5);
  EXPECT_LT(max_error(got.dsinks, given.dsinks), 2e-5);
  EXPECT_GT(max_error(got.dq, exact.dq), 1e-2);
  EXPECT_GT(max_error(got.dsinks, exact.dsinks), 1e-2);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
