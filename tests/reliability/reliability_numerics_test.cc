// Hostile numerics (docs/reliability.md, "Hostile numerics"): non-finite values in q, k or v, huge
// logits, rows that see no key, a single key, no keys at all, denormals, and extreme but finite
// parameters. Each test states the expected result; the f64 reference is the oracle wherever the
// expectation is "what exact arithmetic gives".
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const anyattn_dtype kDtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
const double kInf = std::numeric_limits<double>::infinity();
const double kNan = std::numeric_limits<double>::quiet_NaN();

bool same_bits(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// Sets every element of p's q to `value`.
void fill_q(Problem& p, double value) {
  const Case& c = p.spec();
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < c.Sq; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t index[4] = {b, i, h, d};
          store(p.q, index, value);
        }
      }
    }
  }
}

// The ISA paths to exercise: all of them, or only the default one in a reduced sweep.
std::vector<anyattn_isa> isas_to_test() {
  return reduced_sweep() ? std::vector<anyattn_isa>{ANYATTN_ISA_AUTO} : supported_isas();
}

// Poisons one element of q, k or v (tensor 0, 1, 2) with `value` and checks
//   - every output element matches the f64 reference: non-finite reference values exactly (same
//     infinity, or NaN), finite ones by the 2x rule (so a key whose score becomes -inf simply
//     drops out of the rows that see it, and a +inf score makes the row NaN, as in exact
//     arithmetic);
//   - every output row that does not read the poisoned element is bitwise the clean run's.
void check_non_finite(Case c, int tensor, const int64_t (&index)[4], double value) {
  SCOPED_TRACE(c.describe() + " value " + std::to_string(value) + " in " + "qkv"[tensor] + " at (" +
               std::to_string(index[0]) + "," + std::to_string(index[1]) + "," +
               std::to_string(index[2]) + "," + std::to_string(index[3]) + ")");
  Problem p(c);
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const std::vector<double> clean_out = p.out_values(), clean_lse = p.lse_values();

  p.reset_outputs();
  store(tensor == 0 ? p.q : tensor == 1 ? p.k : p.v, index, value);
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
  EXPECT_TRUE(p.padding_untouched()) << p.padding_damage();

  const std::vector<double> out = p.out_values(), lse = p.lse_values();
  const reference::ScoreOptions options = reference::resolve_options(&p.params, c.D);
  const int64_t group = c.Hq / c.Hk;
  int64_t affected = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t i = 0; i < c.Sq; ++i) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        const bool reads = tensor == 0 ? (b == index[0] && i == index[1] && h == index[2])
                                       : (b == index[0] && h / group == index[2] &&
                                          reference::key_visible(i, index[1], c.Sq, c.Sk, options));
        if (reads) {
          ++affected;
          continue;
        }
        const size_t l = static_cast<size_t>((b * c.Hq + h) * c.Sq + i);
        ASSERT_TRUE(same_bits(lse[l], clean_lse[l])) << "lse b=" << b << " h=" << h << " i=" << i;
        for (int64_t d = 0; d < c.Dv; ++d) {
          const size_t o = static_cast<size_t>(((b * c.Sq + i) * c.Hq + h) * c.Dv + d);
          ASSERT_TRUE(same_bits(out[o], clean_out[o]))
              << "out b=" << b << " i=" << i << " h=" << h << " d=" << d << " got " << out[o]
              << " clean " << clean_out[o];
        }
      }
    }
  }
  EXPECT_GT(affected, 0);
}

