// bf16 cases at the edges of the avx512_amx path's tile products (fwd_tiles_amx-inl.h), run on
// every path the host supports: head dims around the 32-element reduction chunks and the D >= 16
// threshold, value widths of odd 16-column groups, row counts off the 16-row groups, subnormal
// values confined to one key block (the tiles flush subnormals; such blocks and the rest of their
// tasks take f32 products), row maxima that move while P V is gathered over several blocks, and
// an output that cancels, where P rounded to bf16 (no lo part) would show.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

// Every path the host supports, each with P V accurate and with bf16 probabilities allowed.
std::vector<std::pair<anyattn_isa, anyattn_precision>> isa_precision_pairs() {
  std::vector<std::pair<anyattn_isa, anyattn_precision>> pairs;
  for (anyattn_isa isa : supported_isas()) {
    pairs.emplace_back(isa, ANYATTN_PRECISION_ACCURATE);
    pairs.emplace_back(isa, ANYATTN_PRECISION_FAST);
  }
  return pairs;
}

TEST(FwdTiles, HeadDimsAroundTheTileChunksMatchTheReference) {
  const int64_t head_dims[] = {15, 16, 17, 24, 31, 33, 63, 65};
  const int64_t value_dims[] = {16, 17, 80};
  const int64_t query_rows[] = {1, 17, 70};
  int n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (int64_t d : head_dims) {
      for (int64_t dv : value_dims) {
        Case c;
        c.isa = isa;
        c.dtype = ANYATTN_DTYPE_BF16;
        c.D = d;
        c.Dv = dv;
        c.Sq = query_rows[n % 3];
        c.Sk = n % 2 ? 130 : 70;
        c.Hq = 4;
        c.Hk = 2;
        c.causal = n % 4 == 1;
        c.seed = static_cast<uint64_t>(n);
        ++n;
        SCOPED_TRACE(c.describe());
        EXPECT_TRUE(run_and_check(c));
      }
    }
  }
}

// V's column 0 is zero but in key block 1 (keys 64..127), where it holds subnormals, and keys
// 128..255 follow in normal blocks: every row's out[..., 0] is a subnormal the reference predicts,
// not 0. Once a subnormal reaches a row's accumulator, later tile products would flush it. With
// bf16 probabilities allowed too, whose P V runs on dot products elsewhere.
TEST(FwdTiles, SubnormalValuesInOneKeyBlockReachTheOutput) {
  for (const auto& [isa, precision] : isa_precision_pairs()) {
    Case c;
    c.isa = isa;
    c.precision = precision;
    c.dtype = ANYATTN_DTYPE_BF16;
    c.B = 1;
    c.Sq = 40;
    c.Sk = 256;
    c.Hq = 2;
    c.Hk = 1;
    c.D = c.Dv = 64;
    SCOPED_TRACE(c.describe());
    Problem p(c);
    for (int64_t j = 0; j < c.Sk; ++j) {
      const int64_t index[4] = {0, j, 0, 0};
      const bool in_block_one = j >= 64 && j < 128;
      store(p.v, index, in_block_one ? 0x1.0p-128 * static_cast<double>(1 + j % 3) : 0.0);
    }
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const std::vector<double> out = p.out_values();
    const reference::DenseOutputs ref = p.reference();
    for (int64_t i = 0; i < c.Sq; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        const size_t o = static_cast<size_t>((i * c.Hq + h) * c.Dv);
        ASSERT_GT(ref.out[o], 0x1.0p-133);
        // bf16's subnormal step is 2^-133; the f32 sums round far below it.
        EXPECT_NEAR(out[o], ref.out[o], 0x1.0p-133) << "i=" << i << " h=" << h;
      }
    }
    EXPECT_TRUE(check_outputs(p, ref, p.naive_same_dtype()));
  }
}

// Key block b's keys are scaled by 1 + 3b, so most rows' maxima move in most blocks: the softmax
// rescales O, and the avx512_amx path's gathered (not yet multiplied) probabilities must follow.
TEST(FwdTiles, RisingBlockMaximaMatchTheReference) {
  for (anyattn_isa isa : supported_isas()) {
    for (int causal = 0; causal < 2; ++causal) {
      Case c;
      c.isa = isa;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.B = 1;
      c.Sq = 64;
      c.Sk = 512;
      c.Hq = 2;
      c.Hk = 1;
      c.D = c.Dv = 64;
      c.causal = causal == 1;
      SCOPED_TRACE(c.describe());
      Problem p(c);
      for (int64_t j = 0; j < c.Sk; ++j) {
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t index[4] = {0, j, 0, d};
          const double block_scale = 1.0 + 3.0 * static_cast<double>(j / 64);
          store(p.k, index, block_scale * std::sin(0.37 * static_cast<double>(j * 7 + d * 3)));
        }
      }
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
    }
  }
}

// Two keys with scores 0 and s = 2^-5 / sqrt(32), v_0 = e_0 and v_1 = -e_0
// (cancelling_probabilities_case): out[0] = P_0 - P_1 = -tanh(s / 2), about -0.00276, where P_0
// and P_1 are about 0.4986 and 0.5014. Rounded to bf16 alone they would be 0.498046875 and 0.5
// (out 30% off); in the accurate mode, split into hi + lo, they keep f32 accuracy, and out matches
// the reference to its bf16 rounding.
TEST(FwdTiles, CancellingProbabilitiesStayAccurate) {
  for (anyattn_isa isa : supported_isas()) {
    const Case c = cancelling_probabilities_case(isa, ANYATTN_PRECISION_ACCURATE);
    SCOPED_TRACE(c.describe());
    Problem p(c);
    store_cancelling_probabilities(p);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const std::vector<double> out = p.out_values();
    const double expected = -std::tanh(0x1.0p-5 / std::sqrt(32.0) / 2.0);
    for (int64_t i = 0; i < c.Sq; ++i) {
      EXPECT_NEAR(out[static_cast<size_t>(i * c.Dv)], expected, 0.01 * std::abs(expected))
          << "row " << i;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
