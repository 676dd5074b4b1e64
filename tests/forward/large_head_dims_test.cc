// Head dims above 256, up to the limits D = 576 and Dv = 512 (src/common/head_dims.h; absorbed
// MLA's q/k of 512 latent + 64 rotary dims and v of 512): anyattn_fwd on every ISA path the host
// supports and each forward path (direct decode, streaming, packed, split keys) against the f64
// reference by the 2x rule, including v given as a column view of k (the shared latent cache,
// which the packer reads once); and the first head dims past the limits rejected with the
// parameter, the value and the limit. The other entry points' large-head-dim tests sit with their
// own suites (varlen_test, kvcache_test, kvcache_varlen_test, mla_test, merge_test, bwd_grad_test,
// bwd_varlen_test).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const anyattn_dtype kDtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};

// (D, Dv): the limits, equal dims, and dims just off the vector and tile widths.
const int64_t kDims[][2] = {{576, 512}, {512, 512}, {575, 511}, {257, 33}, {320, 448}};

// One case per forward path: rows per kv head (GQA group x Sq) decide direct (<= the path's
// direct_rows: 12, 20 on avx2 and avx512), streaming (<= 64) or packed; num_splits = 3 splits the
// key range.
struct PathShape {
  const char* path;
  int64_t B, Sq, Sk, Hq, Hk;
  bool causal;
  int32_t splits;
};
const PathShape kPaths[] = {{"direct", 2, 1, 130, 4, 1, false, 0},
                            {"direct causal", 1, 3, 70, 2, 2, true, 0},
                            {"streaming", 1, 1, 150, 24, 1, false, 0},
                            {"packed", 1, 70, 90, 2, 1, true, 0},
                            {"split", 1, 1, 200, 16, 1, false, 3}};

Case path_case(const PathShape& s, int64_t d, int64_t dv, anyattn_dtype dtype, anyattn_isa isa) {
  Case c;
  c.B = s.B, c.Sq = s.Sq, c.Sk = s.Sk, c.Hq = s.Hq, c.Hk = s.Hk;
  c.causal = s.causal;
  c.num_splits = s.splits;
  c.D = d;
  c.Dv = dv;
  c.dtype = dtype;
  c.isa = isa;
  return c;
}

TEST(LargeHeadDims, ForwardOnEveryPathAgainstTheReference) {
  int64_t n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (const PathShape& shape : kPaths) {
      for (anyattn_dtype dtype : kDtypes) {
        const int64_t* dims = kDims[n++ % (sizeof(kDims) / sizeof(kDims[0]))];
        Case c = path_case(shape, dims[0], dims[1], dtype, isa);
        c.seed = static_cast<uint64_t>(n);
        EXPECT_TRUE(run_and_check(c)) << shape.path;
      }
    }
  }
}

TEST(LargeHeadDims, LimitsWithEveryScoreOption) {
  Case c;
  c.B = 2, c.Sq = 5, c.Sk = 80, c.Hq = 4, c.Hk = 2, c.D = 576, c.Dv = 512;
  c.window_left = 30;
  c.window_right = 2;
  c.softcap = 20.f;
  c.alibi = Alibi::kPerHead;
  c.sinks = true;
  c.layout = Layout::kPaddedStrides;
  EXPECT_TRUE(run_and_check(c));
  c.dtype = ANYATTN_DTYPE_BF16;
  c.layout = Layout::kNegativeStrides;
  EXPECT_TRUE(run_and_check(c));
}

// v as a column view of k (same data and strides, Dv <= D): the packer takes V from the K rows it
// stages. On every path and ISA, against the reference of the same tensors.
TEST(LargeHeadDims, ValueAsColumnViewOfKey) {
  int64_t n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (const PathShape& shape : kPaths) {
      for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
        for (const auto& dims : {std::vector<int64_t>{576, 512}, {80, 64}}) {
          Case c = path_case(shape, dims[0], dims[1], dtype, isa);
          c.seed = static_cast<uint64_t>(++n);
          Problem p(c);
          p.v = p.k;
          p.v.shape[3] = c.Dv;
          ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error() << "\n  " << c.describe();
          EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()))
              << shape.path << " (v a column view of k)";
        }
      }
    }
  }
}

// More than 64 rows per kv head against a cache whose packed f32 K/V exceed the forward's pack
// budget (48 MiB: 11600 keys of D 576 and Dv 512 take 52 MiB): the packed path packs and attends
// the kv head a piece of whole key splits at a time, merging after the last piece. A window and
// sinks leave some pieces with no visible key for some rows.
TEST(LargeHeadDims, CacheBeyondThePackBudgetRunsInPieces) {
  Case c;
  c.Sq = 1, c.Sk = 11600, c.Hq = 65, c.Hk = 1, c.D = 576, c.Dv = 512;
  c.dtype = ANYATTN_DTYPE_BF16;
  EXPECT_TRUE(run_and_check(c));
  if (reduced_sweep()) return;
  c.Sq = 2, c.Hq = 33;
  c.dtype = ANYATTN_DTYPE_F32;
  c.window_left = 5000;
  c.window_right = 0;
  c.sinks = true;
  EXPECT_TRUE(run_and_check(c));
}

TEST(LargeHeadDims, FirstDimsPastTheLimitsAreRejected) {
  for (const auto& dims : {std::vector<int64_t>{577, 512}, {576, 513}}) {
    Case c;
    c.Sk = 3;
    c.D = dims[0];
    c.Dv = dims[1];
    Problem p(c);  // Real buffers: the rejection is about the head dim, not memory.
    ASSERT_EQ(p.run(), ANYATTN_E_INVALID_ARGUMENT);
    const std::string expected = dims[0] > 576
                                     ? "anyattn_fwd: q.shape[3] (head dim D) is 577; supported: 0..576"
                                     : "anyattn_fwd: v.shape[3] (head dim Dv) is 513; supported: 0..512";
    EXPECT_EQ(anyattn_last_error(), expected);
    EXPECT_TRUE(p.outputs_untouched());
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