TEST(ReliabilityNumerics, InfAndNanInQKVMatchExactArithmeticAndStayInTheirRows) {
  for (anyattn_isa isa : isas_to_test()) {
    for (anyattn_dtype dtype : kDtypes) {
      Case c;
      c.B = 2;
      c.Sq = c.Sk = 70;
      c.Hq = 4;
      c.Hk = 2;
      c.D = 32;
      c.Dv = 24;
      c.causal = true;
      c.dtype = dtype;
      c.isa = isa;
      for (double value : {kInf, -kInf, kNan}) {
        check_non_finite(c, 0, {1, 33, 3, 5}, value);
        check_non_finite(c, 1, {0, 40, 1, 7}, value);
        check_non_finite(c, 2, {1, 12, 0, 3}, value);
      }
      // Decode shape (streaming / split-KV path).
      Case decode = c;
      decode.Sq = 1;
      decode.Sk = 1500;
      decode.causal = false;
      decode.sinks = true;
      for (double value : {kInf, -kInf}) {
        check_non_finite(decode, 1, {1, 1000, 0, 0}, value);
        check_non_finite(decode, 2, {0, 7, 1, 23}, value);
      }
    }
  }
}

// Scores of about 1e30 (|q|, |k| ~ 1e15 per element, scale 1): softmax is one-hot on the largest
// visible score, so out is that key's value row and lse is that score. The keys' scores are far
// apart (4e30 * (j + 1) / Sk, alternating in sign), so the expected result is unambiguous.
TEST(ReliabilityNumerics, HugeLogitsGiveOneHotSoftmaxWithoutNan) {
  for (anyattn_isa isa : isas_to_test()) {
    for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
      for (bool causal : {false, true}) {
        // A softcap near the scores (1e30) keeps them apart in f32, but bf16 rounding of the
        // naive computation's softcap merges them, so the 2x rule has no meaningful naive side.
        for (float softcap : {0.0f, dtype == ANYATTN_DTYPE_F32 ? 1e30f : 0.0f}) {
          Case c;
          c.Sq = 40;
          c.Sk = 70;
          c.Hq = 2;
          c.Hk = 1;
          c.D = 4;
          c.Dv = 8;
          c.softmax_scale = 1.0f;
          c.softcap = softcap;
          c.causal = causal;
          c.dtype = dtype;
          c.isa = isa;
          SCOPED_TRACE(c.describe());
          Problem p(c);
          fill_q(p, 1e15);
          for (int64_t j = 0; j < c.Sk; ++j) {
            const double sign = j % 2 == 0 ? 1.0 : -1.0;
            for (int64_t d = 0; d < c.D; ++d) {
              const int64_t index[4] = {0, j, 0, d};
              store(p.k, index, sign * 1e15 * static_cast<double>(j + 1) / c.Sk);
            }
          }
          ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
          const reference::DenseOutputs ref = p.reference();
          double max_lse = 0.0;
          for (double x : ref.lse) max_lse = std::max(max_lse, std::fabs(x));
          EXPECT_GT(max_lse, 1e28);  // The scores really are huge.
          EXPECT_TRUE(check_outputs(p, ref, p.naive_same_dtype()));
          for (double x : p.out_values()) ASSERT_FALSE(std::isnan(x));
          for (double x : p.lse_values()) ASSERT_FALSE(std::isnan(x));
        }
      }
    }
  }
}

