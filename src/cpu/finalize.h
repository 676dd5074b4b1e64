// Turning unnormalised attention state into the final output row and LSE, shared by every ISA's
// kernel (one partial) and by the split-KV merge (several partials).
//
// A partial result over a key subset is (o, m, l): m the largest score seen (log2 units, -inf if
// none), l = sum_j 2^(s_j - m), o = sum_j 2^(s_j - m) v_j. Partials over disjoint key sets combine
// exactly: with M = max(m_k, sink), denominator = sum_k l_k 2^(m_k - M) + 2^(sink - M), and
// out = sum_k o_k 2^(m_k - M) / denominator, lse = ln 2 * (M + log2(denominator)).
#ifndef ANYATTN_CPU_FINALIZE_H_
#define ANYATTN_CPU_FINALIZE_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/fwd_args.h"
#include "cpu/half.h"

namespace anyattn::cpu {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Partial results of one query row: partial k has o at o + k * o_stride, m[k * ml_stride],
// l[k * ml_stride].
struct RowPartials {
  int64_t count = 1;
  const float* o = nullptr;
  const float* m = nullptr;
  const float* l = nullptr;
  int64_t o_stride = 0;
  int64_t ml_stride = 0;
};

// Combines the partials (and `sink`, natural-log score units, when `has_sink`) and writes
// head_dim_v values of `dtype` to out_row and, if lse is non-null, the row's LSE. A row that saw
// no key writes zeros and LSE -inf (or the sink). NaN in any partial makes the row NaN.
inline void combine_and_store_row(const RowPartials& parts, bool has_sink, float sink,
                                  int64_t head_dim_v, DType dtype, void* out_row, float* lse) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float sink_log2 = sink * kLog2e;
  float top = has_sink ? sink_log2 : kNegInf;
  bool any_keys = false;
  bool any_nan = false;
  for (int64_t k = 0; k < parts.count; ++k) {
    const float m = parts.m[k * parts.ml_stride];
    const float l = parts.l[k * parts.ml_stride];
    if (std::isnan(m) || std::isnan(l)) any_nan = true;
    if (l != 0.f) any_keys = true;
    if (l != 0.f && m > top) top = m;
  }
  if (!any_keys && !any_nan) {
    for (int64_t c = 0; c < head_dim_v; ++c) store_element(out_row, dtype, c, 0.f);
    if (lse != nullptr) lse[0] = has_sink ? sink : kNegInf;
    return;
  }
  float weights[64];  // per-partial factor 2^(m_k - M); splits never exceed 64 per row
  float denominator = has_sink ? std::exp2(sink_log2 - top) : 0.f;
  for (int64_t k = 0; k < parts.count; ++k) {
    const float m = parts.m[k * parts.ml_stride];
    const float l = parts.l[k * parts.ml_stride];
    weights[k] = l != 0.f || std::isnan(l) ? std::exp2(m - top) : 0.f;
    if (any_nan) weights[k] = std::numeric_limits<float>::quiet_NaN();
    denominator += l * weights[k];
  }
  for (int64_t c = 0; c < head_dim_v; ++c) {
    float sum = 0.f;
    for (int64_t k = 0; k < parts.count; ++k) {
      if (weights[k] != 0.f) sum += parts.o[k * parts.o_stride + c] * weights[k];
    }
    // A division, not a multiplication by 1/denominator: one rounding instead of two.
    store_element(out_row, dtype, c, sum / denominator);
  }
  // In double: one rounding to f32 at the end instead of three.
  if (lse != nullptr) {
    lse[0] = static_cast<float>(
        (static_cast<double>(top) + std::log2(static_cast<double>(denominator))) *
        0.69314718055994530942);
  }
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_FINALIZE_H_
