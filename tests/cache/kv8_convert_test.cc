// The 8-bit cache formats' scalar conversions and the append's quantization routine
// (src/common/kv8_convert.h) against hand-computed values: decoding of chosen codes, round trips
// of every code, ties to even, saturation, subnormals, NaN, and e5m2 against an independent
// rounding of every f16 pattern; the token-scale rules (all-zero rows, non-finite elements,
// the FLT_MAX cap).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/half_convert.h"
#include "common/kv8_convert.h"

namespace anyattn {
namespace testing {
namespace {

using convert::f32_to_fp8_e4m3;
using convert::f32_to_fp8_e5m2;
using convert::f32_to_i8;
using convert::fp8_e4m3_to_f32;
using convert::fp8_e5m2_to_f32;
using convert::Kv8;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Kv8Convert, E4M3DecodesChosenCodes) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_f32(0x80)));
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.f, -9));      // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), 7 * std::ldexp(1.f, -9));  // largest subnormal
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.f, -6));      // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x39), 1.125f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.f);  // largest finite
  EXPECT_EQ(fp8_e4m3_to_f32(0xFE), -448.f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.f);  // S.1111.000 is finite in the fn convention
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xFF)));
}

TEST(Kv8Convert, E5M2DecodesChosenCodes) {
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(fp8_e5m2_to_f32(0x04), std::ldexp(1.f, -14));
  EXPECT_EQ(fp8_e5m2_to_f32(0x3C), 1.f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7B), 57344.f);
  EXPECT_EQ(fp8_e5m2_to_f32(0x7C), kInf);
  EXPECT_EQ(fp8_e5m2_to_f32(0xFC), -kInf);
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_f32(0x7D)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_f32(0x7F)));
}

TEST(Kv8Convert, I8DecodesAsInteger) {
  EXPECT_EQ(convert::i8_to_f32(0x00), 0.f);
  EXPECT_EQ(convert::i8_to_f32(0x7F), 127.f);
  EXPECT_EQ(convert::i8_to_f32(0x80), -128.f);
  EXPECT_EQ(convert::i8_to_f32(0xFF), -1.f);
}

TEST(Kv8Convert, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t c = static_cast<uint8_t>(code);
    if ((c & 0x7F) != 0x7F) {
      EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(c)), c) << code;
    }
    if ((c & 0x7F) < 0x7C) {
      EXPECT_EQ(f32_to_fp8_e5m2(fp8_e5m2_to_f32(c)), c) << code;
    }
    if (c != 0x80) {
      EXPECT_EQ(f32_to_i8(convert::i8_to_f32(c)), c) << code;
    }
  }
}

TEST(Kv8Convert, E4M3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_fp8_e4m3(1.0625f), 0x38);  // tie between 1 (even) and 1.125
  EXPECT_EQ(f32_to_fp8_e4m3(1.1875f), 0x3A);  // tie between 1.125 and 1.25 (even)
  EXPECT_EQ(f32_to_fp8_e4m3(1.0626f), 0x39);
  EXPECT_EQ(f32_to_fp8_e4m3(-1.0625f), 0xB8);
  EXPECT_EQ(f32_to_fp8_e4m3(464.f), 0x7E);  // tie with the NaN slot's 480: 448
  EXPECT_EQ(f32_to_fp8_e4m3(470.f), 0x7E);  // saturates
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(kInf), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(-kInf), 0xFE);
  EXPECT_EQ(f32_to_fp8_e4m3(kNan), 0x7F);
  EXPECT_EQ(f32_to_fp8_e4m3(-kNan), 0xFF);
  // Subnormals: steps of 2^-9.
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.f, -10)), 0x00);      // tie between 0 (even) and 1
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(3.f, -10)), 0x02);      // tie between 1 and 2 (even)
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(1.0001f, -10)), 0x01);  // just above the tie
  EXPECT_EQ(f32_to_fp8_e4m3(std::ldexp(15.f, -10)), 0x08);     // tie 7 / 8: the smallest normal
  EXPECT_EQ(f32_to_fp8_e4m3(FLT_MIN), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.f), 0x80);
}

