// The vector exp2 and tanh of every instruction-set path this CPU runs
// (src/cpu/simd/vec_math-inl.h, reached through the kernel registry's exp2_array / tanh_array)
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

#include "cpu/kernel_registry.h"

namespace anyattn::cpu {
namespace {

std::vector<const FwdKernel*> runnable_kernels() {
  std::vector<const FwdKernel*> kernels;
  for (const FwdKernel* kernel = fwd_kernels_begin(); kernel != fwd_kernels_end(); ++kernel) {
    if (kernel->cpu_supports()) kernels.push_back(kernel);
  }
  return kernels;
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

// Measured worst cases on the development VM: 1.14 ulp (portable), 0.91 ulp (AVX2, AVX-512).
TEST(VecMath, Exp2IsWithinTwoUlpsDownToTheSubnormalRange) {
  std::vector<float> x = sample(-125.4999f, 0.f, 1 << 18);
  x.push_back(std::nextafter(-125.5f, 0.f));
  for (const FwdKernel* kernel : runnable_kernels()) {
    const std::vector<float> y = map_each(kernel->exp2_array, x);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double error = ulps(y[i], std::exp2(static_cast<double>(x[i])));
      if (error > worst) worst = error, worst_x = x[i];
    }
    EXPECT_LT(worst, 2.0) << kernel->name << ": exp2(" << worst_x << ")";
  }
}

TEST(VecMath, Exp2GivesZeroOrANormalNumberNeverASubnormal) {
  // Subnormal results cost a microcode assist per instruction on x86 (the diagonal blocks of
  // causal attention hit it on every masked key): results below the normal range are exact zeros.
  std::vector<float> x = sample(-160.f, -120.f, 1 << 16);
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::max());
  for (const FwdKernel* kernel : runnable_kernels()) {
    const std::vector<float> y = map_each(kernel->exp2_array, x);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(y[i] == 0.f || y[i] >= FLT_MIN)
          << kernel->name << ": exp2(" << x[i] << ") = " << y[i];
      if (x[i] <= -125.5f) {
        ASSERT_EQ(y[i], 0.f) << kernel->name << ": exp2(" << x[i] << ")";
        ASSERT_FALSE(std::signbit(y[i])) << kernel->name << ": exp2(" << x[i] << ")";
      }
    }
  }
}

TEST(VecMath, Exp2SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.f, -0.f, 1.f, 127.f, 128.f, 1000.f, inf, std::nanf("")};
  for (const FwdKernel* kernel : runnable_kernels()) {
    const std::vector<float> y = map_each(kernel->exp2_array, x);
    EXPECT_EQ(y[0], 1.f) << kernel->name;
    EXPECT_EQ(y[1], 1.f) << kernel->name;
    EXPECT_LT(ulps(y[2], 2.0), 2.0) << kernel->name;
    EXPECT_LT(ulps(y[3], std::ldexp(1.0, 127)), 2.0) << kernel->name;
    EXPECT_EQ(y[4], inf) << kernel->name;
    EXPECT_EQ(y[5], inf) << kernel->name;
    EXPECT_EQ(y[6], inf) << kernel->name;
    EXPECT_TRUE(std::isnan(y[7])) << kernel->name;
  }
}

// Measured worst case on the development VM: 1.82 ulp on every path.
TEST(VecMath, TanhIsWithinThreeUlpsAndOdd) {
  std::vector<float> x = sample(-12.f, 12.f, 1 << 18);
  const std::vector<float> tiny = sample(-1e-3f, 1e-3f, 1 << 12);
  x.insert(x.end(), tiny.begin(), tiny.end());
  for (const FwdKernel* kernel : runnable_kernels()) {
    const std::vector<float> y = map_each(kernel->tanh_array, x);
    std::vector<float> negated(x.size());
    for (size_t i = 0; i < x.size(); ++i) negated[i] = -x[i];
    const std::vector<float> y_negated = map_each(kernel->tanh_array, negated);
    double worst = 0;
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == 0.f) continue;
      const double error = ulps(y[i], std::tanh(static_cast<double>(x[i])));
      if (error > worst) worst = error, worst_x = x[i];
      ASSERT_EQ(y_negated[i], -y[i]) << kernel->name << ": tanh(" << x[i] << ")";
    }
    EXPECT_LT(worst, 3.0) << kernel->name << ": tanh(" << worst_x << ")";
  }
}

// The backward's softcap derivative 1 - tanh^2 (tanh_and_sech2): a few ulp of itself also where
// tanh is close to +-1, where 1 - t * t would lose up to every bit (sech^2(10) = 8.2e-9, below
// half an ulp of 1); 0 for +-inf, NaN for NaN. The bound is 4 + 3|y| ulp: sech^2 has the condition
// number 2|y| tanh|y|, so an error of one ulp in its argument (as the rounding of y itself gives
// in the backward) moves it by 2|y| ulp; the f32 exponent -2|y| log2(e) carries up to 2|y| ulp
// from the product's rounding and |y| from its rounded constant. Measured worst case on the
// development VM: 1.107 x (4 + 2|y|) = 53.6 ulp at y = 22.19, against 70.6 allowed.
TEST(VecMath, Sech2IsWithinItsConditionAlsoWhereTanhSaturates) {
  std::vector<float> x = sample(-40.f, 40.f, 1 << 18);
  const std::vector<float> tiny = sample(-1e-3f, 1e-3f, 1 << 12);
  x.insert(x.end(), tiny.begin(), tiny.end());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {inf, -inf, std::nanf("")};
  for (const FwdKernel* kernel : runnable_kernels()) {
    const std::vector<float> y = map_each(kernel->sech2_array, x);
    double worst = 0;  // error / bound
    float worst_x = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double c = std::cosh(static_cast<double>(x[i]));
      const double bound = 4.0 + 3.0 * std::fabs(x[i]);
      const double error = ulps(y[i], 1.0 / (c * c)) / bound;
      if (error > worst) worst = error, worst_x = x[i];
    }
    EXPECT_LT(worst, 1.0) << kernel->name << ": sech2(" << worst_x << ") off by " << worst
                          << " x its bound";
    const std::vector<float> s = map_each(kernel->sech2_array, special);
    EXPECT_EQ(s[0], 0.f) << kernel->name;
    EXPECT_EQ(s[1], 0.f) << kernel->name;
    EXPECT_TRUE(std::isnan(s[2])) << kernel->name;
  }
}

TEST(VecMath, TanhSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.f, 30.f, -30.f, inf, -inf, std::nanf("")};
  for (const FwdKernel* kernel : runnable_kernels()) {
    const std::vector<float> y = map_each(kernel->tanh_array, x);
    EXPECT_EQ(y[0], 0.f) << kernel->name;
    EXPECT_EQ(y[1], 1.f) << kernel->name;
    EXPECT_EQ(y[2], -1.f) << kernel->name;
    EXPECT_EQ(y[3], 1.f) << kernel->name;
    EXPECT_EQ(y[4], -1.f) << kernel->name;
    EXPECT_TRUE(std::isnan(y[5])) << kernel->name;
  }
}

}  // namespace
}  // namespace anyattn::cpu