// Rows that see no key give out = 0 and lse = -inf (or the sink) and never read k or v: with
// every key and value NaN, the masked rows are still exactly 0 / -inf, and the rows that do see a
// key are NaN.
TEST(ReliabilityNumerics, MaskedRowsNeverReadPoisonedKeys) {
  for (anyattn_isa isa : isas_to_test()) {
    for (anyattn_dtype dtype : kDtypes) {
      for (bool sinks : {false, true}) {
        Case c;
        c.B = 2;
        c.Sq = 64;
        c.Sk = 3;  // causal: rows 0..60 see no key, rows 61..63 see 1..3 keys.
        c.Hq = 2;
        c.Hk = 1;
        c.D = c.Dv = 16;
        c.causal = true;
        c.sinks = sinks;
        c.dtype = dtype;
        c.isa = isa;
        SCOPED_TRACE(c.describe());
        Problem p(c);
        for (int64_t b = 0; b < c.B; ++b) {
          for (int64_t j = 0; j < c.Sk; ++j) {
            for (int64_t d = 0; d < c.D; ++d) {
              const int64_t index[4] = {b, j, 0, d};
              store(p.k, index, kNan);
              store(p.v, index, kNan);
            }
          }
        }
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
        const std::vector<double> out = p.out_values(), lse = p.lse_values();
        for (int64_t b = 0; b < c.B; ++b) {
          for (int64_t i = 0; i < c.Sq; ++i) {
            const bool masked = i < c.Sq - c.Sk;
            for (int64_t h = 0; h < c.Hq; ++h) {
              const double l = lse[static_cast<size_t>((b * c.Hq + h) * c.Sq + i)];
              if (masked) {
                ASSERT_EQ(l, sinks ? p.sinks_buffer[h] : -kInf) << "b=" << b << " i=" << i;
              } else {
                ASSERT_TRUE(std::isnan(l)) << "b=" << b << " i=" << i;
              }
              for (int64_t d = 0; d < c.Dv; ++d) {
                const double x = out[static_cast<size_t>(((b * c.Sq + i) * c.Hq + h) * c.Dv + d)];
                if (masked) {
                  ASSERT_EQ(x, 0.0) << "b=" << b << " i=" << i << " d=" << d;
                } else {
                  ASSERT_TRUE(std::isnan(x)) << "b=" << b << " i=" << i << " d=" << d;
                }
              }
            }
          }
        }
      }
    }
  }
}

// Sk = 0 with null k and v data (an empty tensor needs no storage): out = 0, lse = -inf or sink.
TEST(ReliabilityNumerics, NoKeysWithNullKeyStorage) {
  for (bool sinks : {false, true}) {
    Case c;
    c.B = 2;
    c.Sq = 9;
    c.Sk = 0;
    c.Hq = 4;
    c.Hk = 2;
    c.D = 8;
    c.Dv = 12;
    c.sinks = sinks;
    SCOPED_TRACE(c.describe());
    Problem p(c);
    p.k.data = nullptr;
    p.v.data = nullptr;
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    for (double x : p.out_values()) ASSERT_EQ(x, 0.0);
    const std::vector<double> lse = p.lse_values();
    for (int64_t b = 0; b < c.B; ++b) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t i = 0; i < c.Sq; ++i) {
          ASSERT_EQ(lse[static_cast<size_t>((b * c.Hq + h) * c.Sq + i)],
                    sinks ? p.sinks_buffer[h] : -kInf);
        }
      }
    }
  }
}

// One key: its softmax weight is exactly 1, so out is v's row (to within one rounding of the f32
// accumulator, exact after rounding to f16/bf16) and lse is the score; with a sink the weight is
// 1 / (1 + e^{sink - s}), checked by the 2x rule.
TEST(ReliabilityNumerics, SingleKeyGivesItsValueRow) {
  for (anyattn_isa isa : isas_to_test()) {
    for (anyattn_dtype dtype : kDtypes) {
      for (int variant = 0; variant < 3; ++variant) {
        Case c;
        c.B = 2;
        c.Sq = variant == 0 ? 1 : 5;
        c.Sk = 1;
        c.Hq = 4;
        c.Hk = 2;
        c.D = 64;
        c.Dv = 40;
        c.softcap = variant == 1 ? 3.0f : 0.0f;
        c.alibi = variant == 2 ? Alibi::kPerHead : Alibi::kNone;
        c.dtype = dtype;
        c.isa = isa;
        SCOPED_TRACE(c.describe());
        Problem p(c);
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
        const reference::DenseOutputs ref = p.reference();
        EXPECT_TRUE(check_outputs(p, ref, p.naive_same_dtype()));
        const std::vector<double> out = p.out_values();
        const std::vector<double> v = reference::to_contiguous_f64(p.v);  // (B, 1, Hk, Dv)
        const double rel = dtype == ANYATTN_DTYPE_F32 ? 0x1.0p-23 : 0.0;
        for (int64_t b = 0; b < c.B; ++b) {
          for (int64_t i = 0; i < c.Sq; ++i) {
            for (int64_t h = 0; h < c.Hq; ++h) {
              for (int64_t d = 0; d < c.Dv; ++d) {
                const double got = out[static_cast<size_t>(((b * c.Sq + i) * c.Hq + h) * c.Dv + d)];
                const double want = v[static_cast<size_t>((b * c.Hk + h / 2) * c.Dv + d)];
                ASSERT_LE(std::fabs(got - want), rel * std::fabs(want))
                    << "b=" << b << " i=" << i << " h=" << h << " d=" << d;
              }
            }
          }
        }
      }
    }
  }
}