TEST(Kv8Convert, E5M2MatchesRoundingEveryF16Pattern) {
  // An e5m2 value is the top byte of an f16: rounding the f16 pattern's low byte to nearest even
  // is an independent statement of the conversion for every finite f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7C00) == 0x7C00) continue;  // inf / NaN
    const uint32_t magnitude = bits & 0x7FFF;
    uint32_t rounded = (magnitude + 0x7F + ((magnitude >> 8) & 1)) >> 8;
    if (rounded > 0x7B) rounded = 0x7B;  // saturation
    const uint8_t expected = static_cast<uint8_t>(((bits >> 8) & 0x80) | rounded);
    ASSERT_EQ(f32_to_fp8_e5m2(convert::f16_to_f32(bits)), expected) << std::hex << h;
  }
  EXPECT_EQ(f32_to_fp8_e5m2(1.125f), 0x3C);  // tie between 1 (even) and 1.25
  EXPECT_EQ(f32_to_fp8_e5m2(1.375f), 0x3E);  // tie between 1.25 and 1.5 (even)
  EXPECT_EQ(f32_to_fp8_e5m2(61440.f), 0x7B);  // would round to inf: saturates
  EXPECT_EQ(f32_to_fp8_e5m2(kInf), 0x7B);
  EXPECT_EQ(f32_to_fp8_e5m2(-kInf), 0xFB);
  EXPECT_EQ(f32_to_fp8_e5m2(kNan), 0x7F);
  EXPECT_EQ(f32_to_fp8_e5m2(std::ldexp(1.f, -17)), 0x00);  // tie: 0
  EXPECT_EQ(f32_to_fp8_e5m2(std::ldexp(3.f, -17)), 0x02);  // tie 1 / 2: 2
}

TEST(Kv8Convert, I8RoundsToNearestEvenAndSaturatesSymmetrically) {
  const struct {
    float x;
    int expected;
  } cases[] = {{0.5f, 0},      {1.5f, 2},     {2.5f, 2},        {3.5f, 4},
               {-2.5f, -2},    {-3.5f, -4},   {0.49f, 0},       {-0.51f, -1},
               {126.5f, 126},  {126.6f, 127}, {200.f, 127},     {-126.5f, -126},
               {-127.5f, -127}, {-200.f, -127}, {kInf, 127},    {-kInf, -127},
               {kNan, 0},      {FLT_MIN, 0},  {-FLT_MIN, 0}};
  for (const auto& c : cases) {
    EXPECT_EQ(static_cast<int8_t>(f32_to_i8(c.x)), c.expected) << c.x;
  }
}

TEST(Kv8Convert, QuantizeWithoutTokenScaleDividesByDescale) {
  const float x[] = {1.f, 2.5f, -5.f, 1000.f};
  uint8_t stored[4];
  convert::quantize_kv8_row(Kv8::kI8, x, 4, 0.5f, nullptr, stored);
  // x / 0.5 = 2, 5, -10, 2000 (saturates).
  EXPECT_EQ(static_cast<int8_t>(stored[0]), 2);
  EXPECT_EQ(static_cast<int8_t>(stored[1]), 5);
  EXPECT_EQ(static_cast<int8_t>(stored[2]), -10);
  EXPECT_EQ(static_cast<int8_t>(stored[3]), 127);
  convert::quantize_kv8_row(Kv8::kFp8E4M3, x, 4, 2.f, nullptr, stored);
  EXPECT_EQ(stored[0], 0x30);  // 0.5
  EXPECT_EQ(stored[1], 0x3A);  // 1.25
  EXPECT_EQ(stored[2], 0xC2);  // -2.5 = -1.25 * 2^1: S.1000.010
  EXPECT_EQ(stored[3], 0x7E);  // 500 saturates to 448
}

