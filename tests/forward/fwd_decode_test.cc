// The direct decode path (src/cpu/decode/fwd_decode_kernel-inl.h): calls with at most the path's
// direct_rows query rows per kv head (GQA group x Sq; 12, 20 on avx2 and avx512) read K and V in
// place instead of packing them. Every ISA path, row counts 1..12, 14, 16 and 20 (which the kernel
// runs as tiles of 4, 3, 2 and 1 rows; past 12 only avx2 and avx512 take them direct), head dims
// that are and are not whole vectors, all dtypes, masks, score options and layouts, against the
// f64 reference by the 2x rule; and the equality of the direct path's results across ISAs.
#include <gtest/gtest.h>

#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const anyattn_dtype kDtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};

struct RowShape {
  int64_t hq, hk, sq;  // rows per kv head = hq / hk * sq
};
// 1 to 8, 10, 12, 14, 16 and 20 rows per kv head, from the GQA group, from Sq, and from both.
const RowShape kRowShapes[] = {{2, 2, 1}, {4, 2, 1},  {3, 1, 1}, {8, 2, 1},  {5, 1, 1},
                               {6, 2, 2}, {7, 1, 1},  {8, 1, 1}, {2, 1, 4},  {4, 4, 2},
                               {5, 1, 2}, {12, 1, 1}, {8, 2, 3}, {7, 1, 2},  {16, 1, 1},
                               {4, 1, 5}};
const int64_t kHeadDims[] = {8, 59, 64, 80, 111, 128, 256};
const int64_t kKeyCounts[] = {1, 63, 64, 65, 200, 1000};

std::vector<Case> decode_cases() {
  std::vector<Case> cases;
  int64_t n = 0;
  for (const RowShape& shape : kRowShapes) {
    for (int64_t d = 0; d < 7; ++d, ++n) {
      Case c;
      c.Hq = shape.hq;
      c.Hk = shape.hk;
      c.Sq = shape.sq;
      c.D = kHeadDims[d];
      c.Dv = kHeadDims[(d + n) % 7];
      c.Sk = kKeyCounts[(n * 5) % 6];
      c.dtype = kDtypes[n % 3];
      vary_decode_options(n, &c);
      c.seed = 7000 + n;
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(FwdDecode, EveryIsaMatchesReference) {
  const std::vector<Case> cases = decode_cases();
  for (anyattn_isa isa : supported_isas()) {
    int failures = 0;
    for (size_t n = 0; n < cases.size(); n += reduced_sweep() ? 5 : 1) {
      Case c = cases[n];
      c.isa = isa;
      const ::testing::AssertionResult r = run_and_check(c);
      if (!r && ++failures <= 8) ADD_FAILURE() << anyattn_isa_name(isa) << ": " << r.message();
    }
    EXPECT_EQ(failures, 0) << anyattn_isa_name(isa);
  }
}

TEST(FwdDecode, IsasAgree) {
  const std::vector<anyattn_isa> isas = supported_isas();
  const std::vector<Case> cases = decode_cases();
  for (size_t n = 0; n < cases.size(); n += 3) {
    Problem p(cases[n]);
    const reference::DenseOutputs ref = p.reference();
    const reference::DenseOutputs naive = p.naive_same_dtype();
    std::vector<double> first_out, first_lse;
    for (anyattn_isa isa : isas) {
      p.params.isa = isa;
      p.reset_outputs();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      if (first_out.empty()) {
        first_out = p.out_values();
        first_lse = p.lse_values();
        continue;
      }
      EXPECT_TRUE(check_cross(p, first_out, p.out_values(), first_lse, p.lse_values(), ref, naive))
          << cases[n].describe() << " isa " << anyattn_isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
