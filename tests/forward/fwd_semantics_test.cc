// Forward semantics that need more than the 2x rule: fully masked rows, NaN propagation and empty
// problems.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const anyattn_dtype kDtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
const double kMinusInf = -std::numeric_limits<double>::infinity();

// ---- Fully masked rows --------------------------------------------------------------------------

// Rows i < Sq - Sk - window_right see no key (their diagonal is left of key 0).
void check_fully_masked_rows(Case c) {
  SCOPED_TRACE(c.describe());
  Problem p(c);
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const std::vector<double> out = p.out_values(), lse = p.lse_values();
  const int64_t right = c.causal ? 0 : c.window_right;
  const int64_t masked_rows = c.Sq - c.Sk - right;
  ASSERT_GT(masked_rows, 0);
  int64_t checked = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < c.Sq; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        const double lse_bh = lse[(b * c.Hq + h) * c.Sq + i];
        ASSERT_FALSE(std::isnan(lse_bh)) << "lse NaN at b=" << b << " h=" << h << " i=" << i;
        for (int64_t d = 0; d < c.Dv; ++d) {
          const double x = out[((b * c.Sq + i) * c.Hq + h) * c.Dv + d];
          ASSERT_FALSE(std::isnan(x)) << "out NaN at b=" << b << " i=" << i << " h=" << h;
          if (i < masked_rows) {
            ASSERT_EQ(x, 0.0) << "b=" << b << " i=" << i << " h=" << h;
          }
        }
        if (i < masked_rows) {
          const double expected = c.sinks ? p.sinks_buffer[h] : kMinusInf;
          ASSERT_EQ(lse_bh, expected) << "b=" << b << " h=" << h << " i=" << i;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, c.B * c.Hq * masked_rows);
  // The rows that do see keys are right too.
  EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
}

TEST(FwdFullyMasked, CausalWithMoreQueriesThanKeys) {
  for (anyattn_dtype dtype : kDtypes) {
    for (bool sinks : {false, true}) {
      Case c;
      c.B = 2;
      c.Sq = 100;
      c.Sk = 30;
      c.Hq = 4;
      c.Hk = 2;
      c.D = c.Dv = 64;
      c.causal = true;
      c.sinks = sinks;
      c.dtype = dtype;
      check_fully_masked_rows(c);
    }
  }
}

TEST(FwdFullyMasked, WindowExcludingEverythingForSomeRows) {
  for (anyattn_dtype dtype : kDtypes) {
    for (bool sinks : {false, true}) {
      Case c;
      c.B = 1;
      c.Sq = 257;
      c.Sk = 63;
      c.Hq = 2;
      c.Hk = 1;
      c.D = 80;
      c.Dv = 32;
      c.window_left = 5;
      c.window_right = 2;
      c.sinks = sinks;
      c.alibi = Alibi::kPerHead;
      c.softcap = 5.0f;
      c.dtype = dtype;
      check_fully_masked_rows(c);
    }
  }
}

TEST(FwdFullyMasked, SingleKeyCausal) {
  for (bool sinks : {false, true}) {
    Case c;
    c.Sq = 65;
    c.Sk = 1;
    c.Hq = c.Hk = 3;
    c.D = c.Dv = 8;
    c.causal = true;
    c.sinks = sinks;
    check_fully_masked_rows(c);
  }
}

// ---- Empty problems -----------------------------------------------------------------------------

TEST(FwdEmpty, NoKeysGivesZeroAndMinusInfOrSink) {
  for (anyattn_dtype dtype : kDtypes) {
    for (bool sinks : {false, true}) {
      Case c;
      c.B = 2;
      c.Sq = 7;
      c.Sk = 0;
      c.Hq = 4;
      c.Hk = 2;
      c.D = 32;
      c.Dv = 40;
      c.sinks = sinks;
      c.dtype = dtype;
      SCOPED_TRACE(c.describe());
      Problem p(c);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      for (double x : p.out_values()) ASSERT_EQ(x, 0.0);
      const std::vector<double> lse = p.lse_values();
      for (int64_t b = 0; b < c.B; ++b) {
        for (int64_t h = 0; h < c.Hq; ++h) {
          for (int64_t i = 0; i < c.Sq; ++i) {
            ASSERT_EQ(lse[(b * c.Hq + h) * c.Sq + i], sinks ? p.sinks_buffer[h] : kMinusInf);
          }
        }
      }
      EXPECT_TRUE(p.padding_untouched());
    }
  }
}

