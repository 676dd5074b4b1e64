// bf16 backward cases at the edges of the avx512_amx path's tile products (bwd_tiles_amx-inl.h:
// S = Q K^T and dP = dout V^T on AMX tiles), run on every path the host supports: head dims
// around the 32-element reduction chunks, query and key counts off the 16-row groups and 64-key
// blocks, and subnormal V or dout, which the tiles would flush (such blocks take the f32 products).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "bwd_test_support.h"

namespace anyattn {
namespace testing {
namespace {

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
        c.fwd.Sq = n % 2 ? 17 : 70;
        c.fwd.Sk = n % 3 ? 130 : 63;
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
    for (bool subnormal_values : {true, false}) {
      BwdCase c;
      c.fwd.isa = isa;
      c.fwd.dtype = ANYATTN_DTYPE_BF16;
      c.fwd.Sq = 64;
      c.fwd.Sk = 64;
      c.fwd.Hq = 1;
      c.fwd.Hk = 1;
      c.fwd.D = 32;
      c.fwd.Dv = 32;
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

}  // namespace
}  // namespace testing
}  // namespace anyattn
