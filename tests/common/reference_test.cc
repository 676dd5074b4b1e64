// Tests of the oracle itself: the f16/bf16 conversions and the f64 reference on problems whose
// answers are worked out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "anyattn/anyattn.hpp"
#include "reference/half_convert.h"
#include "reference/reference.h"

namespace anyattn {
namespace reference {
namespace {

// ---- Conversions --------------------------------------------------------------------------------

TEST(HalfConvert, EveryF16AndBf16RoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f16 = f16_to_f32(h), bf16 = bf16_to_f32(h);
    if (std::isnan(f16)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f16)))) << std::hex << bits;
    } else {
      EXPECT_EQ(f32_to_f16(f16), h) << std::hex << bits;
    }
    if (std::isnan(bf16)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(bf16)))) << std::hex << bits;
    } else {
      EXPECT_EQ(f32_to_bf16(bf16), h) << std::hex << bits;
    }
  }
}

TEST(HalfConvert, KnownValues) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // Below the midpoint to 65536: stays finite.
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // The midpoint ties to even, which is inf.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);         // Smallest subnormal.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);         // Tie to even: zero.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);         // Above the tie.
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units: tie to even (2).
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);      // Rounds up into the normals.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // Tie, even stays.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // Tie, odd rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);        // Tie, even stays.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);        // Tie, odd rounds up.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // Overflows to inf.
  const float nan_small_payload = bits_float(0x7f800001u);  // Signalling NaN, payload in low bits.
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(nan_small_payload))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(nan_small_payload))));
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
}

// Narrowing must pick the nearer of the two neighbouring 16-bit values, ties to the even one.
// Checked on a deterministic spread of f32 bit patterns covering every exponent.
TEST(HalfConvert, NarrowingIsRoundToNearestEven) {
  auto check = [](float f, uint16_t (*narrow)(float), float (*widen)(uint16_t)) {
    const uint16_t h = narrow(f);
    const double chosen = widen(h);
    if (std::isinf(chosen)) return;  // Overflow is covered by KnownValues.
    const double error = std::fabs(chosen - static_cast<double>(f));
    const uint16_t up = static_cast<uint16_t>(h + 1), down = static_cast<uint16_t>(h - 1);
    for (uint16_t neighbour : {up, down}) {
      const double other = widen(neighbour);
      if (std::isnan(other) || std::signbit(other) != std::signbit(chosen)) continue;
      const double other_error = std::fabs(other - static_cast<double>(f));
      ASSERT_LE(error, other_error) << f;
      if (error == other_error) {
        ASSERT_EQ(h & 1, 0) << "tie not to even at " << f;
      }
    }
  };
  uint32_t bits = 12345;
  for (int n = 0; n < 2000000; ++n) {
    bits = bits * 1664525u + 1013904223u;  // Full-period LCG over all 2^32 patterns.
    const float f = bits_float(bits);
    if (std::isnan(f)) continue;
    check(f, f32_to_f16, f16_to_f32);
    check(f, f32_to_bf16, bf16_to_f32);
  }
}

// The installed header's Float16 / BFloat16 keep their own copy of the conversions (it must
// compile without src/): they must agree with the library's bit for bit, on every 16-bit pattern
// and on a spread of f32 patterns covering every exponent, NaNs and infinities included.
TEST(HalfConvert, PublicHeaderAgreesWithTheLibrary) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    ASSERT_EQ(float_bits(Float16{h}.to_float()), float_bits(f16_to_f32(h))) << std::hex << bits;
    ASSERT_EQ(float_bits(BFloat16{h}.to_float()), float_bits(bf16_to_f32(h))) << std::hex << bits;
  }
  uint32_t bits = 54321;
  for (int n = 0; n < 2000000; ++n) {
    bits = bits * 1664525u + 1013904223u;  // Full-period LCG over all 2^32 patterns.
    const float f = bits_float(bits);
    ASSERT_EQ(Float16::from_float(f).bits, f32_to_f16(f)) << std::hex << bits;
    ASSERT_EQ(BFloat16::from_float(f).bits, f32_to_bf16(f)) << std::hex << bits;
  }
}