TEST(Kv8Convert, QuantizeWithTokenScale) {
  // amax 127 with descale 1: token scale exactly 1, so stored = round(x).
  const float x[] = {127.f, 2.5f, -3.5f, 0.49f};
  uint8_t stored[4];
  float scale = -1.f;
  convert::quantize_kv8_row(Kv8::kI8, x, 4, 1.f, &scale, stored);
  EXPECT_EQ(scale, 1.f);
  EXPECT_EQ(static_cast<int8_t>(stored[0]), 127);
  EXPECT_EQ(static_cast<int8_t>(stored[1]), 2);
  EXPECT_EQ(static_cast<int8_t>(stored[2]), -4);
  EXPECT_EQ(static_cast<int8_t>(stored[3]), 0);
  // e4m3: amax 896 with descale 1 gives scale 2; the largest element stores 448.
  const float y[] = {896.f, -1.f};
  convert::quantize_kv8_row(Kv8::kFp8E4M3, y, 2, 1.f, &scale, stored);
  EXPECT_EQ(scale, 2.f);
  EXPECT_EQ(stored[0], 0x7E);
  EXPECT_EQ(stored[1], 0xB0);  // -0.5
  // e5m2 with descale 4: scale = amax / (57344 * 4).
  const float z[] = {57344.f * 8, 0.f};
  convert::quantize_kv8_row(Kv8::kFp8E5M2, z, 2, 4.f, &scale, stored);
  EXPECT_EQ(scale, 2.f);
  EXPECT_EQ(stored[0], 0x7B);
  EXPECT_EQ(stored[1], 0x00);
}

TEST(Kv8Convert, QuantizeAllZeroAndNonFiniteRows) {
  uint8_t stored[3] = {9, 9, 9};
  float scale = -1.f;
  const float zeros[] = {0.f, -0.f, 0.f};
  convert::quantize_kv8_row(Kv8::kFp8E4M3, zeros, 3, 1.f, &scale, stored);
  EXPECT_EQ(scale, 0.f);
  EXPECT_EQ(stored[0], 0);
  EXPECT_EQ(stored[1], 0);
  EXPECT_EQ(stored[2], 0);
  // amax ignores NaN and inf: scale from the finite 2; inf saturates, NaN stays NaN (fp8) or
  // becomes 0 (int8).
  const float mixed[] = {kNan, 2.f, -kInf};
  convert::quantize_kv8_row(Kv8::kI8, mixed, 3, 1.f, &scale, stored);
  EXPECT_EQ(scale, static_cast<float>(2.0 / 127.0));
  EXPECT_EQ(static_cast<int8_t>(stored[0]), 0);
  EXPECT_EQ(static_cast<int8_t>(stored[1]), 127);
  EXPECT_EQ(static_cast<int8_t>(stored[2]), -127);
  convert::quantize_kv8_row(Kv8::kFp8E4M3, mixed, 3, 1.f, &scale, stored);
  EXPECT_EQ(stored[0], 0x7F);
  EXPECT_EQ(stored[1], 0x7E);
  EXPECT_EQ(stored[2], 0xFE);
  // Only non-finite elements: no finite amax, scale 0, zeros stored.
  const float none[] = {kNan, kInf, -kInf};
  convert::quantize_kv8_row(Kv8::kFp8E5M2, none, 3, 1.f, &scale, stored);
  EXPECT_EQ(scale, 0.f);
  EXPECT_EQ(stored[0], 0);
}

TEST(Kv8Convert, QuantizeTokenScaleCapsAtFltMaxAndUnderflowsToZero) {
  uint8_t stored[1];
  float scale = 0.f;
  const float huge[] = {3e38f};
  convert::quantize_kv8_row(Kv8::kI8, huge, 1, FLT_MIN, &scale, stored);
  EXPECT_EQ(scale, FLT_MAX);
  EXPECT_EQ(static_cast<int8_t>(stored[0]), 127);  // 3e38 / (FLT_MIN * FLT_MAX) saturates
  const float tiny[] = {std::numeric_limits<float>::denorm_min()};
  convert::quantize_kv8_row(Kv8::kFp8E5M2, tiny, 1, 1e30f, &scale, stored);
  EXPECT_EQ(scale, 0.f);  // underflows: the row stores zeros
  EXPECT_EQ(stored[0], 0);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
