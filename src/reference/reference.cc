#include "reference/reference.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/kv8_convert.h"
#include "reference/half_convert.h"

namespace anyattn {
namespace reference {

// ---- Reading tensors ----------------------------------------------------------------------------

int64_t num_elements(const anyattn_tensor& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

double load(const anyattn_tensor& t, const int64_t* index) {
  int64_t offset = 0;  // In elements.
  for (int d = 0; d < t.ndim; ++d) offset += index[d] * t.strides[d];
  const char* base = static_cast<const char*>(t.data);
  switch (t.dtype) {
    case ANYATTN_DTYPE_F32: {
      float x;
      std::memcpy(&x, base + offset * 4, sizeof(x));
      return x;
    }
    case ANYATTN_DTYPE_F16: {
      uint16_t x;
      std::memcpy(&x, base + offset * 2, sizeof(x));
      return f16_to_f32(x);
    }
    case ANYATTN_DTYPE_BF16: {
      uint16_t x;
      std::memcpy(&x, base + offset * 2, sizeof(x));
      return bf16_to_f32(x);
    }
    case ANYATTN_DTYPE_I32: {
      int32_t x;
      std::memcpy(&x, base + offset * 4, sizeof(x));
      return x;
    }
    case ANYATTN_DTYPE_FP8_E4M3:
    case ANYATTN_DTYPE_FP8_E5M2:
    case ANYATTN_DTYPE_I8: {  // the stored value; the cache's scales are the caller's
      uint8_t x;
      std::memcpy(&x, base + offset, sizeof(x));
      return convert::kv8_to_f32(static_cast<convert::Kv8>(t.dtype), x);
    }
  }
  std::abort();  // Unknown dtype: the caller broke the contract.
}

std::vector<double> to_contiguous_f64(const anyattn_tensor& t) {
  const int64_t n = num_elements(t);
  std::vector<double> result(static_cast<size_t>(n));
  int64_t index[ANYATTN_MAX_NDIM] = {0, 0, 0, 0};
  for (int64_t flat = 0; flat < n; ++flat) {
    // Row-major decomposition of `flat` into coordinates.
    int64_t rest = flat;
    for (int d = t.ndim - 1; d >= 0; --d) {
      index[d] = rest % t.shape[d];
      rest /= t.shape[d];
    }
    result[static_cast<size_t>(flat)] = load(t, index);
  }
  return result;
}

anyattn_tensor batch_slice(const anyattn_tensor& t, int64_t b) {
  anyattn_tensor slice = t;
  slice.ndim = 3;
  for (int d = 0; d < 3; ++d) {
    slice.shape[d] = t.shape[d + 1];
    slice.strides[d] = t.strides[d + 1];
  }
  const int64_t element_size = t.dtype == ANYATTN_DTYPE_F32 ? 4 : 2;
  slice.data = static_cast<char*>(t.data) + b * t.strides[0] * element_size;
  return slice;
}

// ---- Options ------------------------------------------------------------------------------------

ScoreOptions resolve_options(const anyattn_fwd_params* params, int64_t head_dim) {
  ScoreOptions options;
  // Head dim 0: every score is 0 whatever the scale, and the library's default is then 1.
  options.softmax_scale = head_dim > 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
  if (params == nullptr) return options;
  if (params->softmax_scale != 0.0f) options.softmax_scale = params->softmax_scale;
  options.softcap = params->softcap;
  options.window_left = params->window_left;
  options.window_right = params->causal ? 0 : params->window_right;
  return options;
}

bool key_visible(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k,
                 const ScoreOptions& options) {
  // The diagonal: query i is aligned with key i + Sk - Sq (the bottom-right corner).
  const int64_t diagonal = i + seqlen_k - seqlen_q;
  if (options.window_left >= 0 && j < diagonal - options.window_left) return false;
  if (options.window_right >= 0 && j > diagonal + options.window_right) return false;
  return true;
}

// ---- The core: one sequence ---------------------------------------------------------------------

void attend_one_sequence(const SequenceInputs& in, const ScoreOptions& options, double* out,
                         double* lse, int64_t lse_head_stride) {
  const int64_t Sq = in.seqlen_q, Sk = in.seqlen_k;
  const int64_t Hq = in.num_heads_q, Hk = in.num_heads_k;
  const int64_t D = in.head_dim, Dv = in.head_dim_v;
  const int64_t group = Hq / Hk;  // Query heads per kv head (GQA); Hq for MQA.
  const double kMinusInf = -std::numeric_limits<double>::infinity();

  std::vector<double> scores(static_cast<size_t>(Sk));  // Scores of one query row.
  std::vector<char> visible(static_cast<size_t>(Sk));

  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kv_head = h / group;
    for (int64_t i = 0; i < Sq; ++i) {
      const double* q_i = in.q + (i * Hq + h) * D;  // (D)
      double* out_i = out + (i * Hq + h) * Dv;      // (Dv)

      // 1. Scores s_ij for the visible keys, in the contract's order.
      bool any_visible = false;
      for (int64_t j = 0; j < Sk; ++j) {
        visible[j] = key_visible(i, j, Sq, Sk, options);
        if (!visible[j]) continue;
        any_visible = true;
        const double* k_j = in.k + (j * Hk + kv_head) * D;  // (D)
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += q_i[d] * k_j[d];
        double s = options.softmax_scale * dot;
        if (options.softcap > 0.0) s = options.softcap * std::tanh(s / options.softcap);
        if (in.alibi_slopes != nullptr) {
          s += -in.alibi_slopes[h] * std::fabs(static_cast<double>(i + Sk - Sq - j));
        }
        scores[j] = s;
      }

      // 2. A row that sees nothing: out = 0, lse = sink (or -inf).
      const bool has_sink = in.sinks != nullptr;
      const double sink = has_sink ? in.sinks[h] : kMinusInf;
      if (!any_visible) {
        for (int64_t d = 0; d < Dv; ++d) out_i[d] = 0.0;
        lse[h * lse_head_stride + i] = sink;
        continue;
      }

      // 3. Softmax with the sink in the denominator, shifted by the row max for range only.
      //    A NaN score is skipped by the max but poisons the sum below, as it should.
      double row_max = sink;
      bool any_nan = false;
      for (int64_t j = 0; j < Sk; ++j) {
        if (visible[j] && scores[j] > row_max) row_max = scores[j];
        if (visible[j] && std::isnan(scores[j])) any_nan = true;
      }
      // Every visible score is -inf (an infinite q or k can do that): each weight is 0 in the
      // limit, so the row is treated as fully masked, as flash-attn does.
      if (row_max == kMinusInf && !any_nan) {
        for (int64_t d = 0; d < Dv; ++d) out_i[d] = 0.0;
        lse[h * lse_head_stride + i] = sink;
        continue;
      }
      double denominator = has_sink ? std::exp(sink - row_max) : 0.0;
      for (int64_t j = 0; j < Sk; ++j) {
        if (visible[j]) denominator += std::exp(scores[j] - row_max);
      }

      // 4. out_i = sum_j p_ij v_j with p_ij = e^{s_ij - max} / denominator.
      for (int64_t d = 0; d < Dv; ++d) out_i[d] = 0.0;
      for (int64_t j = 0; j < Sk; ++j) {
        if (!visible[j]) continue;
        const double p = std::exp(scores[j] - row_max) / denominator;
        const double* v_j = in.v + (j * Hk + kv_head) * Dv;  // (Dv)
        for (int64_t d = 0; d < Dv; ++d) out_i[d] += p * v_j[d];
      }
      lse[h * lse_head_stride + i] = row_max + std::log(denominator);
    }
  }
}

// ---- Dense forward ------------------------------------------------------------------------------


DenseOutputs fwd_dense(const anyattn_tensor& q, const anyattn_tensor& k, const anyattn_tensor& v,
                       const anyattn_fwd_params* params) {
  const int64_t B = q.shape[0], Sq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Sk = k.shape[1], Hk = k.shape[2], Dv = v.shape[3];
  const ScoreOptions options = resolve_options(params, D);

  DenseOutputs result;
  result.out.assign(static_cast<size_t>(B * Sq * Hq * Dv), 0.0);
  result.lse.assign(static_cast<size_t>(B * Hq * Sq), 0.0);

  const anyattn_tensor* alibi = params != nullptr ? params->alibi_slopes : nullptr;
  const anyattn_tensor* sinks_tensor = params != nullptr ? params->sinks : nullptr;
  std::vector<double> alibi_all;  // (Hq) or (B, Hq)
  if (alibi != nullptr) alibi_all = to_contiguous_f64(*alibi);
  std::vector<double> sinks;  // (Hq)
  if (sinks_tensor != nullptr) sinks = to_contiguous_f64(*sinks_tensor);

  for (int64_t b = 0; b < B; ++b) {
    const std::vector<double> q_b = to_contiguous_f64(batch_slice(q, b));  // (Sq, Hq, D)
    const std::vector<double> k_b = to_contiguous_f64(batch_slice(k, b));  // (Sk, Hk, D)
    const std::vector<double> v_b = to_contiguous_f64(batch_slice(v, b));  // (Sk, Hk, Dv)

    SequenceInputs in;
    in.seqlen_q = Sq;
    in.seqlen_k = Sk;
    in.num_heads_q = Hq;
    in.num_heads_k = Hk;
    in.head_dim = D;
    in.head_dim_v = Dv;
    in.q = q_b.data();
    in.k = k_b.data();
    in.v = v_b.data();
    if (alibi != nullptr) {
      // (Hq) slopes are shared by every batch entry; (B, Hq) slopes give each its own row.
      in.alibi_slopes = alibi_all.data() + (alibi->ndim == 2 ? b * Hq : 0);
    }
    if (sinks_tensor != nullptr) in.sinks = sinks.data();

    double* out_b = result.out.data() + b * Sq * Hq * Dv;  // (Sq, Hq, Dv)
    double* lse_b = result.lse.data() + b * Hq * Sq;       // (Hq, Sq)
    attend_one_sequence(in, options, out_b, lse_b, /*lse_head_stride=*/Sq);
  }
  return result;
}

}  // namespace reference
}  // namespace anyattn