// ---- Mask ---------------------------------------------------------------------------------------

// Visible keys of each query row as a string of '1' / '.', for readable expectations.
std::vector<std::string> mask_rows(int64_t sq, int64_t sk, const ScoreOptions& o) {
  std::vector<std::string> rows;
  for (int64_t i = 0; i < sq; ++i) {
    std::string row;
    for (int64_t j = 0; j < sk; ++j) row += key_visible(i, j, sq, sk, o) ? '1' : '.';
    rows.push_back(row);
  }
  return rows;
}

TEST(ReferenceMask, CausalIsBottomRightAligned) {
  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.causal = 1;
  const ScoreOptions o = resolve_options(&params, 8);
  EXPECT_EQ(mask_rows(2, 4, o), (std::vector<std::string>{"111.", "1111"}));
  EXPECT_EQ(mask_rows(4, 2, o), (std::vector<std::string>{"..", "..", "1.", "11"}));
}

TEST(ReferenceMask, Window) {
  ScoreOptions o;
  o.window_left = 1;
  o.window_right = 0;
  EXPECT_EQ(mask_rows(3, 3, o), (std::vector<std::string>{"1..", "11.", ".11"}));
  o.window_left = -1;
  o.window_right = 1;
  EXPECT_EQ(mask_rows(2, 4, o), (std::vector<std::string>{"1111", "1111"}));
  o.window_left = 0;
  o.window_right = 1;
  EXPECT_EQ(mask_rows(2, 4, o), (std::vector<std::string>{"..11", "...1"}));
}

TEST(ReferenceOptions, DefaultsAndCausalOverride) {
  const ScoreOptions d = resolve_options(nullptr, 64);
  EXPECT_DOUBLE_EQ(d.softmax_scale, 0.125);
  EXPECT_EQ(d.window_left, -1);
  EXPECT_EQ(d.window_right, -1);
  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.causal = 1;
  params.window_left = 5;
  params.window_right = 9;
  params.softmax_scale = 0.5f;
  const ScoreOptions o = resolve_options(&params, 64);
  EXPECT_EQ(o.window_left, 5);
  EXPECT_EQ(o.window_right, 0);
  EXPECT_DOUBLE_EQ(o.softmax_scale, 0.5);
}

// ---- The core on hand-worked problems -----------------------------------------------------------

// One head, D = 2, Dv = 1 unless said otherwise.
struct Tiny {
  std::vector<double> q, k, v, alibi, sinks;
  int64_t sq, sk, hq = 1, hk = 1, d = 2, dv = 1;
  std::vector<double> out{}, lse{};
  void run(const ScoreOptions& o) {
    SequenceInputs in;
    in.seqlen_q = sq;
    in.seqlen_k = sk;
    in.num_heads_q = hq;
    in.num_heads_k = hk;
    in.head_dim = d;
    in.head_dim_v = dv;
    in.q = q.data();
    in.k = k.data();
    in.v = v.data();
    in.alibi_slopes = alibi.empty() ? nullptr : alibi.data();
    in.sinks = sinks.empty() ? nullptr : sinks.data();
    out.assign(static_cast<size_t>(sq * hq * dv), -1.0);
    lse.assign(static_cast<size_t>(hq * sq), -1.0);
    attend_one_sequence(in, o, out.data(), lse.data(), sq);
  }
};

TEST(ReferenceCore, TwoKeysSoftmax) {
  // s = <(1, 0), k_j> = (1, 0): p = (e, 1) / (e + 1).
  Tiny t{{1, 0}, {1, 0, 0, 0}, {10, 20}, {}, {}, 1, 2};
  t.run(ScoreOptions{});
  const double e = std::exp(1.0);
  EXPECT_NEAR(t.out[0], (10 * e + 20) / (e + 1), 1e-12);
  EXPECT_NEAR(t.lse[0], std::log(e + 1), 1e-12);
}

