// Helpers shared by the varlen, KV-cache and merge tests: a deterministic generator, small
// tensor builders, and the naive same-dtype computation of one gathered sequence (the "naive"
// side of the acceptance rule in tests/README.md, matching Problem::naive_same_dtype for dense
// calls).
#ifndef ANYATTN_TESTS_CACHE_TEST_SUPPORT_H_
#define ANYATTN_TESTS_CACHE_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/half_convert.h"
#include "reference/reference.h"
#include "reference/reference_cache.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {

// splitmix64 with a Box-Muller normal: values independent of the standard library.
class CacheRng {
 public:
  explicit CacheRng(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 12345) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  double normal() {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform());
  }
  // Uniform integer in [0, n).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

inline int64_t dtype_size(int32_t dtype) {
  if (dtype == ANYATTN_DTYPE_FP8_E4M3 || dtype == ANYATTN_DTYPE_FP8_E5M2 ||
      dtype == ANYATTN_DTYPE_I8) {
    return 1;
  }
  return dtype == ANYATTN_DTYPE_F32 || dtype == ANYATTN_DTYPE_I32 ? 4 : 2;
}

inline double round_to_dtype(int32_t dtype, double x) {
  const float f = static_cast<float>(x);
  if (dtype == ANYATTN_DTYPE_F16) return reference::round_to_f16(f);
  if (dtype == ANYATTN_DTYPE_BF16) return reference::round_to_bf16(f);
  return f;
}

// A tensor that owns its bytes: C-contiguous over `shape`, or with every non-last stride padded by
// `pad` elements (pad > 0), the padding holding NaN for float types so that stray reads show.
struct OwnedTensor {
  std::vector<unsigned char> bytes;
  anyattn_tensor t{};

  OwnedTensor() = default;
  OwnedTensor(int32_t dtype, std::vector<int64_t> shape, int64_t pad = 0) {
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(shape.size());
    for (int d = 0; d < t.ndim; ++d) t.shape[d] = shape[d];
    t.strides[t.ndim - 1] = 1;
    for (int d = t.ndim - 2; d >= 0; --d) t.strides[d] = t.strides[d + 1] * shape[d + 1] + pad;
    const int64_t elements = std::max<int64_t>(t.strides[0] * shape[0], 1) + pad + 1;
    bytes.assign(static_cast<size_t>(elements * dtype_size(dtype)), 0);
    if (dtype != ANYATTN_DTYPE_I32) {
      anyattn_tensor flat = t;
      flat.ndim = 1;
      flat.shape[0] = elements;
      flat.strides[0] = 1;
      flat.data = bytes.data();
      for (int64_t i = 0; i < elements; ++i) {
        store(flat, &i, std::numeric_limits<double>::quiet_NaN());
      }
    }
    t.data = bytes.data();
  }
  OwnedTensor(const OwnedTensor& other) : bytes(other.bytes), t(other.t) { t.data = bytes.data(); }
  OwnedTensor& operator=(const OwnedTensor& other) {
    bytes = other.bytes;
    t = other.t;
    t.data = bytes.data();
    return *this;
  }

  int64_t size() const { return reference::num_elements(t); }
  // Sets element `flat` (row-major over the logical shape) to `value`, rounded to the dtype.
  void set(int64_t flat, double value) {
    int64_t index[ANYATTN_MAX_NDIM] = {0, 0, 0, 0};
    for (int d = t.ndim - 1; d >= 0; --d) {
      index[d] = flat % t.shape[d];
      flat /= t.shape[d];
    }
    if (t.dtype == ANYATTN_DTYPE_I32) {
      int64_t offset = 0;
      for (int d = 0; d < t.ndim; ++d) offset += index[d] * t.strides[d];
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(bytes.data() + offset * 4, &v, 4);
    } else {
      store(t, index, value);
    }
  }
  void fill_normal(CacheRng* rng, double scale = 1.0) {
    for (int64_t i = 0; i < size(); ++i) set(i, scale * rng->normal());
  }
  void fill(double value) {
    for (int64_t i = 0; i < size(); ++i) set(i, value);
  }
  std::vector<double> values() const { return reference::to_contiguous_f64(t); }
};

inline OwnedTensor int_tensor(const std::vector<int32_t>& values) {
  OwnedTensor r(ANYATTN_DTYPE_I32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) r.set(static_cast<int64_t>(i), values[i]);
  return r;
}

