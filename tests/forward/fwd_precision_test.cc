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

TEST(FwdPrecision, FastBf16CallsFollowTheContract) {
  for (const Case& c : precision_sweep_cases(ANYATTN_PRECISION_FAST)) {
    SCOPED_TRACE(c.describe());
    EXPECT_TRUE(run_and_check(c));
  }
}

// The direct decode loop's P V on the value pairs (chunk_pv_pairs) would flush subnormal values,
// and an O that holds one: with 16 query rows per kv head, every value subnormal (each pass finds
// one and takes the FMAs), and with a window whose first block, a boundary block on the FMAs,
// holds the only non-zero values, all subnormal (the later passes must not take the pairs, which
// would flush O). The outputs are then subnormal too, and the rule's ulp is far below them.
TEST(FwdPrecision, FastDecodeKeepsSubnormalValues) {
  for (anyattn_isa isa : supported_isas()) {
    for (const bool window : {false, true}) {
      Case c;
      c.isa = isa;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.precision = ANYATTN_PRECISION_FAST;
      c.Sq = 1;
      c.Sk = 250;
      c.Hq = 16;
      c.Hk = 1;
      c.D = c.Dv = 64;
      if (window) c.window_left = 230;  // keys 19 to 249: block 0 crosses the boundary
      SCOPED_TRACE(c.describe());
      Problem p(c);
      for (int64_t j = 0; j < c.Sk; ++j) {
        for (int64_t d = 0; d < c.Dv; ++d) {
          const int64_t index[4] = {0, j, 0, d};
          const double value = (d % 7 - 3) * 0x1.0p-130;
          store(p.v, index, window && j >= 64 ? 0.0 : value);
        }
      }
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
    }
  }
}

// f32 and f16 calls compute as accurate whatever the option says: the same bits.
TEST(FwdPrecision, F32AndF16CallsIgnoreIt) {
  for (anyattn_isa isa : supported_isas()) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16}) {
      const Case c = precision_ignored_case(isa, dtype);
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