// Denormal inputs are ordinary numbers: the result matches the f64 reference by the 2x rule, no
// NaN appears, and the caller's floating-point control state (MXCSR FTZ/DAZ) is left as it was.
TEST(ReliabilityNumerics, DenormalInputsAreComputedNotFlushed) {
  for (anyattn_isa isa : isas_to_test()) {
    for (anyattn_dtype dtype : kDtypes) {
      // The smallest positive subnormal of each dtype times a few units.
      const double tiny = dtype == ANYATTN_DTYPE_F32   ? 0x1.0p-149
                          : dtype == ANYATTN_DTYPE_F16 ? 0x1.0p-24
                                                       : 0x1.0p-133;
      for (int which = 0; which < 2; ++which) {
        Case c;
        c.B = 1;
        c.Sq = 65;
        c.Sk = 70;
        c.Hq = 2;
        c.Hk = 1;
        c.D = 16;
        c.Dv = 16;
        c.dtype = dtype;
        c.isa = isa;
        c.causal = which == 1;
        SCOPED_TRACE(c.describe() + (which == 0 ? " denormal q, k, v" : " denormal v only"));
        Problem p(c);
        const int64_t rows[3] = {c.Sq, c.Sk, c.Sk};
        const int64_t heads[3] = {c.Hq, c.Hk, c.Hk};
        for (int tensor = which == 0 ? 0 : 2; tensor < 3; ++tensor) {
          const anyattn_tensor& t = tensor == 0 ? p.q : tensor == 1 ? p.k : p.v;
          for (int64_t s = 0; s < rows[tensor]; ++s) {
            for (int64_t h = 0; h < heads[tensor]; ++h) {
              for (int64_t d = 0; d < 16; ++d) {
                const int64_t index[4] = {0, s, h, d};
                store(t, index, tiny * static_cast<double>((s * 7 + h * 3 + d) % 9 - 4));
              }
            }
          }
        }
#if defined(__x86_64__) || defined(__i386__)
        // Control bits only (FTZ, DAZ, rounding, exception masks); bits 0..5 are the sticky
        // exception flags, which arithmetic on denormals legitimately sets.
        constexpr unsigned kControlBits = ~0x3Fu;
        const unsigned csr_before = _mm_getcsr() & kControlBits;
#endif
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
#if defined(__x86_64__) || defined(__i386__)
        EXPECT_EQ(_mm_getcsr() & kControlBits, csr_before);
#endif
        const reference::DenseOutputs ref = p.reference();
        double max_ref = 0.0;
        for (double x : ref.out) max_ref = std::max(max_ref, std::fabs(x));
        EXPECT_GT(max_ref, 0.0);
        EXPECT_TRUE(check_outputs(p, ref, p.naive_same_dtype()));
        for (double x : p.out_values()) ASSERT_FALSE(std::isnan(x));
      }
    }
  }
}

