#include "reference/reference_bwd.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/philox.h"
#include "reference/reference_cache.h"

namespace anyattn {
namespace reference {

void Gradients::assign_zeros(int64_t q_rows, int64_t k_rows, int64_t Hq, int64_t Hk, int64_t D,
                             int64_t Dv) {
  out.assign(static_cast<size_t>(q_rows * Hq * Dv), 0.0);
  lse.assign(static_cast<size_t>(Hq * q_rows), 0.0);
  dq.assign(static_cast<size_t>(q_rows * Hq * D), 0.0);
  dk.assign(static_cast<size_t>(k_rows * Hk * D), 0.0);
  dv.assign(static_cast<size_t>(k_rows * Hk * Dv), 0.0);
  dsinks.assign(static_cast<size_t>(Hq), 0.0);
  dq_terms.assign(dq.size(), 0.0);
  dk_terms.assign(dk.size(), 0.0);
  dv_terms.assign(dv.size(), 0.0);
  dsinks_terms.assign(dsinks.size(), 0.0);
}

SequenceGradients backprop_one_sequence(const SequenceInputs& in, const double* dout,
                                        const ScoreOptions& options, const DropoutOptions& dropout,
                                        int64_t batch, const double* out_given) {
  const int64_t Sq = in.seqlen_q, Sk = in.seqlen_k;
  const int64_t Hq = in.num_heads_q, Hk = in.num_heads_k;
  const int64_t D = in.head_dim, Dv = in.head_dim_v;
  const int64_t group = Hq / Hk;
  const double kMinusInf = -std::numeric_limits<double>::infinity();
  const cpu::PhiloxKey dropout_key = cpu::dropout_key(dropout.seed, dropout.offset);
  const uint32_t threshold = cpu::dropout_threshold(static_cast<float>(dropout.p));

  SequenceGradients g;
  g.assign_zeros(Sq, Sk, Hq, Hk, D, Dv);

  // Per key of one row: the softcap's tanh, the score, P, the dropout factor Z and dP.
  std::vector<double> t(Sk), s(Sk), p(Sk), z(Sk), dp(Sk), dp_terms(Sk);
  std::vector<char> visible(Sk);

  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kv_head = h / group;
    const bool has_sink = in.sinks != nullptr;
    const double sink = has_sink ? in.sinks[h] : kMinusInf;
    for (int64_t i = 0; i < Sq; ++i) {
      const double* q_i = in.q + (i * Hq + h) * D;
      const double* dout_i = dout + (i * Hq + h) * Dv;
      double* out_i = g.out.data() + (i * Hq + h) * Dv;
      double* dq_i = g.dq.data() + (i * Hq + h) * D;

      // Forward: scores, lse, P, dropout, out.
      double row_max = sink;
      bool any_visible = false;
      for (int64_t j = 0; j < Sk; ++j) {
        visible[j] = key_visible(i, j, Sq, Sk, options);
        if (!visible[j]) continue;
        any_visible = true;
        const double* k_j = in.k + (j * Hk + kv_head) * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += q_i[d] * k_j[d];
        const double x = options.softmax_scale * dot;
        if (options.softcap > 0.0) {
          t[j] = std::tanh(x / options.softcap);
          s[j] = options.softcap * t[j];
        } else {
          s[j] = x;
        }
        if (in.alibi_slopes != nullptr) {
          s[j] += -in.alibi_slopes[h] * std::fabs(static_cast<double>(i + Sk - Sq - j));
        }
        if (s[j] > row_max) row_max = s[j];
      }
      // D_i from the out handed to the backward, when one is given.
      const double* given_i = out_given != nullptr ? out_given + (i * Hq + h) * Dv : nullptr;
      double given_delta = 0.0, given_delta_terms = 0.0;
      if (given_i != nullptr) {
        for (int64_t c = 0; c < Dv; ++c) {
          given_delta += dout_i[c] * given_i[c];
          given_delta_terms += std::fabs(dout_i[c] * given_i[c]);
        }
      }
      if (!any_visible) {
        // out = 0, lse = sink: P_sink = 1 but D_i = 0, so nothing flows anywhere; a given out
        // other than 0 reaches the sink's gradient only.
        g.lse[h * Sq + i] = sink;
        if (has_sink) {
          g.dsinks[h] -= given_delta;
          g.dsinks_terms[h] += given_delta_terms;
        }
        continue;
      }
      double denominator = has_sink ? std::exp(sink - row_max) : 0.0;
      for (int64_t j = 0; j < Sk; ++j) {
        if (visible[j]) denominator += std::exp(s[j] - row_max);
      }
      const double lse = row_max + std::log(denominator);
      g.lse[h * Sq + i] = lse;
      for (int64_t j = 0; j < Sk; ++j) {
        if (!visible[j]) continue;
        p[j] = std::exp(s[j] - lse);
        z[j] = 1.0;
        if (dropout.p > 0.0) {
          z[j] = cpu::dropout_keep(dropout_key, batch, h, i, j, threshold) ? 1.0 / (1.0 - dropout.p)
                                                                           : 0.0;
        }
        const double* v_j = in.v + (j * Hk + kv_head) * Dv;
        for (int64_t c = 0; c < Dv; ++c) out_i[c] += p[j] * z[j] * v_j[c];
      }

      // Backward of L = sum(dout * out) through this row.
      double delta = given_delta;  // D_i = sum_j P_ij dP_ij = <dout_i, out_i>
      double delta_terms = given_delta_terms;
      for (int64_t j = 0; j < Sk; ++j) {
        if (!visible[j]) continue;
        const double* v_j = in.v + (j * Hk + kv_head) * Dv;
        double dot = 0.0, dot_terms = 0.0;
        for (int64_t c = 0; c < Dv; ++c) {
          dot += dout_i[c] * v_j[c];
          dot_terms += std::fabs(dout_i[c] * v_j[c]);
        }
        dp[j] = z[j] * dot;
        dp_terms[j] = z[j] * dot_terms;
        if (given_i == nullptr) {
          delta += p[j] * dp[j];
          delta_terms += p[j] * dp_terms[j];
        }
        double* dv_j = g.dv.data() + (j * Hk + kv_head) * Dv;
        double* dv_terms_j = g.dv_terms.data() + (j * Hk + kv_head) * Dv;
        for (int64_t c = 0; c < Dv; ++c) {
          dv_j[c] += p[j] * z[j] * dout_i[c];
          dv_terms_j[c] += std::fabs(p[j] * z[j] * dout_i[c]);
        }
      }
      for (int64_t j = 0; j < Sk; ++j) {
        if (!visible[j]) continue;
        double dx = p[j] * (dp[j] - delta);  // dL/ds_ij
        double dx_terms = p[j] * (dp_terms[j] + delta_terms);
        if (options.softcap > 0.0) {  // ds/dx = 1 - tanh^2
          dx *= 1.0 - t[j] * t[j];
          dx_terms *= 1.0 - t[j] * t[j];
        }
        const double* k_j = in.k + (j * Hk + kv_head) * D;
        double* dk_j = g.dk.data() + (j * Hk + kv_head) * D;
        double* dq_terms_i = g.dq_terms.data() + (i * Hq + h) * D;
        double* dk_terms_j = g.dk_terms.data() + (j * Hk + kv_head) * D;
        const double scale_abs = std::fabs(options.softmax_scale);
        for (int64_t d = 0; d < D; ++d) {
          dq_i[d] += options.softmax_scale * dx * k_j[d];
          dk_j[d] += options.softmax_scale * dx * q_i[d];
          dq_terms_i[d] += scale_abs * dx_terms * std::fabs(k_j[d]);
          dk_terms_j[d] += scale_abs * dx_terms * std::fabs(q_i[d]);
        }
      }
      // The sink is one more softmax entry with no value: dL/dsink = -P_sink * D_i.
      if (has_sink) {
        g.dsinks[h] -= std::exp(sink - lse) * delta;
        g.dsinks_terms[h] += std::exp(sink - lse) * delta_terms;
      }
    }
  }
  return g;
}

namespace {

void append(std::vector<double>* to, const std::vector<double>& from) {
  to->insert(to->end(), from.begin(), from.end());
}

DropoutOptions dropout_options(const anyattn_fwd_params* params) {
  DropoutOptions dropout;
  if (params != nullptr) {
    dropout.p = params->dropout_p;
    dropout.seed = params->dropout_seed;
    dropout.offset = params->dropout_offset;
  }
  return dropout;
}

// Element i of a rank-1 index tensor (cu_seqlens, seqused_k).
int64_t index_at(const anyattn_tensor& t, int64_t i) {
  const int64_t index[ANYATTN_MAX_NDIM] = {i, 0, 0, 0};
  return static_cast<int64_t>(load(t, index));
}

}  // namespace

DenseGradients bwd_dense(const anyattn_tensor& q, const anyattn_tensor& k, const anyattn_tensor& v,
                         const anyattn_tensor& dout, const anyattn_fwd_params* params,
                         const anyattn_tensor* out_given) {
  const int64_t B = q.shape[0], Sq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Sk = k.shape[1], Hk = k.shape[2], Dv = v.shape[3];
  const ScoreOptions options = resolve_options(params, D);
  const DropoutOptions dropout = dropout_options(params);
  const anyattn_tensor* alibi = params != nullptr ? params->alibi_slopes : nullptr;
  const anyattn_tensor* sinks_tensor = params != nullptr ? params->sinks : nullptr;
  std::vector<double> alibi_all, sinks;
  if (alibi != nullptr) alibi_all = to_contiguous_f64(*alibi);
  if (sinks_tensor != nullptr) sinks = to_contiguous_f64(*sinks_tensor);

  DenseGradients result;
  result.dsinks.assign(static_cast<size_t>(Hq), 0.0);
  result.dsinks_terms.assign(static_cast<size_t>(Hq), 0.0);
  std::vector<double> lse_all(static_cast<size_t>(B * Hq * Sq));
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<double> q_b = to_contiguous_f64(batch_slice(q, b));
    const std::vector<double> k_b = to_contiguous_f64(batch_slice(k, b));
    const std::vector<double> v_b = to_contiguous_f64(batch_slice(v, b));
    const std::vector<double> dout_b = to_contiguous_f64(batch_slice(dout, b));
    std::vector<double> out_given_b;
    if (out_given != nullptr) out_given_b = to_contiguous_f64(batch_slice(*out_given, b));
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
    if (alibi != nullptr) in.alibi_slopes = alibi_all.data() + (alibi->ndim == 2 ? b * Hq : 0);
    if (sinks_tensor != nullptr) in.sinks = sinks.data();
    const SequenceGradients g =
        backprop_one_sequence(in, dout_b.data(), options, dropout, b,
                              out_given != nullptr ? out_given_b.data() : nullptr);
    append(&result.out, g.out);
    append(&result.lse, g.lse);
    append(&result.dq, g.dq);
    append(&result.dk, g.dk);
    append(&result.dv, g.dv);
    append(&result.dq_terms, g.dq_terms);
    append(&result.dk_terms, g.dk_terms);
    append(&result.dv_terms, g.dv_terms);
    for (int64_t h = 0; h < Hq; ++h) {
      result.dsinks[h] += g.dsinks[h];
      result.dsinks_terms[h] += g.dsinks_terms[h];
    }
  }
  return result;
}

