// Dropout: Philox-4x32-10 against Random123's published known answers, the keep mask's rate and
// its pure-function property, and anyattn_bwd with dropout against the f64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backward/bwd_test_support.h"
#include "common/philox.h"
#include "cpu/backward/bwd_philox.h"

#if defined(__x86_64__) || defined(_M_X64)
// The AVX-512 kernels' 64-key draw, compiled here exactly as the avx512 path compiles it: in the
// target region of its traits.
#include "cpu/simd/traits_avx512.h"
ANYATTN_PATH_TARGET_BEGIN()
namespace anyattn::testing::avx512_draw {
using cpu::PhiloxKey;
#include "cpu/backward/bwd_philox_avx512-inl.h"
}  // namespace anyattn::testing::avx512_draw
ANYATTN_PATH_TARGET_END()
#endif

namespace anyattn {
namespace testing {
namespace {

using cpu::dropout_keep;
using cpu::dropout_keep_bits16;
using cpu::dropout_key;
using cpu::dropout_threshold;
using cpu::philox4x32_10;
using cpu::PhiloxKey;

TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Kat {
    uint32_t counter[4];
    uint32_t key[2];
    uint32_t expected[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& kat : kats) {
    const cpu::PhiloxBlock block = philox4x32_10(kat.counter[0], kat.counter[1], kat.counter[2],
                                                 kat.counter[3], PhiloxKey{kat.key[0], kat.key[1]});
    for (int w = 0; w < 4; ++w) EXPECT_EQ(block.w[w], kat.expected[w]) << "word " << w;
  }
}

TEST(DropoutMask, KeepRateMatchesOneMinusP) {
  for (float p : {0.05f, 0.3f, 0.9f}) {
    const PhiloxKey key = dropout_key(42, 7);
    const uint32_t threshold = dropout_threshold(p);
    int64_t kept = 0, total = 0;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t i = 0; i < 256; ++i) {
          for (int64_t j0 = 0; j0 < 512; j0 += 16) {
            kept += __builtin_popcount(dropout_keep_bits16(key, b, h, i, j0, threshold));
            total += 16;
          }
        }
      }
    }
    const double rate = static_cast<double>(kept) / total;
    const double sigma = std::sqrt(p * (1.0 - p) / total);
    EXPECT_NEAR(rate, 1.0 - p, 5 * sigma) << "p=" << p << " over " << total << " draws";
  }
  // p = 0 keeps everything.
  EXPECT_EQ(dropout_keep_bits16(dropout_key(1, 2), 0, 0, 0, 0, dropout_threshold(0.f)), 0xFFFFu);
}

// The backward's 16-lane draws (bwd_philox.h, and the AVX-512 one when the CPU has it) make
// exactly dropout_keep's decisions, for
// thresholds at the extremes and in between and for coordinates up to 2^31 - 1.
TEST(DropoutMask, SixtyFourKeyFactorsMatchTheScalarMask) {
  const float scale = 1.f / (1.f - 0.4f);
  int64_t kept = 0, total = 0;
  for (const float p : {0.f, 0.4f, 0.999f}) {
    const uint32_t threshold = cpu::dropout_threshold(p);
    for (const uint64_t seed : {uint64_t{0}, uint64_t{0x0123456789abcdefULL}}) {
      const cpu::PhiloxKey key = cpu::dropout_key(seed, seed ^ 77);
      const int64_t coords[][4] = {{0, 0, 0, 0},
                                   {3, 7, 129, 64},
                                   {1, 2, 5000, 4096},
                                   {2147483647, 1, 2147483647, 2147483584}};
      for (const auto& c : coords) {
        float factors[64];
        cpu::dropout_keep_factors64(key, c[0], c[1], c[2], c[3], threshold, scale, factors);
        float avx512_factors[64];
#if defined(__x86_64__) || defined(_M_X64)
        if (anyattn_isa_supported(ANYATTN_ISA_AVX512)) {
          avx512_draw::dropout_keep_factors64_avx512(key, c[0], c[1], c[2], c[3], threshold, scale,
                                                     avx512_factors);
        } else {
          std::copy(factors, factors + 64, avx512_factors);
        }
#else
        std::copy(factors, factors + 64, avx512_factors);
#endif
        for (int64_t t = 0; t < 64; ++t) {
          const bool keep = cpu::dropout_keep(key, c[0], c[1], c[2], c[3] + t, threshold);
          ASSERT_EQ(factors[t], keep ? scale : 0.f)
              << "p=" << p << " b=" << c[0] << " h=" << c[1] << " i=" << c[2] << " j=" << c[3] + t;
          ASSERT_EQ(avx512_factors[t], factors[t]) << "AVX-512 draw, t=" << t;
          kept += keep ? 1 : 0;
          ++total;
        }
      }
    }
  }
  // Not vacuous: both decisions occur.
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, total);
}