// Extreme but finite parameters whose scores stay within f32 range after softmax_scale and
// log2(e) are applied (|s| <= 1e33 here): tiny and huge scales, softcaps, ALiBi slopes and
// sinks, with inputs from 0 to 1e12 and subnormals. Every output is finite (no NaN, no inf) and
// matches the f64 reference.
TEST(ReliabilityNumerics, ExtremeFiniteParametersNeverGiveNan) {
  const double magnitudes[] = {0.0, 1e-40, 1e-20, 1.0, 1e6, 1e12};
  const float scales[] = {0.0f, 1e-30f, 1e4f};
  const float softcaps[] = {0.0f, 1e-20f, 30.0f, 1e30f};
  const float slopes[] = {0.0f, 1e-3f, 1e30f};
  const float sink_values[] = {-1e30f, 0.0f, 1e30f};
  int64_t cases = 0;
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
    for (double magnitude : magnitudes) {
      for (size_t k = 0; k < 3 * 4 * 3 * 3; ++k) {
        if (reduced_sweep() && k % 5 != 0) continue;
        const float scale = scales[k % 3], softcap = softcaps[(k / 3) % 4];
        const float slope = slopes[(k / 12) % 3], sink = sink_values[(k / 36) % 3];
        Case c;
        c.B = 1;
        c.Sq = 33;
        c.Sk = 70;
        c.Hq = 2;
        c.Hk = 1;
        c.D = 16;
        c.Dv = 8;
        c.softmax_scale = scale;
        c.softcap = softcap;
        c.causal = k % 2 == 1;
        c.alibi = Alibi::kPerHead;
        c.sinks = true;
        c.dtype = dtype;
        c.seed = 100 + k;
        SCOPED_TRACE(c.describe() + " magnitude " + std::to_string(magnitude) + " slope " +
                     std::to_string(slope) + " sink " + std::to_string(sink));
        Problem p(c);
        for (float& s : p.alibi_buffer) s = slope;
        for (float& s : p.sinks_buffer) s = sink;
        // Inputs: the problem's normal(0, 1) values times `magnitude`.
        for (const anyattn_tensor* t : {&p.q, &p.k, &p.v}) {
          const std::vector<double> values = reference::to_contiguous_f64(*t);
          size_t n = 0;
          for (int64_t a = 0; a < t->shape[1]; ++a) {
            for (int64_t h = 0; h < t->shape[2]; ++h) {
              for (int64_t d = 0; d < t->shape[3]; ++d) {
                const int64_t index[4] = {0, a, h, d};
                store(*t, index, values[n++] * (t == &p.v ? 1.0 : magnitude));
              }
            }
          }
        }
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
        for (double x : p.out_values()) ASSERT_TRUE(std::isfinite(x)) << x;
        for (double x : p.lse_values()) ASSERT_TRUE(std::isfinite(x)) << x;
        // The 2x rule only in f32 and for moderate scores: bf16's naive computation rounds the
        // softcap and huge scores to 3 significant digits, and scale 1e4 gives scores ~1e4
        // whose f32 rounding makes the naive side no yardstick either. scale / softcap =
        // 1e-60 is the known underflow bug tested below.
        const bool underflow_bug = scale == 1e-30f && softcap == 1e30f;
        if (dtype == ANYATTN_DTYPE_F32 && scale != 1e4f && !underflow_bug) {
          EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
        }
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 0);
}

// Scores near the top of the f32 range (softmax_scale 1e30 times O(10) dot products) and a sink
// of FLT_MAX: the kernels keep scores and sinks in natural units (log2(e) only ever multiplies a
// difference s - max <= 0) and combine rows in double, so nothing overflows and no NaN appears.
// (A scale like FLT_MAX itself overflows the f32 product q * scale before any attention math,
// as in every f32 implementation; docs/reliability.md states the range.)
TEST(ReliabilityNumerics, ScoresNearF32RangeAndHugeSinksGiveNoNan) {
  for (int variant = 0; variant < 2; ++variant) {
    Case c;
    c.Sq = 3;
    c.Sk = 70;
    c.D = c.Dv = 64;
    c.sinks = true;
    c.softmax_scale = variant == 0 ? 1e30f : 0.0f;
    SCOPED_TRACE(c.describe());
    Problem p(c);
    for (float& s : p.sinks_buffer) s = variant == 1 ? FLT_MAX : 0.0f;
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    for (double x : p.out_values()) EXPECT_FALSE(std::isnan(x));
    for (double x : p.lse_values()) EXPECT_FALSE(std::isnan(x));
  }
}

// Scores that rise and fall from key block to key block by less and by more than the kernels'
// headroom before they move a row's running max (2^8, about 5.5 in natural units), on every path
// and with split keys: out and lse match the f64 reference by the 2x rule. Key j's score is
// g(j) = base[j / 64] + 0.01 (j % 64) (q rows of 1/8, k rows of g(j) / 8, D = 64, scale 1). In
// the first sequence several blocks carry weight, most of them reached without moving the max; in
// the second a jump of 90 would overflow f32 (2^130) unless the max moves, and two blocks after it
// carry the weight.
TEST(ReliabilityNumerics, ScoresRisingAndFallingAcrossKeyBlocksMatchTheReference) {
  const std::vector<std::vector<double>> sequences = {
      {0.0, 3.0, 9.5, 14.5, 2.0, 15.5, 19.0, 17.0, 19.5},
      {0.0, 3.0, 9.5, 14.5, 2.0, 19.8, 110.0, 112.0, 111.5}};
  for (anyattn_isa isa : isas_to_test()) {
    for (const std::vector<double>& base : sequences) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.Sq = variant == 0 ? 1 : 70;
        c.Sk = 64 * 8 + 17;
        c.Hq = 2;
        c.Hk = 1;
        c.D = 64;
        c.Dv = 48;
        c.softmax_scale = 1.0f;
        c.causal = variant == 2;
        c.num_splits = variant == 3 ? 3 : 0;
        c.isa = isa;
        SCOPED_TRACE(c.describe() + " top score " + std::to_string(base.back()));
        Problem p(c);
        fill_q(p, 0.125);
        for (int64_t j = 0; j < c.Sk; ++j) {
          const double score =
              base[static_cast<size_t>(j / 64)] + 0.01 * static_cast<double>(j % 64);
          for (int64_t d = 0; d < c.D; ++d) {
            const int64_t index[4] = {0, j, 0, d};
            store(p.k, index, score / 8.0);
          }
        }
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
        EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
      }
    }
  }
}

