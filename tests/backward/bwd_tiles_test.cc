// bf16 backward cases at the edges of the avx512_amx path's tile products (bwd_tiles_amx-inl.h:
// all five products on AMX tiles), run on every path the host supports: head dims around the
// 32-element reduction chunks, query and key counts off the 16-row groups, 32-row chunks and
// 64-key blocks, and subnormal Q, K, V or dout, which the tiles would flush (such blocks take the
// f32 products). The subnormal cases run with ANYATTN_PRECISION_FAST too, whose bf16 dot products
// of dV, dK and dQ (avx512, neon) and rounded tile products (avx512_amx) take the same fallbacks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backward/bwd_test_support.h"
#include "reference/reference.h"

namespace anyattn {
namespace testing {
namespace {

// A bf16 case of one head (Hq = Hk = 1) and D = Dv = 32 on `isa`, the values set by each test.
BwdCase one_head_bf16(anyattn_isa isa, int64_t seqlen_q, int64_t seqlen_k) {
  BwdCase c;
  c.fwd.isa = isa;
  c.fwd.dtype = ANYATTN_DTYPE_BF16;
  c.fwd.Sq = seqlen_q;
  c.fwd.Sk = seqlen_k;
  c.fwd.Hq = 1;
  c.fwd.Hk = 1;
  c.fwd.D = 32;
  c.fwd.Dv = 32;
  return c;
}

TEST(BwdTiles, HeadDimsAroundTheTileChunksMatchTheReference) {
  const int64_t head_dims[] = {8, 16, 17, 31, 33, 65};
  const int64_t value_dims[] = {16, 40, 80};
  int n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (int64_t d : head_dims) {
      for (int64_t dv : value_dims) {
        BwdCase c;
        c.fwd.isa = isa;
        c.fwd.dtype = ANYATTN_DTYPE_BF16;
        c.fwd.D = d;
        c.fwd.Dv = dv;
        c.fwd.Sq = n % 3 == 0 ? 17 : (n % 3 == 1 ? 40 : 70);
        c.fwd.Sk = n % 2 ? 130 : 63;
        c.fwd.Hq = 4;
        c.fwd.Hk = 2;
        c.fwd.causal = n % 4 == 1;
        c.fwd.seed = static_cast<uint64_t>(100 + n);
        ++n;
        EXPECT_TRUE(run_and_check_bwd(c)) << anyattn_isa_name(isa);
      }
    }
  }
}

// q = 1 and k = 0 (every score 0, P = 1 / Sk), dout and V zero but in column 0, where one of them
// is 1 and the other the bf16 subnormal s = 1.5 2^-127. Then dP_ij = s and delta_i = dout_i . out_i
// = s exactly, so dS = P (dP - delta) = 0 and dq = dk = 0 exactly. A product that flushed s to 0
// would give dS = -P s and dk = -scale s Sq / Sk, about -2^-130.
TEST(BwdTiles, SubnormalValuesOrOutputGradientsKeepDsExact) {
  const double subnormal = 1.5 * std::ldexp(1.0, -127);
  for (anyattn_isa isa : supported_isas()) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool subnormal_values = variant % 2 == 0;
      BwdCase c = one_head_bf16(isa, 64, 64);
      c.fwd.precision = variant < 2 ? ANYATTN_PRECISION_ACCURATE : ANYATTN_PRECISION_FAST;
      SCOPED_TRACE(c.describe() + (subnormal_values ? ", subnormal V" : ", subnormal dout"));
      BwdProblem p(c);
      for (int64_t j = 0; j < c.fwd.Sk; ++j) {
        for (int64_t d = 0; d < c.fwd.D; ++d) {
          const int64_t index[4] = {0, j, 0, d};
          store(p.fwd.k, index, 0.0);
          store(p.fwd.v, index, d == 0 ? (subnormal_values ? subnormal : 1.0) : 0.0);
        }
      }
      for (int64_t i = 0; i < c.fwd.Sq; ++i) {
        for (int64_t d = 0; d < c.fwd.D; ++d) {
          const int64_t index[4] = {0, i, 0, d};
          store(p.fwd.q, index, 1.0);
          store(p.dout, index, d == 0 ? (subnormal_values ? 1.0 : subnormal) : 0.0);
        }
      }
      ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const Gradients g = p.gradients();
      for (size_t e = 0; e < g.dk.size(); ++e) ASSERT_EQ(g.dk[e], 0.0) << "dk element " << e;
      for (size_t e = 0; e < g.dq.size(); ++e) ASSERT_EQ(g.dq[e], 0.0) << "dq element " << e;
    }
  }
}

