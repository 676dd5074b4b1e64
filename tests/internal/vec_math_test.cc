// The vector exp2 and tanh of every instruction-set path this CPU runs
// (src/cpu/simd/vec_math-inl.h, compiled per path for the tests by vec_math_paths.cc)
// against libm in double precision: the error bounds their comments promise, exact zeros instead of
// subnormal results, and the special values (infinities, NaN) the online softmax and the softcap
// rely on.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/half_convert.h"
#include "common/kv8_convert.h"
#include "cpu/kernel_registry.h"
#include "internal/vec_math_paths.h"

namespace anyattn::cpu {
namespace {

using vec_math_test::ElementwiseFn;
using vec_math_test::VecMathPath;

// One path the library would run on this CPU: its kernel's name and its vector math.
struct RunnablePath {
  const char* name;
  const VecMathPath* math;
};

// Every path of the kernel registry that this CPU runs. A path without an entry in
// vec_math_paths.cc fails the test that asks, so that a new ISA cannot go untested.
std::vector<RunnablePath> runnable_paths() {
  std::vector<RunnablePath> paths;
  for (const FwdKernel* kernel = fwd_kernels_begin(); kernel != fwd_kernels_end(); ++kernel) {
    if (!kernel->cpu_supports()) continue;
    const VecMathPath* math = vec_math_test::find_vec_math_path(kernel->isa);
    if (math == nullptr) {
      ADD_FAILURE() << kernel->name << ": no vector math in tests/internal/vec_math_paths.cc";
      continue;
    }
    paths.push_back({kernel->name, math});
  }
  return paths;
}

// |got - want| in units of the f32 spacing at want (want a normal f32 magnitude).
double ulps(float got, double want) {
  int exponent = 0;
  std::frexp(want, &exponent);  // want = m * 2^exponent, m in [0.5, 1)
  return std::fabs(static_cast<double>(got) - want) / std::ldexp(1.0, exponent - 24);
}

// n points evenly spaced over [lo, hi], then n uniformly random ones.
std::vector<float> sample(float lo, float hi, int n) {
  std::vector<float> x;
  for (int i = 0; i < n; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(i) / (n - 1));
  std::mt19937 rng(20261129);
  std::uniform_real_distribution<float> uniform(lo, hi);
  for (int i = 0; i < n; ++i) x.push_back(uniform(rng));
  return x;
}

std::vector<float> map_each(ElementwiseFn fn, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  fn(x.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

// Worst cases over these samples: 1.14 ulp (portable), 0.91 ulp (AVX2, AVX-512).
TEST(VecMath, Exp2IsWithinTwoUlpsDownToTheSubnormalRange) {
  std::vector<float> x = sample(-125.4999f, 0.f, 1 << 18);
  x.push_back(std::nextafter(-125.5f, 0.f));
  for (const RunnablePath& path : runnable_paths()) {
    const std::vector<float> y = map_each(path.math->exp2_array, x);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double error = ulps(y[i], std::exp2(static_cast<double>(x[i])));
      if (error > worst) worst = error, worst_x = x[i];
    }
    EXPECT_LT(worst, 2.0) << path.name << ": exp2(" << worst_x << ")";
  }
}

TEST(VecMath, Exp2GivesZeroOrANormalNumberNeverASubnormal) {
  // Subnormal results cost a microcode assist per instruction on x86 (the diagonal blocks of
  // causal attention hit it on every masked key): results below the normal range are exact zeros.
  std::vector<float> x = sample(-160.f, -120.f, 1 << 16);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::max());
  for (const RunnablePath& path : runnable_paths()) {
    const std::vector<float> y = map_each(path.math->exp2_array, x);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(y[i] == 0.f || y[i] >= FLT_MIN)
          << path.name << ": exp2(" << x[i] << ") = " << y[i];
      if (x[i] <= -125.5f) {
        ASSERT_EQ(y[i], 0.f) << path.name << ": exp2(" << x[i] << ")";
        ASSERT_FALSE(std::signbit(y[i])) << path.name << ": exp2(" << x[i] << ")";
      }
    }
  }
}

TEST(VecMath, Exp2SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.f, -0.f, 1.f, 127.f, 128.f, 1000.f, inf, std::nanf("")};
  for (const RunnablePath& path : runnable_paths()) {
    const std::vector<float> y = map_each(path.math->exp2_array, x);
    EXPECT_EQ(y[0], 1.f) << path.name;
    EXPECT_EQ(y[1], 1.f) << path.name;
    EXPECT_LT(ulps(y[2], 2.0), 2.0) << path.name;
    EXPECT_LT(ulps(y[3], std::ldexp(1.0, 127)), 2.0) << path.name;
    EXPECT_EQ(y[4], inf) << path.name;
    EXPECT_EQ(y[5], inf) << path.name;
    EXPECT_EQ(y[6], inf) << path.name;
    EXPECT_TRUE(std::isnan(y[7])) << path.name;
  }
}

// Worst case over these samples: 1.82 ulp on every path.
TEST(VecMath, TanhIsWithinThreeUlpsAndOdd) {
  std::vector<float> x = sample(-12.f, 12.f, 1 << 18);
  const std::vector<float> tiny = sample(-1e-3f, 1e-3f, 1 << 12);
  x.insert(x.end(), tiny.begin(), tiny.end());
  for (const RunnablePath& path : runnable_paths()) {
    const std::vector<float> y = map_each(path.math->tanh_array, x);
    std::vector<float> negated(x.size());
    for (size_t i = 0; i < x.size(); ++i) negated[i] = -x[i];
    const std::vector<float> y_negated = map_each(path.math->tanh_array, negated);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == 0.f) continue;
      const double error = ulps(y[i], std::tanh(static_cast<double>(x[i])));
      if (error > worst) worst = error, worst_x = x[i];
      ASSERT_EQ(y_negated[i], -y[i]) << path.name << ": tanh(" << x[i] << ")";
    }
    EXPECT_LT(worst, 3.0) << path.name << ": tanh(" << worst_x << ")";
  }
}