// Large scores, typically +-10 to +-30 after softmax_scale (sharp attention, as in long-context
// models), meet the 2x rule in f32 on every path, for prefill rows and decode rows: the softmax
// scales each raw q . k, rounding the score once as the naive computation does, where a pre-scaled
// q (each of its elements rounded) gave up to 3.7x the naive error here. D 192 with softmax_scale
// 0.3 (issue 35's case), and D 64 and 128 with the default scale; causal and not; Sk of 16 or 17
// key blocks, so that a row's max both stays and moves.
TEST(ReliabilityNumerics, LargeScoresMeetTheTwoXRuleInF32) {
  struct Shape {
    int64_t D;
    float softmax_scale;
  };
  const Shape shapes[] = {{192, 0.3f}, {128, 0.f}, {64, 0.f}};
  const double typical_scores[] = {10.0, 12.0, 20.0, 30.0};
  for (anyattn_isa isa : isas_to_test()) {
    for (const Shape& shape : shapes) {
      for (double typical : typical_scores) {
        for (int variant = 0; variant < 4; ++variant) {
          Case c;
          // Decode rows (Sq 1, in a batch of 4 so that the maximum error is over 16 rows) or
          // prefill rows.
          const bool decode = variant < 2;
          c.B = decode ? 4 : 1;
          c.Sq = decode ? 1 : 16;
          c.Sk = decode ? 64 * 16 + 9 : 64 * 16;
          c.Hq = decode ? 4 : 2;
          c.Hk = 1;
          c.D = shape.D;
          c.Dv = 64;
          c.softmax_scale = shape.softmax_scale;
          c.causal = variant % 2 == 1;
          c.isa = isa;
          c.seed = 7 + static_cast<uint64_t>(typical);
          SCOPED_TRACE(c.describe() + " typical |score| " + std::to_string(typical));
          Problem p(c);
          // q and k normal(0, a^2): a score is scale * a^2 * (a sum of D products of unit
          // normals), whose standard deviation is scale * a^2 * sqrt(D) = `typical`.
          const double scale = shape.softmax_scale > 0.f
                                   ? shape.softmax_scale
                                   : 1.0 / std::sqrt(static_cast<double>(shape.D));
          const double a = std::sqrt(typical / (scale * std::sqrt(static_cast<double>(shape.D))));
          for (const anyattn_tensor* t : {&p.q, &p.k}) {
            const std::vector<double> values = reference::to_contiguous_f64(*t);
            size_t n = 0;
            for (int64_t b = 0; b < t->shape[0]; ++b) {
              for (int64_t s = 0; s < t->shape[1]; ++s) {
                for (int64_t h = 0; h < t->shape[2]; ++h) {
                  for (int64_t d = 0; d < t->shape[3]; ++d) {
                    const int64_t index[4] = {b, s, h, d};
                    store(*t, index, values[n++] * a);
                  }
                }
              }
            }
          }
          ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
          EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
        }
      }
    }
  }
}