VarlenGradients bwd_varlen(const anyattn_tensor& q, const anyattn_tensor& k,
                           const anyattn_tensor& v, const anyattn_tensor& dout,
                           const anyattn_tensor& cu_seqlens_q, const anyattn_tensor& cu_seqlens_k,
                           const anyattn_tensor* seqused_k, const anyattn_fwd_params* params,
                           const anyattn_tensor* out_given) {
  const int64_t total_q = q.shape[0], total_k = k.shape[0];
  const int64_t Hq = q.shape[1], Hk = k.shape[1], D = q.shape[2], Dv = v.shape[2];
  const ScoreOptions options = resolve_options(params, D);
  const DropoutOptions dropout = dropout_options(params);
  const std::vector<GatheredSequence> sequences =
      gather_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, params);
  const std::vector<double> dout_all = to_contiguous_f64(dout);
  std::vector<double> out_given_all;
  if (out_given != nullptr) out_given_all = to_contiguous_f64(*out_given);

  VarlenGradients result;
  result.assign_zeros(total_q, total_k, Hq, Hk, D, Dv);
  result.q_row_in_sequence.assign(static_cast<size_t>(total_q), 0);
  result.k_row_in_sequence.assign(static_cast<size_t>(total_k), 0);
  for (int64_t b = 0; b < static_cast<int64_t>(sequences.size()); ++b) {
    const GatheredSequence& seq = sequences[b];
    const int64_t q_first = index_at(cu_seqlens_q, b), k_first = index_at(cu_seqlens_k, b);
    const int64_t k_rows = index_at(cu_seqlens_k, b + 1) - k_first;
    SequenceInputs in;
    in.seqlen_q = seq.seqlen_q;
    in.seqlen_k = seq.seqlen_k;
    in.num_heads_q = Hq;
    in.num_heads_k = Hk;
    in.head_dim = D;
    in.head_dim_v = Dv;
    in.q = seq.q.data();
    in.k = seq.k.data();
    in.v = seq.v.data();
    if (!seq.alibi_slopes.empty()) in.alibi_slopes = seq.alibi_slopes.data();
    if (!seq.sinks.empty()) in.sinks = seq.sinks.data();
    const SequenceGradients g = backprop_one_sequence(
        in, dout_all.data() + q_first * Hq * Dv, options, dropout, b,
        out_given != nullptr ? out_given_all.data() + q_first * Hq * Dv : nullptr);
    // Rows of one sequence are contiguous in the packed layouts; lse is (Hq, total_q).
    std::copy(g.out.begin(), g.out.end(), result.out.begin() + q_first * Hq * Dv);
    std::copy(g.dq.begin(), g.dq.end(), result.dq.begin() + q_first * Hq * D);
    std::copy(g.dk.begin(), g.dk.end(), result.dk.begin() + k_first * Hk * D);
    std::copy(g.dv.begin(), g.dv.end(), result.dv.begin() + k_first * Hk * Dv);
    std::copy(g.dq_terms.begin(), g.dq_terms.end(), result.dq_terms.begin() + q_first * Hq * D);
    std::copy(g.dk_terms.begin(), g.dk_terms.end(), result.dk_terms.begin() + k_first * Hk * D);
    std::copy(g.dv_terms.begin(), g.dv_terms.end(), result.dv_terms.begin() + k_first * Hk * Dv);
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t i = 0; i < seq.seqlen_q; ++i) {
        result.lse[h * total_q + q_first + i] = g.lse[h * seq.seqlen_q + i];
      }
      result.dsinks[h] += g.dsinks[h];
      result.dsinks_terms[h] += g.dsinks_terms[h];
    }
    for (int64_t i = 0; i < seq.seqlen_q; ++i) result.q_row_in_sequence[q_first + i] = 1;
    for (int64_t j = 0; j < k_rows; ++j) result.k_row_in_sequence[k_first + j] = 1;
  }
  return result;
}

}  // namespace reference
}  // namespace anyattn