// The right operands of dV, dK and dQ (dout, Q, K) holding the bf16 subnormal s = 1.5 2^-127 in
// column 0 and zero elsewhere, with every score exactly 0 (P = 1 / Sk) and v_j = (+-1, 0, ...)
// alternating in j (Sk even, so out = 0 and delta = 0):
//   dout_i = (s, 0, ...):              dv_j[0] = sum_i P dout_i[0] = s Sq / Sk = s
//   q_i = (s, 0, ...), dout_i = e_0:   dS_ij = v_j[0] / Sk, dk_j[0] = scale s Sq / Sk v_j[0]
//   k_j = (s v_j[0], 0, ...), q = 0:   dq_i[0] = scale sum_j dS_ij k_j[0] = scale s
// (with Sq = Sk and dout = e_0 where not subnormal). A product that flushed s would give 0.
TEST(BwdTiles, SubnormalRightOperandsKeepTheirGradients) {
  const double subnormal = 1.5 * std::ldexp(1.0, -127);
  enum class Which { kDout, kQuery, kKey };
  for (anyattn_isa isa : supported_isas()) {
    for (int variant = 0; variant < 6; ++variant) {
      const Which which = static_cast<Which>(variant % 3);
      BwdCase c = one_head_bf16(isa, 64, 64);
      c.fwd.precision = variant < 3 ? ANYATTN_PRECISION_ACCURATE : ANYATTN_PRECISION_FAST;
      const char* names[] = {"subnormal dout", "subnormal q", "subnormal k"};
      SCOPED_TRACE(c.describe() + ", " + names[static_cast<int>(which)]);
      BwdProblem p(c);
      for (int64_t j = 0; j < c.fwd.Sk; ++j) {
        const double sign = j % 2 == 0 ? 1.0 : -1.0;
        for (int64_t d = 0; d < c.fwd.D; ++d) {
          const int64_t index[4] = {0, j, 0, d};
          store(p.fwd.k, index, which == Which::kKey && d == 0 ? sign * subnormal : 0.0);
          store(p.fwd.v, index, d == 0 ? sign : 0.0);
        }
      }
      for (int64_t i = 0; i < c.fwd.Sq; ++i) {
        for (int64_t d = 0; d < c.fwd.D; ++d) {
          const int64_t index[4] = {0, i, 0, d};
          store(p.fwd.q, index, which == Which::kQuery && d == 0 ? subnormal : 0.0);
          store(p.dout, index, d == 0 ? (which == Which::kDout ? subnormal : 1.0) : 0.0);
        }
      }
      ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const Gradients g = p.gradients();
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.fwd.D));
      // scale s is about 17 steps of 2^-133, the spacing of bf16 subnormals.
      const double bf16_step = std::ldexp(1.0, -133);
      int64_t wrong = 0, first_wrong = -1;
      for (int64_t r = 0; r < 64; ++r) {
        const double sign = r % 2 == 0 ? 1.0 : -1.0;
        const size_t first = static_cast<size_t>(r * c.fwd.D);
        bool right = false;
        switch (which) {
          case Which::kDout:
            right = g.dv[first] == subnormal;
            break;
          case Which::kQuery:
            right = std::abs(g.dk[first] - sign * scale * subnormal) <= bf16_step;
            break;
          case Which::kKey:
            right = std::abs(g.dq[first] - scale * subnormal) <= bf16_step;
            break;
        }
        if (!right && wrong++ == 0) first_wrong = r;
      }
      EXPECT_EQ(wrong, 0) << "column 0 of the gradient is wrong in " << wrong
                          << " rows, the first row " << first_wrong;
    }
  }
}

// cancelling_score_gradients_case: P = 1/3 over Sk = 3 keys, and with o = out_i[i] (1/3 rounded
// to bf16, read back) and delta_i = o, dS_ii = P (1 - o) and dS_ij = -P o (j != i), so dq_i[0] =
// scale sum_j dS_ij and dk_j[0] = scale sum_i dS_ij both cancel to scale P (1 - 3 o) = -scale
// 2^-9 / 3, about 300 times smaller than the terms. The split products keep it to f32 accuracy;
// dS rounded to bf16 alone would be off by about 50%, as ANYATTN_PRECISION_FAST allows
// (BwdPrecision.CancellingScoreGradientsMoveByTheRoundingOfTheirTerms).
TEST(BwdTiles, CancellingScoreGradientSumsStayAccurate) {
  for (anyattn_isa isa : supported_isas()) {
    const BwdCase c = cancelling_score_gradients_case(isa, ANYATTN_PRECISION_ACCURATE);
    SCOPED_TRACE(c.describe());
    BwdProblem p(c);
    store_cancelling_score_gradients(p);
    ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const Gradients g = p.gradients();
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.fwd.D));
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t diagonal[4] = {0, r, 0, r};
      const double o = reference::load(p.fwd.out, diagonal);
      ASSERT_EQ(o, 0.333984375) << "out row " << r;
      const double expected = scale / 3.0 * (1.0 - 3.0 * o);
      const size_t first = static_cast<size_t>(r * c.fwd.D);
      EXPECT_NEAR(g.dq[first], expected, 0.01 * std::abs(expected)) << "dq row " << r;
      EXPECT_NEAR(g.dk[first], expected, 0.01 * std::abs(expected)) << "dk row " << r;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