// Regression (fuzz_fwd, 2026-11-30): a NaN score in lane 2 of a key block hid larger scores in
// the same lane of later vectors (keys 6, 18, 34) from the block's vector max, so s - max was
// hugely positive and the portable exp2 converted 1.6e28 to int (undefined behaviour). The row
// is NaN, as exact arithmetic gives, on every path, in the first key block and in a later one.
// The row was NaN under the bug too: what catches the conversion itself is clang's UBSan (GCC's
// -fsanitize=undefined leaves out float-cast-overflow) replaying the crashing input, kept as
// fuzz/corpus/fuzz_fwd/regression-nan-hides-block-max.
TEST(ReliabilityNumerics, NanScoreHidingLargerScoresFromTheBlockMaxGivesANanRow) {
  for (anyattn_isa isa : isas_to_test()) {
    for (int64_t block = 0; block < 2; ++block) {
      Case c;
      c.Sq = 3;
      c.Sk = 130;
      c.D = c.Dv = 64;
      c.softmax_scale = 1.0f;
      c.isa = isa;
      SCOPED_TRACE(c.describe() + " block " + std::to_string(block));
      Problem p(c);
      fill_q(p, 0.125);
      const int64_t first = 64 * block;
      const int64_t nan_index[4] = {0, first + 2, 0, 0};
      store(p.k, nan_index, kNan);
      for (int64_t key : {first + 6, first + 18, first + 34}) {
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t index[4] = {0, key, 0, d};
          store(p.k, index, 1e9);
        }
      }
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      for (double x : p.out_values()) EXPECT_TRUE(std::isnan(x)) << x;
      for (double x : p.lse_values()) EXPECT_TRUE(std::isnan(x)) << x;
    }
  }
}

// softmax_scale / softcap below the f32 range (1e-30 / 1e30): the kernels then multiply the score
// by softmax_scale and by 1 / softcap separately (ScoreModifiers::tanh_scale_first/second), so
// softcap * tanh(scale * <q, k> / softcap) (~1e-5 here) is kept rather than flushed to 0.
TEST(ReliabilityNumerics, TinyScaleOverHugeSoftcapKeepsScores) {
  Case c;
  c.Sq = 20;
  c.Sk = 70;
  c.D = c.Dv = 16;
  c.softmax_scale = 1e-30f;
  c.softcap = 1e30f;
  SCOPED_TRACE(c.describe());
  Problem p(c);
  for (const anyattn_tensor* t : {&p.q, &p.k}) {
    const std::vector<double> values = reference::to_contiguous_f64(*t);
    size_t n = 0;
    for (int64_t a = 0; a < t->shape[1]; ++a) {
      for (int64_t d = 0; d < t->shape[3]; ++d) {
        const int64_t index[4] = {0, a, 0, d};
        store(*t, index, values[n++] * 1e12);
      }
    }
  }
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
