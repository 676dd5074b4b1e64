// The backward's results are the same bits across repeated runs and thread counts 1, 2 and 3,
// with and without dropout, and after other calls left NaN in the workspace kept between calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "backward/bwd_test_support.h"

namespace anyattn {
namespace testing {
namespace {

void expect_bitwise_across_threads(const BwdCase& c) {
  BwdProblem p(c);
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
  std::vector<unsigned char> first;
  for (int threads : {1, 2, 3, 2, 1, 3}) {
    anyattn_set_num_threads(threads);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    if (first.empty()) {
      first = p.gradient_bytes();
    } else {
      EXPECT_TRUE(p.gradient_bytes() == first) << threads << " threads: " << c.describe();
    }
  }
  anyattn_set_num_threads(0);
}

Case determinism_case() {
  Case c;
  c.B = 2;
  c.Sq = 150;
  c.Sk = 200;
  c.Hq = 4;
  c.Hk = 2;
  c.D = 64;
  c.Dv = 40;
  c.causal = true;
  c.softcap = 5.f;
  c.alibi = Alibi::kPerHead;
  c.sinks = true;
  return c;
}

TEST(BwdDeterminism, BitwiseAcrossThreadCountsF32) {
  BwdCase c;
  c.fwd = determinism_case();
  expect_bitwise_across_threads(c);
}

TEST(BwdDeterminism, BitwiseAcrossThreadCountsBf16) {
  BwdCase c;
  c.fwd = determinism_case();
  c.fwd.dtype = ANYATTN_DTYPE_BF16;
  c.fwd.causal = false;
  c.fwd.window_left = 40;
  c.fwd.window_right = 10;
  expect_bitwise_across_threads(c);
}

// B * Hk >= 16: one key chunk and one head split per (batch, kv head), so each task writes its
// dq, dk and dv directly (the cases above split each group's 2 query heads and the keys, and sum
// dK/dV and dq partials).
TEST(BwdDeterminism, BitwiseAcrossThreadCountsOneChunk) {
  BwdCase c;
  c.fwd = determinism_case();
  c.fwd.B = 2;
  c.fwd.Hq = 16;
  c.fwd.Hk = 8;
  c.fwd.Sq = 100;
  c.fwd.Sk = 140;
  expect_bitwise_across_threads(c);
}

// MQA: 6 head splits of one query head, 3 key chunks.
TEST(BwdDeterminism, BitwiseAcrossThreadCountsHeadSplits) {
  BwdCase c;
  c.fwd = determinism_case();
  c.fwd.B = 1;
  c.fwd.Hq = 6;
  c.fwd.Hk = 1;
  c.fwd.dtype = ANYATTN_DTYPE_BF16;
  expect_bitwise_across_threads(c);
}

// With bwd_own_forward dsinks is summed from every task's terms (tile_gradients), in task order.
TEST(BwdDeterminism, BitwiseAcrossThreadCountsOwnForward) {
  BwdCase c;
  c.fwd = determinism_case();
  c.fwd.B = 1;
  c.fwd.Hq = 6;
  c.fwd.Hk = 1;
  c.own_forward = true;
  expect_bitwise_across_threads(c);
  c.fwd.dtype = ANYATTN_DTYPE_BF16;
  c.dropout_p = 0.2f;
  expect_bitwise_across_threads(c);
}

TEST(BwdDeterminism, BitwiseAcrossThreadCountsWithDropout) {
  BwdCase c;
  c.fwd = determinism_case();
  c.fwd.Sq = 90;
  c.fwd.Sk = 130;
  c.dropout_p = 0.25f;
  expect_bitwise_across_threads(c);
}

// The workspace is kept between calls (runtime/kept_workspace.h): a call must not depend on what
// an earlier one left there. A larger forward and backward whose inputs are all NaN fill it with
// NaN; the call after them must give the bits it gave before them.
TEST(BwdDeterminism, BitwiseAfterOtherCallsLeftNanInTheWorkspace) {
  BwdCase c;
  c.fwd = determinism_case();
  BwdProblem p(c);
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const std::vector<unsigned char> first = p.gradient_bytes();

  BwdCase larger;
  larger.fwd = determinism_case();
  larger.fwd.Sq = 300;
  larger.fwd.Sk = 400;
  larger.fwd.Hq = 8;
  larger.fwd.D = 128;
  larger.fwd.Dv = 128;
  BwdProblem filler(larger);
  std::fill(filler.fwd.q_buffer.begin(), filler.fwd.q_buffer.end(), 0xFF);  // f32 NaN
  std::fill(filler.fwd.kv_buffer.begin(), filler.fwd.kv_buffer.end(), 0xFF);
  std::fill(filler.dout_buffer.begin(), filler.dout_buffer.end(), 0xFF);
  ASSERT_EQ(filler.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
  ASSERT_EQ(filler.run(), ANYATTN_OK) << anyattn_last_error();

  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_TRUE(p.gradient_bytes() == first) << c.describe();
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
