// The backward's precision option (anyattn_fwd_params::precision; docs/backward.md, "Precision"):
// with ANYATTN_PRECISION_FAST, bf16 calls may round P Z and dX to bf16 before dV, dK and dQ and
// still follow the contract's rule on every path; f32 and f16 calls ignore it. The whole backward
// suite also runs under ANYATTN_PRECISION=fast (ctest's bwd_precision.fast_suites), and the
// BwdTiles subnormal cases check the fallbacks with it.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backward/bwd_test_support.h"
#include "reference/reference.h"

namespace anyattn {
namespace testing {
namespace {

// The forward's sweep (precision_sweep_cases) with dropout where it has a window and ALiBi, and
// padded gradients where its inputs are transposed; with bwd_own_forward, as the autograd
// functions pass it, since without it a bf16 call's dsinks carries the rounding of the out handed
// over, whatever the precision (docs/backward.md, "Short rows of the call's own forward").
std::vector<BwdCase> fast_cases() {
  std::vector<BwdCase> cases;
  for (const Case& c : precision_sweep_cases(ANYATTN_PRECISION_FAST)) {
    BwdCase b;
    b.fwd = c;
    b.own_forward = true;
    b.dropout_p = c.alibi != Alibi::kNone ? 0.25f : 0.f;
    b.padded_grads = c.layout == Layout::kTransposedBatch;
    cases.push_back(b);
  }
  return cases;
}

// The backward's rounding on its own: out and lse from the accurate forward (the reference's with
// dropout), as a caller who trains with an accurate forward hands them over.
TEST(BwdPrecision, FastBf16GradientsFollowTheContract) {
  for (const BwdCase& c : fast_cases()) {
    BwdProblem p(c);
    p.fwd.params.precision = ANYATTN_PRECISION_ACCURATE;
    ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
    p.fwd.params.precision = ANYATTN_PRECISION_FAST;
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(check_gradients(p, p.reference(), p.naive_same_dtype()));
  }
}

// f32 and f16 calls compute as accurate whatever the option says: the same bits.
TEST(BwdPrecision, F32AndF16CallsIgnoreIt) {
  for (anyattn_isa isa : supported_isas()) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16}) {
      BwdCase b;
      b.fwd = precision_ignored_case(isa, dtype);
      SCOPED_TRACE(b.describe());
      BwdProblem p(b);
      ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const std::vector<unsigned char> accurate = p.gradient_bytes();
      p.fwd.params.precision = ANYATTN_PRECISION_FAST;
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_TRUE(p.gradient_bytes() == accurate);
    }
  }
}

// The case of BwdTiles.CancellingScoreGradientSumsStayAccurate (cancelling_score_gradients_case):
// dS_ii = P (1 - o) and dS_ij = -P o with P = 1/3 and o = out_i[i], so that dq_i[0] = scale
// sum_j dS_ij and dk_j[0] cancel to about 1/300 of their terms. FAST rounds each dS to bf16, as
// the naive bf16 backward does: the result may move by 2^-9 of each term, scale (1 + o) / 3 2^-9
// in all (about half of the result here), plus the rounding of the bf16 output; no more.
TEST(BwdPrecision, CancellingScoreGradientsMoveByTheRoundingOfTheirTerms) {
  for (anyattn_isa isa : supported_isas()) {
    const BwdCase b = cancelling_score_gradients_case(isa, ANYATTN_PRECISION_ACCURATE);
    const Case& c = b.fwd;
    SCOPED_TRACE(b.describe());
    BwdProblem p(b);
    store_cancelling_score_gradients(p);
    ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const Gradients accurate = p.gradients();
    p.fwd.params.precision = ANYATTN_PRECISION_FAST;
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const Gradients fast = p.gradients();
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t diagonal[4] = {0, r, 0, r};
      const double o = reference::load(p.fwd.out, diagonal);
      const size_t first = static_cast<size_t>(r * c.D);
      const double output_rounding = std::ldexp(std::abs(accurate.dq[first]), -8);
      const double bound = scale * (1.0 + o) / 3.0 * std::ldexp(1.0, -9) + output_rounding;
      EXPECT_NEAR(fast.dq[first], accurate.dq[first], bound) << "dq row " << r;
      EXPECT_NEAR(fast.dk[first], accurate.dk[first], bound) << "dk row " << r;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
