// Turning unnormalised attention state into the final output row and LSE, shared by every ISA's
// kernel (one partial) and by the split-KV merge (several partials).
//
// A partial result over a key subset is (o, m, l): m the largest score seen (natural units, -inf
// if none), l = sum_j e^(s_j - m), o = sum_j e^(s_j - m) v_j. Partials over disjoint key sets
// combine exactly: with M = max(m_k, sink), denominator = sum_k l_k e^(m_k - M) + e^(sink - M),
// out = sum_k o_k e^(m_k - M) / denominator, lse = M + log(denominator). The scalar part runs in
// double, so no sink or score in the f32 range can overflow it.
#ifndef ANYATTN_CPU_FORWARD_FINALIZE_H_
#define ANYATTN_CPU_FORWARD_FINALIZE_H_

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/fwd_args.h"
#include "common/head_dims.h"
#include "cpu/shared/half.h"

namespace anyattn::cpu {

constexpr float kLog2e = 1.4426950408889634f;

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

// Most partials one row can have (the split-KV limit).
constexpr int64_t kMaxRowPartials = 64;
// Most output columns of a row (the API's limit on Dv).
constexpr int64_t kMaxStagedColumns = kMaxHeadDimV;

// Combines the partials (and `sink`, natural-log score units, when `has_sink`) and writes
// head_dim_v values of `dtype` to out_row and, if lse is non-null, the row's LSE. A row that saw
// no key writes zeros and LSE -inf (or the sink). NaN in any partial makes the row NaN.
inline void combine_and_store_row(const RowPartials& parts, bool has_sink, float sink,
                                  int64_t head_dim_v, DType dtype, void* out_row, float* lse) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  double top = has_sink ? static_cast<double>(sink) : kNegInf;
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
    if (lse != nullptr) lse[0] = has_sink ? sink : -std::numeric_limits<float>::infinity();
    return;
  }
  double denominator = has_sink ? std::exp(static_cast<double>(sink) - top) : 0.0;
  double factors[kMaxRowPartials];
  for (int64_t k = 0; k < parts.count; ++k) {
    const float m = parts.m[k * parts.ml_stride];
    const float l = parts.l[k * parts.ml_stride];
    // e^0 = 1 exactly: the partial that holds the top (the only one, without splits or a sink)
    // takes no call of exp. (inf - inf is NaN, not 0, and goes to exp as before.)
    const double shift = static_cast<double>(m) - top;
    factors[k] = l != 0.f || std::isnan(l) ? (shift == 0.0 ? 1.0 : std::exp(shift)) : 0.0;
    if (any_nan) factors[k] = std::numeric_limits<double>::quiet_NaN();
    denominator += static_cast<double>(l) * factors[k];
  }
  // out = sum_k o_k * (e^(m_k - M) / denominator), in double, rounded to f32 once. One division
  // per partial rather than per element, and loops the compiler vectorises: this runs for every
  // row of every task, and per-element divisions cost a few percent of a whole causal forward.
  double weights[kMaxRowPartials];
  for (int64_t k = 0; k < parts.count; ++k) weights[k] = factors[k] / denominator;
  float staged[kMaxStagedColumns];
  float* result = dtype == DType::kF32 ? static_cast<float*>(out_row) : staged;
  if (parts.count == 1) {
    // One partial that saw no key returned above, so this weight is non-zero or NaN.
    const double weight = weights[0];
    for (int64_t c = 0; c < head_dim_v; ++c) {
      result[c] = static_cast<float>(static_cast<double>(parts.o[c]) * weight);
    }
  } else {
    // Partial by partial, each a contiguous row: the loops vectorise, and every column still
    // sums its partials in order k = 0, 1, ...
    double sums[kMaxStagedColumns];
    for (int64_t c = 0; c < head_dim_v; ++c) sums[c] = 0.0;
    for (int64_t k = 0; k < parts.count; ++k) {
      // A partial that saw no key (factor 0) is skipped: its o may hold 0 * inf.
      if (factors[k] == 0.0) continue;
      const float* o = parts.o + k * parts.o_stride;
      const double weight = weights[k];
      for (int64_t c = 0; c < head_dim_v; ++c) sums[c] += static_cast<double>(o[c]) * weight;
    }
    for (int64_t c = 0; c < head_dim_v; ++c) result[c] = static_cast<float>(sums[c]);
  }
  if (dtype == DType::kBF16) {
    uint16_t* row = static_cast<uint16_t*>(out_row);
    for (int64_t c = 0; c < head_dim_v; ++c) row[c] = f32_to_bf16(staged[c]);
  } else if (dtype == DType::kF16) {
    uint16_t* row = static_cast<uint16_t*>(out_row);
    for (int64_t c = 0; c < head_dim_v; ++c) row[c] = f32_to_f16(staged[c]);
  }
  if (lse != nullptr) lse[0] = static_cast<float>(top + std::log(denominator));
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_FORWARD_FINALIZE_H_