// The naive same-dtype attention of one gathered sequence (see Problem::naive_same_dtype): scores
// accumulated in f32 and rounded to the dtype, scale and softcap rounded, ALiBi added in f32,
// softmax in f32 with probabilities rounded to the dtype, P V accumulated in f32 and rounded.
inline void naive_gathered(const reference::GatheredSequence& seq,
                           const reference::HeadShape& shape, const reference::ScoreOptions& opt,
                           anyattn_dtype dt, float scale, float softcap, double* out, double* lse,
                           int64_t lse_head_stride) {
  const int64_t Sq = seq.seqlen_q, Sk = seq.seqlen_k, Hq = shape.num_heads_q;
  const int64_t Hk = shape.num_heads_k, D = shape.head_dim, Dv = shape.head_dim_v;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  auto round = [dt](float x) { return static_cast<float>(round_to_dtype(dt, x)); };
  std::vector<float> s(static_cast<size_t>(Sk)), p(static_cast<size_t>(Sk));
  std::vector<char> visible(static_cast<size_t>(Sk));
  std::vector<float> acc(static_cast<size_t>(Dv));
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t hk = h / (Hq / Hk);
    const float slope = seq.alibi_slopes.empty() ? 0.0f : static_cast<float>(seq.alibi_slopes[h]);
    const float sink = seq.sinks.empty() ? minus_inf : static_cast<float>(seq.sinks[h]);
    for (int64_t i = 0; i < Sq; ++i) {
      const double* qi = seq.q.data() + (i * Hq + h) * D;  // no indexing: D may be 0
      float row_max = sink;
      bool any = false;
      for (int64_t j = 0; j < Sk; ++j) {
        visible[j] = reference::key_visible(i, j, Sq, Sk, opt);
        if (!visible[j]) continue;
        any = true;
        const double* kj = seq.k.data() + (j * Hk + hk) * D;
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d)
          dot += static_cast<float>(qi[d]) * static_cast<float>(kj[d]);
        float x = round(round(dot) * scale);
        if (softcap > 0.0f) x = round(softcap * std::tanh(x / softcap));
        if (!seq.alibi_slopes.empty()) x -= slope * std::fabs(static_cast<float>(i + Sk - Sq - j));
        s[j] = x;
        if (x > row_max) row_max = x;
      }
      double* out_i = out + (i * Hq + h) * Dv;
      double* lse_i = lse + h * lse_head_stride + i;
      for (int64_t d = 0; d < Dv; ++d) out_i[d] = 0.0;
      if (!any) {
        *lse_i = sink;
        continue;
      }
      float sum = seq.sinks.empty() ? 0.0f : std::exp(sink - row_max);
      for (int64_t j = 0; j < Sk; ++j) {
        if (visible[j]) sum += (p[j] = std::exp(s[j] - row_max));
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < Sk; ++j) {
        if (!visible[j]) continue;
        const float pj = round(p[j] / sum);
        const double* vj = seq.v.data() + (j * Hk + hk) * Dv;
        for (int64_t d = 0; d < Dv; ++d) acc[d] += pj * static_cast<float>(vj[d]);
      }
      for (int64_t d = 0; d < Dv; ++d) out_i[d] = round(acc[d]);
      *lse_i = row_max + std::log(sum);
    }
  }
}

// Bytes of `after` that differ from `before` outside the elements of `t` whose first index r has
// allowed[r] (for lse, whose rows are the last index, `last_index` selects the last dimension).
inline int64_t changed_outside(const std::vector<unsigned char>& after,
                               const std::vector<unsigned char>& before, const anyattn_tensor& t,
                               const std::vector<char>& allowed, bool last_index) {
  std::vector<unsigned char> masked = after;
  const int64_t es = dtype_size(t.dtype);
  const int64_t n = reference::num_elements(t);
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rest = flat, offset = 0, index[ANYATTN_MAX_NDIM] = {0, 0, 0, 0};
    for (int d = t.ndim - 1; d >= 0; --d) {
      index[d] = rest % t.shape[d];
      rest /= t.shape[d];
      offset += index[d] * t.strides[d];
    }
    if (allowed[last_index ? index[t.ndim - 1] : index[0]]) {
      std::memcpy(&masked[offset * es], &before[offset * es], es);
    }
  }
  int64_t changed = 0;
  for (size_t i = 0; i < masked.size(); ++i) changed += masked[i] != before[i];
  return changed;
}

inline double max_abs_finite_of(const std::vector<double>& values) {
  double m = 0.0;
  for (double x : values) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

// The naive result must itself be near the reference, or the 2x rule would silently loosen.
inline ::testing::AssertionResult naive_plausible(const char* what,
                                                  const std::vector<double>& naive,
                                                  const std::vector<double>& ref,
                                                  anyattn_dtype dtype) {
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i])) worst = std::max(worst, std::fabs(naive[i] - ref[i]));
  }
  const double relative = dtype == ANYATTN_DTYPE_F32   ? 1e-4
                          : dtype == ANYATTN_DTYPE_F16 ? 2e-2
                                                       : 1.5e-1;
  const double ceiling = relative * std::max(1.0, max_abs_finite_of(ref));
  if (!(worst <= ceiling)) {
    return ::testing::AssertionFailure()
           << what << ": naive differs from the f64 reference by " << worst << " > " << ceiling;
  }
  return ::testing::AssertionSuccess();
}

// out and lse of a call checked by the 2x rule, after checking that the naive side is plausible.
inline ::testing::AssertionResult check_two_x(
    anyattn_dtype dtype, const std::vector<double>& out, const std::vector<double>& ref_out,
    const std::vector<double>& naive_out, const std::vector<int64_t>& out_shape,
    const std::vector<double>* lse, const std::vector<double>& ref_lse,
    const std::vector<double>& naive_lse, const std::vector<int64_t>& lse_shape) {
  ::testing::AssertionResult r = naive_plausible("out", naive_out, ref_out, dtype);
  if (r) r = naive_plausible("lse", naive_lse, ref_lse, dtype);
  if (r) {
    r = within_two_x_naive("out", out, ref_out, naive_out,
                           out_eps(dtype, max_abs_finite_of(ref_out)), out_shape);
  }
  if (r && lse != nullptr) {
    r = within_two_x_naive("lse", *lse, ref_lse, naive_lse, lse_eps(max_abs_finite_of(ref_lse)),
                           lse_shape);
  }
  return r;
}

}  // namespace testing
}  // namespace anyattn

#endif  // ANYATTN_TESTS_CACHE_TEST_SUPPORT_H_
