// What the bf16 dot-product score tests share (fwd_decode_bf16_dot_test.cc: the decode loop's
// VDPBF16PS and BFDOT scores; fwd_narrow_scores_test.cc: the packed forward's and backward's): the
// inputs those instructions would get wrong, which must take the f32 FMA scores, and the check
// that a case tells flushed scores apart from the true ones.
#ifndef ANYATTN_TESTS_INTERNAL_BF16_DOT_FLUSH_CASES_H_
#define ANYATTN_TESTS_INTERNAL_BF16_DOT_FLUSH_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/test_support.h"

namespace anyattn {
namespace testing {

// True when this CPU runs `isa` (a path of this build).
inline bool has_isa_path(anyattn_isa isa) {
  for (anyattn_isa supported : supported_isas()) {
    if (supported == isa) return true;
  }
  return false;
}

// Inputs whose scores the dot products would flush to zero while the true scores are of order 1:
// q and k are q_unit and k_unit times small integers (fill_scaled).
struct Bf16DotFlushCase {
  const char* what;
  double q_unit, k_unit;
  float softmax_scale;
};
inline const Bf16DotFlushCase kBf16DotFlushCases[] = {
    {"subnormal q, huge k", std::ldexp(1.0, -129), std::ldexp(1.0, 125), 1.0f},
    {"|q| >= 2^64, subnormal k", std::ldexp(1.0, 120), std::ldexp(1.0, -129), 16.0f},
    {"softmax_scale 2^125, subnormal k", 1.0, std::ldexp(1.0, -129), std::ldexp(1.0f, 125)},
};

// Fills q (every position and head) and k (kv head 0) of a B1 problem with q_unit and k_unit
// times small integers, so that each score is a small multiple of q_unit * k_unit *
// softmax_scale.
inline void fill_scaled(Problem& p, double q_unit, double k_unit) {
  const Case& c = p.spec();
  for (int64_t i = 0; i < c.Sq; ++i) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t d = 0; d < c.D; ++d) {
        const int64_t index[4] = {0, i, h, d};
        store(p.q, index, q_unit * static_cast<double>((i + h * 3 + d * 5) % 7 - 3));
      }
    }
  }
  for (int64_t s = 0; s < c.Sk; ++s) {
    for (int64_t d = 0; d < c.D; ++d) {
      const int64_t index[4] = {0, s, 0, d};
      store(p.k, index, k_unit * static_cast<double>((s * 7 + d * 3) % 9 - 4));
    }
  }
}

// The largest difference between `ref` (the reference of case c filled by fill_scaled with k_unit)
// and the reference of the same case with q = 0, whose scores are all 0, as flushed ones would
// be: a case must make it large to tell the two apart.
inline double gap_to_flushed_scores(const Case& c, const reference::DenseOutputs& ref,
                                    double k_unit) {
  Problem uniform(c);
  fill_scaled(uniform, 0.0, k_unit);
  const reference::DenseOutputs uniform_ref = uniform.reference();
  double gap = 0.0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    gap = std::max(gap, std::fabs(ref.out[i] - uniform_ref.out[i]));
  }
  return gap;
}

}  // namespace testing
}  // namespace anyattn

#endif  // ANYATTN_TESTS_INTERNAL_BF16_DOT_FLUSH_CASES_H_
