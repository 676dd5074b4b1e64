// The packed forward's bf16 scores on pairwise dot products (src/cpu/forward/
// fwd_narrow_scores*.{h,cc}: BFDOT on the neon path where the CPU has FEAT_BF16, VDPBF16PS on the
// avx512 path where it has AVX512_BF16) and f16 scores on FMLAL (the neon path, FEAT_FHM): with
// each switched on and off, prefill calls on that path match the f64 reference by the 2x rule;
// f16 on FMLAL gives the FMLA path's bits; bf16 on the dot products matches the FMA path by the
// cross-ISA rule; query rows the dot products would get wrong (subnormal, |q| >= 2^64) and
// softmax_scale above 2^16 take f32 scores with the FMA path's bits; and that choice, made per
// row, leaves results independent of the thread count. The backward runs S and dP on the same
// kernels: gradients against the reference with them on and off, f16 gradients bitwise equal both
// ways. Skipped where the path or the extension is missing. Linked against the library's objects,
// to reach the internal switches.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backward/bwd_test_support.h"
#include "common/test_support.h"
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/forward/fwd_narrow_scores.h"
#include "internal/bf16_dot_flush_cases.h"

namespace anyattn {
namespace testing {
namespace {

// Restores the defaults (the extensions on where the CPU has them, the default thread count).
class FwdNarrowScores : public ::testing::Test {
 protected:
  void TearDown() override {
    cpu::set_bf16_dot_scores_for_tests(cpu::Bf16DotScores::kCpuDefault);
    cpu::set_f16_fml_scores_enabled(true);
    anyattn_set_num_threads(0);
  }
};

// The path whose packed forward scores bf16 calls on pairwise dot products on this architecture.
anyattn_isa bf16_dot_isa() {
#if defined(__x86_64__) || defined(_M_X64)
  return ANYATTN_ISA_AVX512;
#else
  return ANYATTN_ISA_NEON;
#endif
}

// The path of a dtype's narrow scores: bf16_dot_isa for bf16, neon for f16.
anyattn_isa narrow_isa(anyattn_dtype dtype) {
  return dtype == ANYATTN_DTYPE_BF16 ? bf16_dot_isa() : ANYATTN_ISA_NEON;
}

// Turns the extension of `dtype` on or off and says whether it is available.
bool set_narrow_scores(anyattn_dtype dtype, bool on) {
  if (dtype == ANYATTN_DTYPE_BF16) {
    cpu::set_bf16_dot_scores_for_tests(on ? cpu::Bf16DotScores::kWhereAvailable
                                          : cpu::Bf16DotScores::kOff);
    return cpu::bf16_dot_scores_available();
  }
  cpu::set_f16_fml_scores_enabled(on);
  return cpu::f16_fml_scores_available();
}

// Prefill shapes on the path of the dtype's narrow scores (more query rows per kv head than the
// direct decode loop takes):
// head dims on and off the kernels' 8-element steps (4 the smallest that takes them), partial and
// several key blocks, and the masks, score options and layouts of vary_decode_options.
std::vector<Case> prefill_cases(anyattn_dtype dtype) {
  struct Rows {
    int64_t hq, hk, sq;
  };
  const Rows row_shapes[] = {{1, 1, 16}, {4, 1, 33}, {8, 2, 64}, {4, 4, 100}, {6, 2, 130}};
  const int64_t head_dims[] = {4, 8, 31, 64, 80, 128, 129, 256};
  const int64_t key_counts[] = {16, 64, 65, 200, 300};
  std::vector<Case> cases;
  int64_t n = 0;
  for (const Rows& shape : row_shapes) {
    for (int64_t d = 0; d < 8; ++d, ++n) {
      Case c;
      c.Hq = shape.hq;
      c.Hk = shape.hk;
      c.Sq = shape.sq;
      c.D = head_dims[d];
      c.Dv = head_dims[(d + n) % 8];
      c.Sk = key_counts[(n * 3) % 5];
      c.dtype = dtype;
      vary_decode_options(n, &c);
      c.isa = narrow_isa(dtype);
      c.seed = 9300 + n;
      cases.push_back(c);
    }
  }
  return cases;
}

// Runs every case with the extension on and off: both match the reference; f16 gives the same
// bytes both ways, bf16 results agree by the cross-ISA rule.
void check_both_ways(anyattn_dtype dtype) {
  int failures = 0;
  const std::vector<Case> cases = prefill_cases(dtype);
  for (size_t n = 0; n < cases.size(); n += reduced_sweep() ? 3 : 1) {
    Problem p(cases[n]);
    const reference::DenseOutputs ref = p.reference();
    const reference::DenseOutputs naive = p.naive_same_dtype();
    std::vector<double> outs[2], lses[2];
    std::vector<unsigned char> bytes[2];
    for (int on = 1; on >= 0; --on) {
      set_narrow_scores(dtype, on == 1);
      p.reset_outputs();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const ::testing::AssertionResult r = check_outputs(p, ref, naive);
      if (!r && ++failures <= 8) {
        ADD_FAILURE() << cases[n].describe() << (on ? " extension" : " fma") << ": " << r.message();
      }
      outs[on] = p.out_values();
      lses[on] = p.lse_values();
      bytes[on] = p.output_bytes();
    }
    if (dtype == ANYATTN_DTYPE_F16) {
      if (bytes[0] != bytes[1] && ++failures <= 8) {
        ADD_FAILURE() << cases[n].describe() << ": FMLAL and FMLA results differ";
      }
      continue;
    }
    const ::testing::AssertionResult agree =
        check_cross(p, outs[0], outs[1], lses[0], lses[1], ref, naive);
    if (!agree && ++failures <= 8) ADD_FAILURE() << cases[n].describe() << ": " << agree.message();
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(FwdNarrowScores, Bf16OnDotProductsMatchesReferenceAndFma) {
  if (!has_isa_path(bf16_dot_isa())) GTEST_SKIP() << "no path with bf16 dot scores on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_BF16, true)) GTEST_SKIP() << "no bf16 dot products here";
  check_both_ways(ANYATTN_DTYPE_BF16);
}

TEST_F(FwdNarrowScores, F16OnFmlalGivesTheFmlaBits) {
  if (!has_isa_path(ANYATTN_ISA_NEON)) GTEST_SKIP() << "no neon path on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_F16, true)) GTEST_SKIP() << "no FMLAL on this CPU";
  check_both_ways(ANYATTN_DTYPE_F16);
}

// A bf16 prefill problem on bf16_dot_isa's path: B1 Sq20 Hq4 Hk1 D16 Sk100.
Case unfit_case(float softmax_scale) {
  Case c;
  c.Sq = 20;
  c.Hq = 4;
  c.Hk = 1;
  c.D = 16;
  c.Dv = 16;
  c.Sk = 100;
  c.dtype = ANYATTN_DTYPE_BF16;
  c.softmax_scale = softmax_scale;
  c.isa = bf16_dot_isa();
  c.precision = ANYATTN_PRECISION_ACCURATE;  // the bits compared are P V's in f32
  return c;
}

// Inputs the dot products would flush to zero scores, where the true scores are of order 1: the
// calls match the reference, and give the FMA path's bits.
TEST_F(FwdNarrowScores, Bf16InputsTheDotProductsWouldFlushTakeTheFmaScores) {
  if (!has_isa_path(bf16_dot_isa())) GTEST_SKIP() << "no path with bf16 dot scores on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_BF16, true)) GTEST_SKIP() << "no bf16 dot products here";
  for (const Bf16DotFlushCase& extreme : kBf16DotFlushCases) {
    SCOPED_TRACE(extreme.what);
    const Case c = unfit_case(extreme.softmax_scale);
    Problem p(c);
    fill_scaled(p, extreme.q_unit, extreme.k_unit);
    const reference::DenseOutputs ref = p.reference();
    // Flushed scores would all be 0: the output of q = 0.
    const double gap = gap_to_flushed_scores(c, ref, extreme.k_unit);
    ASSERT_GT(gap, 0.05) << "the case does not tell flushed scores apart";
    std::vector<unsigned char> bytes[2];
    for (int on = 1; on >= 0; --on) {
      set_narrow_scores(ANYATTN_DTYPE_BF16, on == 1);
      p.reset_outputs();
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      EXPECT_TRUE(check_outputs(p, ref, p.naive_same_dtype())) << (on ? "dot" : "fma");
      bytes[on] = p.output_bytes();
    }
    EXPECT_EQ(bytes[0], bytes[1]) << "the f32 scores of unfit rows differ from the FMA path's";
  }
}

// Whether a row keeps its dot-product scores depends on its own q only, never on which rows share
// its task (the thread count decides that): with one row of one head holding a subnormal, the
// result is bitwise the same on 1 to 4 threads.
TEST_F(FwdNarrowScores, Bf16ScorePathPerRowKeepsResultsIndependentOfThreads) {
  if (!has_isa_path(bf16_dot_isa())) GTEST_SKIP() << "no path with bf16 dot scores on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_BF16, true)) GTEST_SKIP() << "no bf16 dot products here";
  Case c;
  c.Sq = 150;
  c.Sk = 150;
  c.Hq = 8;
  c.Hk = 2;
  c.D = 64;
  c.Dv = 64;
  c.causal = true;
  c.dtype = ANYATTN_DTYPE_BF16;
  c.isa = bf16_dot_isa();
  Problem p(c);
  const int64_t index[4] = {0, 70, 5, 3};  // position 70 of query head 5
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

// The backward with S and dP on the 16-bit kernels (forward and backward switched together):
// shapes with partial key blocks, GQA, masks, softcap, ALiBi, sinks and dropout, D and Dv on and
// off the kernels' 8-element steps. Both ways match the reference; f16 gives the same bytes.
void check_backward_both_ways(anyattn_dtype dtype) {
  struct Shape {
    int64_t sq, sk, hq, hk, d, dv;
  };
  const Shape shapes[] = {{65, 130, 4, 2, 64, 64}, {17, 63, 2, 1, 8, 31}, {40, 200, 6, 2, 80, 16},
                          {70, 70, 2, 2, 129, 72}, {33, 100, 4, 1, 4, 5}};
  int failures = 0;
  int64_t n = 0;
  for (const Shape& shape : shapes) {
    for (int variant = 0; variant < 3; ++variant, ++n) {
      if (reduced_sweep() && n % 3 != 0) continue;
      BwdCase c;
      c.fwd.B = variant == 2 ? 2 : 1;
      c.fwd.Sq = shape.sq;
      c.fwd.Sk = shape.sk;
      c.fwd.Hq = shape.hq;
      c.fwd.Hk = shape.hk;
      c.fwd.D = shape.d;
      c.fwd.Dv = shape.dv;
      c.fwd.dtype = dtype;
      c.fwd.isa = narrow_isa(dtype);
      // Accurate, whatever the environment says: the bits compared are the f32 products', in the
      // backward and in the forward whose out its row sums read.
      c.fwd.precision = ANYATTN_PRECISION_ACCURATE;
      c.fwd.causal = variant == 1;
      c.fwd.window_left = variant == 2 ? 24 : -1;
      c.fwd.softcap = variant == 2 ? 5.0f : 0.0f;
      c.fwd.alibi = variant == 1 ? Alibi::kPerHead : Alibi::kNone;
      c.fwd.sinks = variant == 0;
      c.fwd.seed = 9500 + n;
      c.dropout_p = variant == 1 ? 0.2f : 0.f;
      std::vector<unsigned char> bytes[2];
      for (int on = 1; on >= 0; --on) {
        set_narrow_scores(dtype, on == 1);
        BwdProblem p(c);
        ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
        const ::testing::AssertionResult r =
            check_gradients(p, p.reference(), p.naive_same_dtype());
        if (!r && ++failures <= 8) {
          ADD_FAILURE() << c.describe() << (on ? " extension" : " fma") << ": " << r.message();
        }
        bytes[on] = p.gradient_bytes();
      }
      if (dtype == ANYATTN_DTYPE_F16 && bytes[0] != bytes[1] && ++failures <= 8) {
        ADD_FAILURE() << c.describe() << ": FMLAL and FMLA gradients differ";
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_F(FwdNarrowScores, Bf16BackwardOnDotProductsMatchesReference) {
  if (!has_isa_path(bf16_dot_isa())) GTEST_SKIP() << "no path with bf16 dot scores on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_BF16, true)) GTEST_SKIP() << "no bf16 dot products here";
  check_backward_both_ways(ANYATTN_DTYPE_BF16);
}

// The backward's S for the query rows the dot products would get wrong: with the extension on,
// S is recomputed in f32 for them, as the forward's was, and the gradients match the reference
// (flushed scores would be 0, far from the true ones).
TEST_F(FwdNarrowScores, Bf16BackwardInputsTheDotProductsWouldFlushTakeTheFmaScores) {
  if (!has_isa_path(bf16_dot_isa())) GTEST_SKIP() << "no path with bf16 dot scores on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_BF16, true)) GTEST_SKIP() << "no bf16 dot products here";
  for (const Bf16DotFlushCase& extreme : kBf16DotFlushCases) {
    SCOPED_TRACE(extreme.what);
    BwdCase c;
    c.fwd = unfit_case(extreme.softmax_scale);
    BwdProblem p(c);
    fill_scaled(p.fwd, extreme.q_unit, extreme.k_unit);
    ASSERT_GT(gap_to_flushed_scores(c.fwd, p.fwd.reference(), extreme.k_unit), 0.05)
        << "the case does not tell flushed scores apart";
    ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(check_gradients(p, p.reference(), p.naive_same_dtype()));
  }
}

TEST_F(FwdNarrowScores, F16BackwardOnFmlalGivesTheFmlaBits) {
  if (!has_isa_path(ANYATTN_ISA_NEON)) GTEST_SKIP() << "no neon path on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_F16, true)) GTEST_SKIP() << "no FMLAL on this CPU";
  check_backward_both_ways(ANYATTN_DTYPE_F16);
}

// With bf16 probabilities allowed, P V of a bf16 call on the dot-product path multiplies P rounded
// to nearest bf16. Two keys with scores s_0 = 0 and s_1 = 2^-5 / sqrt(32), v_0 = e_0 and v_1 =
// -e_0 (cancelling_probabilities_case): P_1 = 1 and P_0 = e^-s_1 = 0.99449, which rounds to
// 0.99609375 (truncation would give 0.9921875), so out[0] = (0.99609375 - 1) / (1 + P_0), about
// -0.00196, where the accurate value is -0.00276.
TEST_F(FwdNarrowScores, FastPrecisionRoundsProbabilitiesToNearestBf16) {
  if (!has_isa_path(bf16_dot_isa())) GTEST_SKIP() << "no path with bf16 dot scores on this CPU";
  if (!set_narrow_scores(ANYATTN_DTYPE_BF16, true)) GTEST_SKIP() << "no bf16 dot products here";
  const double s1 = 0x1.0p-5 / std::sqrt(32.0);
  const double p0 = std::exp(-s1);
  const double expected[2] = {-std::tanh(s1 / 2.0), (0.99609375 - 1.0) / (1.0 + p0)};
  const anyattn_precision precisions[2] = {ANYATTN_PRECISION_ACCURATE, ANYATTN_PRECISION_FAST};
  for (int mode = 0; mode < 2; ++mode) {
    const Case c = cancelling_probabilities_case(bf16_dot_isa(), precisions[mode]);
    SCOPED_TRACE(c.describe());
    Problem p(c);
    store_cancelling_probabilities(p);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const std::vector<double> out = p.out_values();
    for (int64_t i = 0; i < c.Sq; ++i) {
      // Within half a bf16 step of the output (2^-17 at this magnitude), and some.
      EXPECT_NEAR(out[static_cast<size_t>(i * c.Dv)], expected[mode], 0x1.0p-16) << "row " << i;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
