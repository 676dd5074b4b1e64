// The forward's precision option (anyattn_fwd_params::precision; docs/semantics.md, section 1):
// with ANYATTN_PRECISION_FAST, bf16 calls may round the probabilities to bf16 before P V and
// still follow the contract's rule on every path; f32 and f16 calls ignore it; other values are
// rejected. The varlen and KV-cache suites also run whole under ANYATTN_PRECISION=fast (ctest's
// fwd_precision.fast_suites), and FwdNan and FwdTiles check NaN and subnormal values in V with it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

struct Shape {
  int64_t Sq, Sk, Hq, Hk, D, Dv;
};

// Shapes of the packed path (more query rows per kv head than the decode loop takes), key counts
// that end blocks on odd keys and on partial vectors, Dv of one vector, of several, not a
// multiple of 16 and below one vector, and the largest head dims.
constexpr Shape kShapes[] = {
    {64, 64, 2, 1, 64, 64},      {130, 131, 4, 2, 128, 128}, {70, 257, 8, 2, 96, 48},
    {33, 77, 2, 2, 40, 16},      {40, 95, 2, 1, 32, 8},      {17, 200, 4, 1, 256, 200},
    {20, 129, 2, 1, 576, 512},   {96, 96, 1, 1, 16, 24},
};

std::vector<Case> fast_cases() {
  std::vector<Case> cases;
  int n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (const Shape& shape : kShapes) {
      for (int options = 0; options < 5; ++options) {
        Case c;
        c.isa = isa;
        c.dtype = ANYATTN_DTYPE_BF16;
        c.precision = ANYATTN_PRECISION_FAST;
        c.Sq = shape.Sq;
        c.Sk = shape.Sk;
        c.Hq = shape.Hq;
        c.Hk = shape.Hk;
        c.D = shape.D;
        c.Dv = shape.Dv;
        c.B = options == 4 ? 2 : 1;
        c.causal = options == 1;
        if (options == 2) {
          c.window_left = 40;
          c.window_right = 3;
          c.alibi = Alibi::kPerHead;
        }
        if (options == 3) {
          c.softcap = 5.f;
          c.sinks = true;
          c.num_splits = 2;
        }
        c.layout = options == 4 ? Layout::kTransposedBatch : Layout::kContiguous;
        c.seed = static_cast<uint64_t>(++n);
        cases.push_back(c);
      }
    }
  }
  return cases;
}

TEST(FwdPrecision, FastBf16CallsFollowTheContract) {
  for (const Case& c : fast_cases()) {
    SCOPED_TRACE(c.describe());
    EXPECT_TRUE(run_and_check(c));
  }
}

// f32 and f16 calls compute as accurate whatever the option says: the same bits.
TEST(FwdPrecision, F32AndF16CallsIgnoreIt) {
  for (anyattn_isa isa : supported_isas()) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16}) {
      Case c;
      c.isa = isa;
      c.dtype = dtype;
      c.Sq = 70;
      c.Sk = 150;
      c.Hq = 4;
      c.Hk = 2;
      c.D = c.Dv = 64;
      c.causal = true;
      c.precision = ANYATTN_PRECISION_ACCURATE;
      SCOPED_TRACE(c.describe());
      Problem p(c);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const std::vector<unsigned char> accurate = p.output_bytes();
      p.reset_outputs();
      p.params.precision = ANYATTN_PRECISION_FAST;
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_TRUE(p.output_bytes() == accurate);
    }
  }
}

TEST(FwdPrecision, UnknownValuesAreRejected) {
  for (int32_t value : {-1, 3, 1000}) {
    Case c;
    c.dtype = ANYATTN_DTYPE_BF16;
    Problem p(c);
    p.params.precision = value;
    EXPECT_EQ(p.run(), ANYATTN_E_INVALID_ARGUMENT);
    const std::string error = anyattn_last_error();
    EXPECT_NE(error.find("params->precision is " + std::to_string(value)), std::string::npos)
        << error;
    EXPECT_NE(error.find("ANYATTN_PRECISION_FAST"), std::string::npos) << error;
    EXPECT_TRUE(p.outputs_untouched());
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