// The backward's softcap derivative 1 - tanh^2 (tanh_and_sech2): a few ulp of itself also where
// tanh is close to +-1, where 1 - t * t would lose up to every bit (sech^2(10) = 8.2e-9, below
// half an ulp of 1); 0 for +-inf, NaN for NaN. The bound is 4 + 3|y| ulp: sech^2 has the condition
// number 2|y| tanh|y|, so an error of one ulp in its argument (as the rounding of y itself gives
// in the backward) moves it by 2|y| ulp; the f32 exponent -2|y| log2(e) carries up to 2|y| ulp
// from the product's rounding and |y| from its rounded constant. Worst case over these
// samples: 1.107 x (4 + 2|y|) = 53.6 ulp at y = 22.19, against 70.6 allowed.
TEST(VecMath, Sech2IsWithinItsConditionAlsoWhereTanhSaturates) {
  std::vector<float> x = sample(-40.f, 40.f, 1 << 18);
  const std::vector<float> tiny = sample(-1e-3f, 1e-3f, 1 << 12);
  x.insert(x.end(), tiny.begin(), tiny.end());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {inf, -inf, std::nanf("")};
  for (const RunnablePath& path : runnable_paths()) {
    const std::vector<float> y = map_each(path.math->sech2_array, x);
    double worst = 0;  // error / bound
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double c = std::cosh(static_cast<double>(x[i]));
      const double bound = 4.0 + 3.0 * std::fabs(x[i]);
      const double error = ulps(y[i], 1.0 / (c * c)) / bound;
      if (error > worst) worst = error, worst_x = x[i];
    }
    EXPECT_LT(worst, 1.0) << path.name << ": sech2(" << worst_x << ") off by " << worst
                          << " x its bound";
    const std::vector<float> s = map_each(path.math->sech2_array, special);
    EXPECT_EQ(s[0], 0.f) << path.name;
    EXPECT_EQ(s[1], 0.f) << path.name;
    EXPECT_TRUE(std::isnan(s[2])) << path.name;
  }
}

TEST(VecMath, TanhSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.f, 30.f, -30.f, inf, -inf, std::nanf("")};
  for (const RunnablePath& path : runnable_paths()) {
    const std::vector<float> y = map_each(path.math->tanh_array, x);
    EXPECT_EQ(y[0], 0.f) << path.name;
    EXPECT_EQ(y[1], 1.f) << path.name;
    EXPECT_EQ(y[2], -1.f) << path.name;
    EXPECT_EQ(y[3], 1.f) << path.name;
    EXPECT_EQ(y[4], -1.f) << path.name;
    EXPECT_TRUE(std::isnan(y[5])) << path.name;
  }
}

// Vec::store_f16 gives convert::f32_to_f16's bits on every path: around every f16 rounding tie
// (each exponent, normal and subnormal), at the overflow threshold, for zeros, infinities and
// NaN payloads, and for f32 subnormals.
TEST(VecMath, F16NarrowingMatchesTheScalarConversionBitForBit) {
  std::vector<float> x;
  for (uint32_t h = 0; h < 0x7c00u; h += 7) {  // every 7th positive finite f16 and its neighbours
    const float value = convert::f16_to_f32(static_cast<uint16_t>(h));
    const float next = convert::f16_to_f32(static_cast<uint16_t>(h + 1));
    const float tie = value + (next - value) / 2;
    for (float v : {value, tie, std::nextafter(tie, 0.f), std::nextafter(tie, 1e9f)}) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  for (uint32_t bits : {0x00000001u, 0x00400000u, 0x007fffffu, 0x33000000u, 0x33000001u,
                        0x477fefffu, 0x477ff000u, 0x7f7fffffu, 0x7f800000u, 0x7fc00000u,
                        0x7f800001u, 0x7fa5a5a5u, 0xffc12345u}) {
    x.push_back(convert::bits_float(bits));
  }
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = convert::f32_to_f16(x[i]);
  for (const RunnablePath& path : runnable_paths()) {
    std::vector<uint16_t> got(x.size());
    path.math->f16_array(x.data(), static_cast<int64_t>(x.size()), got.data());
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << path.name << " at f32 bits " << std::hex
                                 << convert::float_bits(x[i]);
    }
  }
}

// The direct decode loop's e4m3 read: every code but the NaN pattern S.1111.111 comes back as its
// value times 2^-kE4m3DirectExponent exactly, subnormal codes included (as f32 subnormals where
// the exponent is 120). The NaN pattern's value is the path's own (finite on the vector paths,
// NaN on portable): the loop writes NaN where it lies.
TEST(VecMath, E4m3DirectReadGivesEachCodeScaledExactly) {
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  for (const RunnablePath& path : runnable_paths()) {
    std::vector<float> got(256);
    path.math->e4m3_direct_array(codes.data(), 256, got.data());
    const int exponent = path.math->e4m3_direct_exponent;
    for (int i = 0; i < 256; ++i) {
      if ((i & 0x7F) == 0x7F) continue;
      const double want = std::ldexp(convert::fp8_e4m3_to_f32(static_cast<uint8_t>(i)), -exponent);
      ASSERT_EQ(static_cast<double>(got[i]), want) << path.name << " code " << i;
      ASSERT_EQ(std::signbit(got[i]), (i & 0x80) != 0) << path.name << " code " << i;
    }
  }
}

}  // namespace
}  // namespace anyattn::cpu
