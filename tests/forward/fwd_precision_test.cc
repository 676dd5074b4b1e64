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