TEST(DropoutMask, IsAPureFunctionOfItsCoordinates) {
  const uint32_t threshold = dropout_threshold(0.5f);
  const PhiloxKey key = dropout_key(99, 3);
  // The 16-wide form, the per-element form and the raw (seed, offset) form agree, in any order.
  for (int64_t i = 63; i >= 0; --i) {
    for (int64_t j0 = 0; j0 < 64; j0 += 16) {
      const uint32_t bits = dropout_keep_bits16(key, 1, 2, i, j0, threshold);
      for (int t = 15; t >= 0; --t) {
        EXPECT_EQ(((bits >> t) & 1u) != 0, dropout_keep(key, 1, 2, i, j0 + t, threshold));
        EXPECT_EQ(dropout_keep(key, 1, 2, i, j0 + t, threshold),
                  dropout_keep(uint64_t{99}, uint64_t{3}, 1, 2, i, j0 + t, threshold));
      }
    }
  }
  // Each coordinate, the seed and the offset change the pattern: about half the bits differ.
  auto pattern = [&](uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i_shift) {
    std::vector<uint32_t> bits;
    const PhiloxKey k = dropout_key(seed, offset);
    for (int64_t i = 0; i < 32; ++i) {
      for (int64_t j0 = 0; j0 < 128; j0 += 16) {
        bits.push_back(dropout_keep_bits16(k, b, h, i + i_shift, j0, threshold));
      }
    }
    return bits;
  };
  auto differing_fraction = [](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    int64_t differ = 0;
    for (size_t e = 0; e < a.size(); ++e) differ += __builtin_popcount(a[e] ^ b[e]);
    return static_cast<double>(differ) / (16.0 * a.size());
  };
  const std::vector<uint32_t> base = pattern(99, 3, 1, 2, 0);
  EXPECT_EQ(base, pattern(99, 3, 1, 2, 0));
  for (const std::vector<uint32_t>& other :
       {pattern(100, 3, 1, 2, 0), pattern(99, 4, 1, 2, 0), pattern(99, 3, 0, 2, 0),
        pattern(99, 3, 1, 3, 0), pattern(99, 3, 2, 1, 0), pattern(99, 3, 1, 2, 1)}) {
    EXPECT_NEAR(differing_fraction(base, other), 0.5, 0.05);
  }
}

Case dropout_case() {
  Case c;
  c.B = 2;
  c.Sq = 80;
  c.Sk = 100;
  c.Hq = 4;
  c.Hk = 2;
  c.D = 48;
  c.Dv = 32;
  return c;
}

TEST(BwdDropout, GradientsMatchTheReferenceWithDropout) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
    BwdCase c;
    c.fwd = dropout_case();
    c.fwd.dtype = dtype;
    c.fwd.causal = true;
    c.fwd.softcap = 5.f;
    c.fwd.alibi = Alibi::kPerHead;
    c.fwd.sinks = true;
    c.dropout_p = 0.2f;
    c.dropout_seed = 2024;
    c.dropout_offset = 17;
    EXPECT_TRUE(run_and_check_bwd(c));
  }
  for (anyattn_isa isa : supported_isas()) {
    BwdCase c;
    c.fwd = dropout_case();
    c.fwd.isa = isa;
    c.dropout_p = 0.5f;
    EXPECT_TRUE(run_and_check_bwd(c)) << anyattn_isa_name(isa);
  }
}

TEST(BwdDropout, TheMaskChangesTheGradients) {
  BwdCase with_dropout;
  with_dropout.fwd = dropout_case();
  with_dropout.dropout_p = 0.3f;
  BwdCase other_seed = with_dropout;
  other_seed.dropout_seed += 1;
  BwdProblem a(with_dropout), b(other_seed);
  ASSERT_EQ(a.prepare_forward(), ANYATTN_OK);
  ASSERT_EQ(b.prepare_forward(), ANYATTN_OK);
  ASSERT_EQ(a.run(), ANYATTN_OK) << anyattn_last_error();
  ASSERT_EQ(b.run(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_NE(a.gradients().dv, b.gradients().dv);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