TEST(FwdEmpty, NoQueriesOrNoBatchWritesNothing) {
  for (anyattn_dtype dtype : kDtypes) {
    for (int which = 0; which < 3; ++which) {
      Case c;
      c.B = which == 0 ? 0 : 2;
      c.Sq = which == 1 ? 0 : 5;
      c.Sk = which == 2 ? 0 : 9;
      if (which == 2) c.Sq = 0;  // Sq = Sk = 0.
      c.Hq = 2;
      c.Hk = 1;
      c.D = c.Dv = 16;
      c.sinks = which == 1;
      c.causal = which == 0;
      c.dtype = dtype;
      SCOPED_TRACE(c.describe());
      Problem p(c);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_STREQ(anyattn_last_error(), "");
      EXPECT_TRUE(p.outputs_untouched());
    }
  }
}

// ---- NaN propagation ----------------------------------------------------------------------------

// Runs the clean problem, then with one NaN stored at `index` of `tensor` (0 = q, 1 = k, 2 = v),
// and checks: rows that read the NaN are NaN (every out element when the NaN is in q or k; column
// d when it is in v, with lse unaffected), every other output bit is the clean run's.
void check_nan_propagation(const Case& c, int tensor, const int64_t (&index)[4]) {
  SCOPED_TRACE(c.describe() + " NaN in " + "qkv"[tensor] + " at (" + std::to_string(index[0]) +
               "," + std::to_string(index[1]) + "," + std::to_string(index[2]) + "," +
               std::to_string(index[3]) + ")");
  Problem p(c);
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const std::vector<double> clean_out = p.out_values(), clean_lse = p.lse_values();
  ASSERT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));

  p.reset_outputs();
  const anyattn_tensor& t = tensor == 0 ? p.q : tensor == 1 ? p.k : p.v;
  store(t, index, std::numeric_limits<double>::quiet_NaN());
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const std::vector<double> out = p.out_values(), lse = p.lse_values();

  const reference::ScoreOptions options = reference::resolve_options(&p.params, c.D);
  const int64_t group = c.Hq / c.Hk;
  int64_t poisoned_rows = 0;
  auto same_bits = [](double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < c.Sq; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        bool reads_nan = false;
        if (tensor == 0) {
          reads_nan = b == index[0] && i == index[1] && h == index[2];
        } else {
          reads_nan = b == index[0] && h / group == index[2] &&
                      reference::key_visible(i, index[1], c.Sq, c.Sk, options);
        }
        poisoned_rows += reads_nan;
        const size_t l = static_cast<size_t>((b * c.Hq + h) * c.Sq + i);
        if (reads_nan && tensor < 2) {
          ASSERT_TRUE(std::isnan(lse[l])) << "lse b=" << b << " h=" << h << " i=" << i;
        } else {
          ASSERT_TRUE(same_bits(lse[l], clean_lse[l])) << "lse b=" << b << " h=" << h << " i=" << i;
        }
        for (int64_t d = 0; d < c.Dv; ++d) {
          const size_t o = static_cast<size_t>(((b * c.Sq + i) * c.Hq + h) * c.Dv + d);
          const bool expect_nan = reads_nan && (tensor < 2 || d == index[3]);
          if (expect_nan) {
            ASSERT_TRUE(std::isnan(out[o]))
                << "out b=" << b << " i=" << i << " h=" << h << " d=" << d << " got " << out[o];
          } else {
            ASSERT_TRUE(same_bits(out[o], clean_out[o]))
                << "out b=" << b << " i=" << i << " h=" << h << " d=" << d << " got " << out[o]
                << " clean " << clean_out[o];
          }
        }
      }
    }
  }
  EXPECT_GT(poisoned_rows, 0);
  EXPECT_TRUE(p.padding_untouched());
}

