// The direct decode loop's bf16 scores on pairwise dot products (src/cpu/decode/
// fwd_decode_bf16_dot*.cc: VDPBF16PS on the avx512 path, BFDOT on the neon path): with them on
// and off, bf16 decode calls on that path match the f64 reference by the 2x rule and each other
// by the cross-ISA rule; and the inputs the dot products would get wrong (subnormal q,
// |q| >= 2^64, softmax_scale above 2^16, each against subnormal or huge keys) take the f32 FMA
// scores; the choice, made per kv head, leaves results independent of the thread count; and the
// per-element test behind that choice is exact on every bf16 bit pattern. Linked against the
// library's objects, to reach the internal switch.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/half_convert.h"
#include "common/test_support.h"
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "internal/bf16_dot_flush_cases.h"

namespace anyattn {
namespace testing {
namespace {

// Restores the defaults (dot-product scores where the CPU takes them, the default thread count)
// after each test.
class FwdDecodeBf16Dot : public ::testing::Test {
 protected:
  void TearDown() override {
    cpu::set_bf16_dot_scores_for_tests(cpu::Bf16DotScores::kCpuDefault);
    anyattn_set_num_threads(0);
  }
};

// The path whose direct loop has the dot-product scores on this architecture.
#if defined(__aarch64__)
constexpr anyattn_isa kDotIsa = ANYATTN_ISA_NEON;
#else
constexpr anyattn_isa kDotIsa = ANYATTN_ISA_AVX512;
#endif


// bf16 decode shapes on that path: 1 to 12 rows per kv head, 1 to 8 kv heads per task, head dims on
// and off the dot products' operands (32 elements for VDPBF16PS, 8 for BFDOT), partial and several
// key blocks, with the masks, score options and layouts of the other decode tests
// (vary_decode_options).
std::vector<Case> dot_cases() {
  struct Rows {
    int64_t hq, hk, sq;
  };
  const Rows row_shapes[] = {{1, 1, 1},  {4, 1, 1}, {8, 2, 1}, {32, 8, 1}, {6, 2, 2},
                             {12, 1, 1}, {4, 4, 3}, {3, 1, 4}, {16, 8, 1}};
  const int64_t head_dims[] = {1, 8, 31, 32, 33, 59, 64, 65, 96, 127, 128, 129, 200, 256};
  const int64_t key_counts[] = {1, 17, 64, 65, 300, 1000};
  std::vector<Case> cases;
  int64_t n = 0;
  for (const Rows& shape : row_shapes) {
    for (int64_t d = 0; d < 14; ++d, ++n) {
      Case c;
      c.Hq = shape.hq;
      c.Hk = shape.hk;
      c.Sq = shape.sq;
      c.D = head_dims[d];
      c.Dv = head_dims[(d + n) % 14];
      c.Sk = key_counts[(n * 5) % 6];
      c.dtype = ANYATTN_DTYPE_BF16;
      vary_decode_options(n, &c);
      c.isa = kDotIsa;
      c.seed = 9100 + n;
      cases.push_back(c);
    }
  }
  return cases;
}

TEST_F(FwdDecodeBf16Dot, BothScorePathsMatchReferenceAndEachOther) {
  if (!has_isa_path(kDotIsa)) {
    GTEST_SKIP() << "no " << anyattn_isa_name(kDotIsa) << " path on this CPU";
  }
  cpu::set_bf16_dot_scores_for_tests(cpu::Bf16DotScores::kWhereAvailable);
  if (!cpu::bf16_dot_scores_available()) GTEST_SKIP() << "no bf16 dot products on this CPU";
  int failures = 0;
  const std::vector<Case> cases = dot_cases();
  for (size_t n = 0; n < cases.size(); n += reduced_sweep() ? 4 : 1) {
    Problem p(cases[n]);
    const reference::DenseOutputs ref = p.reference();
    const reference::DenseOutputs naive = p.naive_same_dtype();
    std::vector<double> outs[2], lses[2];
    for (int dot = 1; dot >= 0; --dot) {
      cpu::set_bf16_dot_scores_for_tests(dot == 1 ? cpu::Bf16DotScores::kWhereAvailable
                                                  : cpu::Bf16DotScores::kOff);
      p.reset_outputs();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const ::testing::AssertionResult r = check_outputs(p, ref, naive);
      if (!r && ++failures <= 8) {
        ADD_FAILURE() << cases[n].describe() << (dot ? " dot" : " fma") << ": " << r.message();
      }
      outs[dot] = p.out_values();
      lses[dot] = p.lse_values();
    }
    const ::testing::AssertionResult agree =
        check_cross(p, outs[0], outs[1], lses[0], lses[1], ref, naive);
    if (!agree && ++failures <= 8) ADD_FAILURE() << cases[n].describe() << ": " << agree.message();
  }
  EXPECT_EQ(failures, 0);
}

// The per-element test that keeps a kv head off the dot products, over every bf16 bit pattern,
// against its definition on the value: subnormal, or finite with |q| >= 2^64.
TEST(FwdDecodeBf16DotQueries, UnfitElementsAreSubnormalOrAtLeast2To64) {
  int64_t unfit = 0;
  for (uint32_t bits = 0; bits <= 0xFFFFu; ++bits) {
    const float value = convert::bf16_to_f32(static_cast<uint16_t>(bits));
    const bool expected = std::fpclassify(value) == FP_SUBNORMAL ||
                          (std::isfinite(value) && std::fabs(value) >= std::ldexp(1.0f, 64));
    ASSERT_EQ(cpu::bf16_query_unfit_for_dot(static_cast<uint16_t>(bits)), expected)
        << "bits 0x" << std::hex << bits << " value " << value;
    unfit += expected;
  }
  // 2 * 127 subnormals and 2 * 64 * 128 finite values from 2^64 up.
  EXPECT_EQ(unfit, 2 * 127 + 2 * 64 * 128);
}

// Each input here would lose its scores on the dot products (they flush subnormal inputs) while the
// true scores are of order 1, so only the f32 FMA scores match the reference.
TEST_F(FwdDecodeBf16Dot, InputsVdpbf16psWouldFlushTakeTheFmaScores) {
  cpu::set_bf16_dot_scores_for_tests(cpu::Bf16DotScores::kWhereAvailable);
  for (const Bf16DotFlushCase& extreme : kBf16DotFlushCases) {
    for (anyattn_isa isa : supported_isas()) {
      Case c;
      c.Hq = 4;
      c.Hk = 1;
      c.D = 16;
      c.Dv = 16;
      c.Sk = 100;
      c.dtype = ANYATTN_DTYPE_BF16;
      c.softmax_scale = extreme.softmax_scale;
      c.isa = isa;
      SCOPED_TRACE(std::string(extreme.what) + " " + anyattn_isa_name(isa));
      Problem p(c);
      fill_scaled(p, extreme.q_unit, extreme.k_unit);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const reference::DenseOutputs ref = p.reference();
      // Flushed scores would all be 0: uniform attention, the output of q = 0.
      const double gap = gap_to_flushed_scores(c, ref, extreme.k_unit);
      ASSERT_GT(gap, 0.05) << "the case does not tell flushed scores apart";
      EXPECT_TRUE(check_outputs(p, ref, p.naive_same_dtype()));
    }
  }
}

// Whether a kv head scores on the dot products depends only on its own queries, never on which kv
// heads share its task (the thread count decides that): with one kv head's q holding a subnormal,
// the result is bitwise the same on 1 to 4 threads.
TEST_F(FwdDecodeBf16Dot, ScorePathPerKvHeadKeepsResultsIndependentOfThreads) {
  if (!has_isa_path(kDotIsa)) {
    GTEST_SKIP() << "no " << anyattn_isa_name(kDotIsa) << " path on this CPU";
  }
  cpu::set_bf16_dot_scores_for_tests(cpu::Bf16DotScores::kWhereAvailable);
  Case c;
  c.Hq = 32;
  c.Hk = 8;
  c.D = 128;
  c.Dv = 128;
  c.Sk = 300;
  c.dtype = ANYATTN_DTYPE_BF16;
  c.isa = kDotIsa;
  Problem p(c);
  const int64_t index[4] = {0, 0, 13, 5};  // query head 13: kv head 3
  store(p.q, index, std::ldexp(1.0, -130));
  std::vector<unsigned char> first;
  for (int threads = 1; threads <= 4; ++threads) {
    anyattn_set_num_threads(threads);
    p.reset_outputs();
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    if (first.empty()) {
      first = p.output_bytes();
      EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
    } else {
      EXPECT_EQ(p.output_bytes(), first) << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