TEST(ReferenceCore, ScaleSoftcapAlibiOrder) {
  // Keys at distance 1 and 0 from the diagonal (Sq = 1, Sk = 2, query 0 aligned with key 1).
  // s = scale * (4, 0) = (2, 0); softcap 1: tanh(2), tanh(0); ALiBi slope 0.5: -0.5 * (1, 0).
  Tiny t{{4, 0}, {1, 0, 0, 0}, {1, 0}, {0.5}, {}, 1, 2};
  ScoreOptions o;
  o.softmax_scale = 0.5;
  o.softcap = 1.0;
  t.run(o);
  const double s0 = std::tanh(2.0) - 0.5, s1 = 0.0;
  EXPECT_NEAR(t.out[0], std::exp(s0) / (std::exp(s0) + std::exp(s1)), 1e-12);
  EXPECT_NEAR(t.lse[0], std::log(std::exp(s0) + std::exp(s1)), 1e-12);
}

TEST(ReferenceCore, SinkJoinsDenominatorOnly) {
  // One key with s = 0 and a sink of 0: out = v / 2, lse = log 2.
  Tiny t{{0, 0}, {1, 1}, {3}, {}, {0.0}, 1, 1};
  t.run(ScoreOptions{});
  EXPECT_NEAR(t.out[0], 1.5, 1e-12);
  EXPECT_NEAR(t.lse[0], std::log(2.0), 1e-12);
}

TEST(ReferenceCore, FullyMaskedRows) {
  ScoreOptions causal;
  causal.window_right = 0;
  // Sq = 2 > Sk = 1: row 0 sees nothing, row 1 sees key 0.
  Tiny t{{1, 1, 1, 1}, {1, 1}, {7}, {}, {}, 2, 1};
  t.run(causal);
  EXPECT_EQ(t.out[0], 0.0);
  EXPECT_EQ(t.lse[0], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(t.out[1], 7.0);
  t.sinks = {-0.25};
  t.run(causal);
  EXPECT_EQ(t.out[0], 0.0);
  EXPECT_EQ(t.lse[0], -0.25);
}

TEST(ReferenceCore, GqaHeadMapping) {
  // Hq = 4, Hk = 2, one key: out of head h is v of kv head h / 2.
  Tiny t{{0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0}, {5, 9}, {}, {}, 1, 1};
  t.hq = 4;
  t.hk = 2;
  t.run(ScoreOptions{});
  EXPECT_EQ(t.out, (std::vector<double>{5, 5, 9, 9}));
}

TEST(ReferenceCore, NanTouchesOnlyItsRows) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ScoreOptions causal;
  causal.window_right = 0;
  // Sq = Sk = 2, NaN in key 1: row 0 does not see it, row 1 does.
  Tiny t{{1, 0, 0, 1}, {1, 0, nan, 0}, {2, 3}, {}, {}, 2, 2};
  t.run(causal);
  EXPECT_EQ(t.out[0], 2.0);
  EXPECT_EQ(t.lse[0], 1.0);
  EXPECT_TRUE(std::isnan(t.out[1]));
  EXPECT_TRUE(std::isnan(t.lse[1]));
}

// ---- Strided reads ------------------------------------------------------------------------------

TEST(ReferenceLoad, StridedAndHalfTensors) {
  // A (2, 3) f16 view with row stride 4 over 8 elements: rows {1, 2, 3}, {5, 6, 7}.
  std::vector<uint16_t> data;
  for (int i = 0; i < 8; ++i) data.push_back(f32_to_f16(static_cast<float>(i)));
  anyattn_tensor t{};
  t.data = data.data() + 1;
  t.dtype = ANYATTN_DTYPE_F16;
  t.ndim = 2;
  t.shape[0] = 2;
  t.shape[1] = 3;
  t.strides[0] = 4;
  t.strides[1] = 1;
  EXPECT_EQ(to_contiguous_f64(t), (std::vector<double>{1, 2, 3, 5, 6, 7}));
  t.strides[0] = 0;  // Broadcast the first row.
  EXPECT_EQ(to_contiguous_f64(t), (std::vector<double>{1, 2, 3, 1, 2, 3}));
}

}  // namespace
}  // namespace reference
}  // namespace anyattn