Case nan_case(anyattn_dtype dtype) {
  Case c;
  c.B = 2;
  c.Sq = 130;
  c.Sk = 130;
  c.Hq = 4;
  c.Hk = 2;
  c.D = 64;
  c.Dv = 48;
  c.causal = true;
  c.dtype = dtype;
  return c;
}

TEST(FwdNan, InOneKeyRowReachesOnlyRowsThatSeeIt) {
  for (anyattn_dtype dtype : kDtypes) {
    check_nan_propagation(nan_case(dtype), 1, {1, 70, 1, 3});
    Case windowed = nan_case(dtype);
    windowed.causal = false;
    windowed.window_left = 20;
    windowed.window_right = 10;  // Only rows 60..90 see key 70.
    check_nan_propagation(windowed, 1, {0, 70, 0, 0});
  }
}

TEST(FwdNan, InOneValueRowReachesOnlyRowsThatSeeIt) {
  // With bf16 probabilities allowed, where the paths pack NaN and infinite values as 0 and add
  // their products for the rows that see them: key 100 in a causal diagonal block, key 129 alone
  // in the last block (131 keys: an odd key count).
  Case fast = nan_case(ANYATTN_DTYPE_BF16);
  fast.precision = ANYATTN_PRECISION_FAST;
  check_nan_propagation(fast, 2, {0, 100, 1, 7});
  fast.Sk = 131;
  fast.causal = false;
  check_nan_propagation(fast, 2, {1, 129, 0, 47});
  for (anyattn_dtype dtype : kDtypes) {
    check_nan_propagation(nan_case(dtype), 2, {0, 100, 1, 7});
    Case split = nan_case(dtype);
    split.Sq = 1;
    split.Sk = 4096;  // Decode shape: a split-KV candidate.
    split.causal = false;
    check_nan_propagation(split, 2, {1, 3000, 0, 5});
    // Direct decode path (4 rows per kv head), key 99 in the last, partly masked block: row 0
    // must not see it, even through 0 * NaN.
    Case decode = nan_case(dtype);
    decode.Sq = 2;
    decode.Sk = 100;
    check_nan_propagation(decode, 2, {1, 99, 1, 5});
    // Dv below one vector on every path: V packed transposed, whose dot products must keep the
    // NaN from the rows that do not see its key (causal, and a window cutting the block).
    Case narrow = nan_case(dtype);
    narrow.D = 8;
    narrow.Dv = 3;
    check_nan_propagation(narrow, 2, {0, 100, 1, 2});
    narrow.causal = false;
    narrow.window_left = 20;
    narrow.window_right = 10;
    check_nan_propagation(narrow, 2, {1, 70, 1, 0});
  }
}

TEST(FwdNan, InOneQueryRowStaysInThatRow) {
  for (anyattn_dtype dtype : kDtypes) {
    check_nan_propagation(nan_case(dtype), 0, {1, 64, 3, 10});
    Case sinks = nan_case(dtype);
    sinks.sinks = true;
    sinks.alibi = Alibi::kPerHead;
    check_nan_propagation(sinks, 0, {0, 0, 0, 0});
  }
}

// ---- Optional outputs and defaults --------------------------------------------------------------

TEST(FwdOptional, NullParamsMeansDefaults) {
  Case c;
  c.B = 2;
  c.Sq = 33;
  c.Sk = 70;
  c.Hq = 4;
  c.Hk = 4;
  c.D = 96;
  c.Dv = 96;
  Problem p(c);
  ASSERT_EQ(anyattn_fwd(&p.q, &p.k, &p.v, &p.out, &p.lse, nullptr), ANYATTN_OK)
      << anyattn_last_error();
  EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
}

TEST(FwdOptional, OutWithoutLseMatchesOutWithLse) {
  Case c;
  c.Sq = 65;
  c.Sk = 200;
  c.Hq = 2;
  c.D = 64;
  c.Dv = 64;
  c.sinks = true;
  c.causal = true;
  Problem with_lse(c);
  c.with_lse = false;
  Problem without(c);
  ASSERT_EQ(with_lse.run(), ANYATTN_OK);
  ASSERT_EQ(without.run(), ANYATTN_OK);
  EXPECT_EQ(with_lse.out_buffer, without.out_buffer);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
