#include "reference/reference_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/kv8_convert.h"
#include "reference/half_convert.h"

namespace anyattn {
namespace reference {
namespace {

// Element (i0, i1, i2, i3) of t (the leading ndim coordinates are used).
double at(const anyattn_tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) {
  const int64_t index[ANYATTN_MAX_NDIM] = {i0, i1, i2, i3};
  return load(t, index);
}

int64_t int_at(const anyattn_tensor& t, int64_t i0, int64_t i1 = 0) {
  return static_cast<int64_t>(at(t, i0, i1));
}

// Appends rows [first, first + count) of a rank-3 (rows, H, X) tensor to `dst`.
void append_rows(const anyattn_tensor& t, int64_t first, int64_t count, std::vector<double>* dst) {
  for (int64_t r = first; r < first + count; ++r) {
    for (int64_t h = 0; h < t.shape[1]; ++h) {
      for (int64_t x = 0; x < t.shape[2]; ++x) dst->push_back(at(t, r, h, x));
    }
  }
}

// The per-sequence ALiBi slopes and sinks of `params` for sequence b.
void gather_options(const anyattn_fwd_params* params, int64_t b, int64_t heads_q,
                    GatheredSequence* seq) {
  if (params == nullptr) return;
  if (params->alibi_slopes != nullptr) {
    const anyattn_tensor& slopes = *params->alibi_slopes;
    for (int64_t h = 0; h < heads_q; ++h) {
      seq->alibi_slopes.push_back(slopes.ndim == 2 ? at(slopes, b, h) : at(slopes, h));
    }
  }
  if (params->sinks != nullptr) {
    for (int64_t h = 0; h < heads_q; ++h) seq->sinks.push_back(at(*params->sinks, h));
  }
}

double round_to_dtype(int32_t dtype, double x) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case ANYATTN_DTYPE_F16:
      return round_to_f16(f);
    case ANYATTN_DTYPE_BF16:
      return round_to_bf16(f);
    default:
      return f;
  }
}

// `rotate` evaluated in f32 arithmetic (each product and sum rounded to f32), as a framework
// applying rotary to f32 (or upcast) tensors computes it.
void rotate_f32(double* x, const double* cos, const double* sin, int64_t rotary_dim,
                bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < half; ++t) {
    const int64_t a = interleaved ? 2 * t : t;
    const int64_t b = interleaved ? 2 * t + 1 : t + half;
    const float x0 = static_cast<float>(x[a]), x1 = static_cast<float>(x[b]);
    const float c = static_cast<float>(cos[t]), s = static_cast<float>(sin[t]);
    const float p0 = x0 * c, p1 = x1 * s, p2 = x0 * s, p3 = x1 * c;
    x[a] = static_cast<float>(p0 - p1);
    x[b] = static_cast<float>(p2 + p3);
  }
}

}  // namespace

void attend_gathered(const GatheredSequence& seq, const HeadShape& shape,
                     const ScoreOptions& options, double* out, double* lse,
                     int64_t lse_head_stride) {
  SequenceInputs in;
  in.seqlen_q = seq.seqlen_q;
  in.seqlen_k = seq.seqlen_k;
  in.num_heads_q = shape.num_heads_q;
  in.num_heads_k = shape.num_heads_k;
  in.head_dim = shape.head_dim;
  in.head_dim_v = shape.head_dim_v;
  in.q = seq.q.data();
  in.k = seq.k.data();
  in.v = seq.v.data();
  in.alibi_slopes = seq.alibi_slopes.empty() ? nullptr : seq.alibi_slopes.data();
  in.sinks = seq.sinks.empty() ? nullptr : seq.sinks.data();
  attend_one_sequence(in, options, out, lse, lse_head_stride);
}

// ---- Varlen -------------------------------------------------------------------------------------

std::vector<GatheredSequence> gather_varlen(const anyattn_tensor& q, const anyattn_tensor& k,
                                            const anyattn_tensor& v,
                                            const anyattn_tensor& cu_seqlens_q,
                                            const anyattn_tensor& cu_seqlens_k,
                                            const anyattn_tensor* seqused_k,
                                            const anyattn_fwd_params* params) {
  const int64_t batch = cu_seqlens_q.shape[0] - 1;
  std::vector<GatheredSequence> sequences(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    GatheredSequence& seq = sequences[b];
    const int64_t q_first = int_at(cu_seqlens_q, b), k_first = int_at(cu_seqlens_k, b);
    seq.seqlen_q = int_at(cu_seqlens_q, b + 1) - q_first;
    seq.seqlen_k =
        seqused_k != nullptr ? int_at(*seqused_k, b) : int_at(cu_seqlens_k, b + 1) - k_first;
    append_rows(q, q_first, seq.seqlen_q, &seq.q);
    append_rows(k, k_first, seq.seqlen_k, &seq.k);
    append_rows(v, k_first, seq.seqlen_k, &seq.v);
    gather_options(params, b, q.shape[1], &seq);
  }
  return sequences;
}

VarlenOutputs fwd_varlen(const anyattn_tensor& q, const anyattn_tensor& k, const anyattn_tensor& v,
                         const anyattn_tensor& cu_seqlens_q, const anyattn_tensor& cu_seqlens_k,
                         const anyattn_tensor* seqused_k, const anyattn_fwd_params* params) {
  const int64_t total_q = q.shape[0];
  const HeadShape shape{q.shape[1], k.shape[1], q.shape[2], v.shape[2]};
  const ScoreOptions options = resolve_options(params, shape.head_dim);
  const std::vector<GatheredSequence> sequences =
      gather_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, params);

  VarlenOutputs result;
  result.out.assign(static_cast<size_t>(total_q * shape.num_heads_q * shape.head_dim_v), 0.0);
  result.lse.assign(static_cast<size_t>(shape.num_heads_q * total_q), 0.0);
  result.row_in_sequence.assign(static_cast<size_t>(total_q), 0);
  for (size_t b = 0; b < sequences.size(); ++b) {
    const int64_t first = int_at(cu_seqlens_q, static_cast<int64_t>(b));
    for (int64_t i = 0; i < sequences[b].seqlen_q; ++i) result.row_in_sequence[first + i] = 1;
    // The sequence's out rows are contiguous in (total_q, Hq, Dv); its lse entries of head h are
    // lse[h * total_q + first + i].
    attend_gathered(sequences[b], shape, options,
                    result.out.data() + first * shape.num_heads_q * shape.head_dim_v,
                    result.lse.data() + first, total_q);
  }
  return result;
}

// ---- Rotary -------------------------------------------------------------------------------------

void rotate(double* x, const double* cos, const double* sin, int64_t rotary_dim, bool interleaved) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < half; ++t) {
    const int64_t a = interleaved ? 2 * t : t;
    const int64_t b = interleaved ? 2 * t + 1 : t + half;
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * cos[t] - x1 * sin[t];
    x[b] = x0 * sin[t] + x1 * cos[t];
  }
}

// ---- KV cache -----------------------------------------------------------------------------------

void cache_location(const anyattn_tensor& k_cache, const anyattn_kvcache_params& cache, int64_t b,
                    int64_t position, int64_t* batch_or_page, int64_t* row) {
  if (cache.block_table != nullptr) {
    const int64_t page_size = k_cache.shape[1];
    *batch_or_page = int_at(*cache.block_table, b, position / page_size);
    *row = position % page_size;
    return;
  }
  *batch_or_page = cache.cache_batch_idx != nullptr ? int_at(*cache.cache_batch_idx, b) : b;
  *row = position;
}

double cache_descale(const anyattn_tensor* descale, int64_t b, int64_t h) {
  if (descale == nullptr) return 1.0;
  if (descale->ndim == 2) return at(*descale, b, h);
  return at(*descale, descale->shape[0] == 1 ? 0 : h);
}

KvcacheInputs gather_kvcache(const anyattn_tensor& q, const anyattn_tensor& k_cache,
                             const anyattn_tensor& v_cache, const anyattn_kvcache_params& cache,
                             const anyattn_fwd_params* params, Rounding rounding) {
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1], heads_q = q.shape[2];
  const int64_t head_dim = q.shape[3];
  const int64_t heads_k = k_cache.shape[2], head_dim_v = v_cache.shape[3];
  const int64_t rows_per_entry = k_cache.shape[1];  // S_cache or page_size
  const bool has_new = cache.k_new != nullptr;
  const int64_t new_tokens = has_new ? cache.k_new->shape[1] : 0;
  const bool rotary = cache.rotary_cos != nullptr;
  const int64_t rotary_dim = rotary ? 2 * cache.rotary_cos->shape[1] : 0;
  const bool interleaved = cache.rotary_interleaved != 0;
  const ScoreOptions options = resolve_options(params, head_dim);
  const bool q_per_row = options.window_left >= 0 || options.window_right >= 0;
  const bool round = rounding == Rounding::kLikeInputDtype;

  const bool kv8 = k_cache.dtype == ANYATTN_DTYPE_FP8_E4M3 ||
                   k_cache.dtype == ANYATTN_DTYPE_FP8_E5M2 || k_cache.dtype == ANYATTN_DTYPE_I8;
  const bool token_scales = kv8 && cache.k_token_scale != nullptr;
  // A shared latent cache (absorbed MLA: v_cache a column prefix of k_cache): V row j is the
  // first Dv values of K row j, stored once, so an 8-bit one's V values take K's factors.
  bool latent = v_cache.data == k_cache.data && head_dim_v <= head_dim;
  for (int d = 0; d < 4; ++d) latent = latent && v_cache.strides[d] == k_cache.strides[d];

  KvcacheInputs result;
  result.k_cache = to_contiguous_f64(k_cache);
  result.v_cache = to_contiguous_f64(v_cache);
  if (token_scales) {
    result.k_token_scale = to_contiguous_f64(*cache.k_token_scale);
    result.v_token_scale = to_contiguous_f64(
        latent && cache.v_token_scale == nullptr ? *cache.k_token_scale : *cache.v_token_scale);
  }
  auto scale_at = [&](std::vector<double>& scales, int64_t n, int64_t r, int64_t h) -> double* {
    return &scales[(n * rows_per_entry + r) * heads_k + h];
  };
  // An 8-bit cache row: x (f32 values) quantized by the library's routine into stored values
  // and, with token scales, its scale.
  auto quantize_row = [&](double* x, int64_t count, double descale, double* token_scale) {
    std::vector<float> values(x, x + count);
    std::vector<uint8_t> bytes(static_cast<size_t>(count));
    float scale = 0.f;
    const auto format = static_cast<convert::Kv8>(k_cache.dtype);
    convert::quantize_kv8_row(format, values.data(), count, static_cast<float>(descale),
                              token_scale != nullptr ? &scale : nullptr, bytes.data());
    for (int64_t d = 0; d < count; ++d) x[d] = convert::kv8_to_f32(format, bytes[d]);
    if (token_scale != nullptr) *token_scale = scale;
  };
  // Row starts by pointer arithmetic: a cache without columns (head dim 0) is an empty vector,
  // which must not be indexed.
  auto k_at = [&](int64_t n, int64_t r, int64_t h) {
    return result.k_cache.data() + ((n * rows_per_entry + r) * heads_k + h) * head_dim;
  };
  auto v_at = [&](int64_t n, int64_t r, int64_t h) {
    return result.v_cache.data() + ((n * rows_per_entry + r) * heads_k + h) * head_dim_v;
  };
  // The cos / sin row of one position.
  std::vector<double> cos_row(static_cast<size_t>(rotary_dim / 2));
  std::vector<double> sin_row(cos_row.size());
  auto load_angles = [&](int64_t position) {
    for (int64_t t = 0; t < rotary_dim / 2; ++t) {
      cos_row[t] = at(*cache.rotary_cos, position, t);
      sin_row[t] = at(*cache.rotary_sin, position, t);
    }
  };
  auto rotate_row = [&](double* x) {
    if (round) {
      rotate_f32(x, cos_row.data(), sin_row.data(), rotary_dim, interleaved);
      for (int64_t d = 0; d < rotary_dim; ++d) x[d] = round_to_dtype(q.dtype, x[d]);
    } else {
      rotate(x, cos_row.data(), sin_row.data(), rotary_dim, interleaved);
    }
  };

  std::vector<int64_t> stored(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    if (cache.cache_seqlens != nullptr) {
      stored[b] = int_at(*cache.cache_seqlens, b);
    } else {
      stored[b] = cache.cache_seqlen >= 0 ? cache.cache_seqlen : k_cache.shape[1] - new_tokens;
    }
  }

  // 1. The append, every sequence before any attention.
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < new_tokens; ++t) {
      const int64_t position = stored[b] + t;
      int64_t n = 0, r = 0;
      cache_location(k_cache, cache, b, position, &n, &r);
      result.appended_rows.push_back(n);
      result.appended_rows.push_back(r);
      if (rotary) load_angles(position);
      for (int64_t h = 0; h < heads_k; ++h) {
        double* k_row = k_at(n, r, h);
        for (int64_t d = 0; d < head_dim; ++d) k_row[d] = at(*cache.k_new, b, t, h, d);
        double* v_row = v_at(n, r, h);
        for (int64_t d = 0; d < head_dim_v; ++d) v_row[d] = at(*cache.v_new, b, t, h, d);
        if (!kv8) {
          if (rotary) rotate_row(k_row);
          continue;
        }
        // The library rotates in f32, then quantizes.
        if (rotary) rotate_f32(k_row, cos_row.data(), sin_row.data(), rotary_dim, interleaved);
        quantize_row(k_row, head_dim, cache_descale(cache.k_descale, b, h),
                     token_scales ? scale_at(result.k_token_scale, n, r, h) : nullptr);
        if (latent) {
          std::copy(k_row, k_row + head_dim_v, v_row);
          if (token_scales) {
            *scale_at(result.v_token_scale, n, r, h) = *scale_at(result.k_token_scale, n, r, h);
          }
          continue;
        }
        quantize_row(v_row, head_dim_v, cache_descale(cache.v_descale, b, h),
                     token_scales ? scale_at(result.v_token_scale, n, r, h) : nullptr);
      }
    }
  }

  // 2. Each sequence's queries and keys.
  for (int64_t b = 0; b < batch; ++b) {
    GatheredSequence seq;
    const int64_t first = cache.cache_leftpad != nullptr ? int_at(*cache.cache_leftpad, b) : 0;
    const int64_t end = stored[b] + new_tokens;
    seq.seqlen_q = seqlen_q;
    seq.seqlen_k = end - first;
    for (int64_t i = 0; i < seqlen_q; ++i) {
      if (rotary) load_angles(stored[b] + (q_per_row ? i : 0));
      for (int64_t h = 0; h < heads_q; ++h) {
        const size_t row = seq.q.size();
        for (int64_t d = 0; d < head_dim; ++d) seq.q.push_back(at(q, b, i, h, d));
        if (rotary) rotate_row(&seq.q[row]);
      }
    }
    for (int64_t position = first; position < end; ++position) {
      int64_t n = 0, r = 0;
      cache_location(k_cache, cache, b, position, &n, &r);
      for (int64_t h = 0; h < heads_k; ++h) {
        double k_factor = 1.0, v_factor = 1.0;  // an 8-bit cache's dequantization
        if (kv8) {
          k_factor = cache_descale(cache.k_descale, b, h);
          v_factor = cache_descale(cache.v_descale, b, h);
          if (token_scales) {
            k_factor *= *scale_at(result.k_token_scale, n, r, h);
            v_factor *= *scale_at(result.v_token_scale, n, r, h);
          }
          if (latent) v_factor = k_factor;
        }
        for (int64_t d = 0; d < head_dim; ++d) seq.k.push_back(*(k_at(n, r, h) + d) * k_factor);
        for (int64_t d = 0; d < head_dim_v; ++d) seq.v.push_back(*(v_at(n, r, h) + d) * v_factor);
      }
    }
    gather_options(params, b, heads_q, &seq);
    result.sequences.push_back(std::move(seq));
  }
  return result;
}

KvcacheOutputs fwd_kvcache(const anyattn_tensor& q, const anyattn_tensor& k_cache,
                           const anyattn_tensor& v_cache, const anyattn_kvcache_params& cache,
                           const anyattn_fwd_params* params) {
  const int64_t batch = q.shape[0], seqlen_q = q.shape[1];
  const HeadShape shape{q.shape[2], k_cache.shape[2], q.shape[3], v_cache.shape[3]};
  const ScoreOptions options = resolve_options(params, shape.head_dim);
  KvcacheInputs inputs = gather_kvcache(q, k_cache, v_cache, cache, params, Rounding::kExact);

  KvcacheOutputs result;
  result.out.assign(static_cast<size_t>(batch * seqlen_q * shape.num_heads_q * shape.head_dim_v),
                    0.0);
  result.lse.assign(static_cast<size_t>(batch * shape.num_heads_q * seqlen_q), 0.0);
  for (int64_t b = 0; b < batch; ++b) {
    attend_gathered(inputs.sequences[b], shape, options,
                    result.out.data() + b * seqlen_q * shape.num_heads_q * shape.head_dim_v,
                    result.lse.data() + b * shape.num_heads_q * seqlen_q, seqlen_q);
  }
  result.k_cache = std::move(inputs.k_cache);
  result.v_cache = std::move(inputs.v_cache);
  result.k_token_scale = std::move(inputs.k_token_scale);
  result.v_token_scale = std::move(inputs.v_token_scale);
  result.appended_rows = std::move(inputs.appended_rows);
  return result;
}

// ---- Merge --------------------------------------------------------------------------------------

MergeOutputs merge_states(const anyattn_tensor& out_a, const anyattn_tensor& lse_a,
                          const anyattn_tensor& out_b, const anyattn_tensor& lse_b) {
  // View both forms as (N, T, H, Dv) with lse (N, H, T).
  const bool four = out_a.ndim == 4;
  const int64_t n_outer = four ? out_a.shape[0] : 1;
  const int64_t tokens = out_a.shape[four ? 1 : 0], heads = out_a.shape[four ? 2 : 1];
  const int64_t dim = out_a.shape[four ? 3 : 2];
  const std::vector<double> oa = to_contiguous_f64(out_a), ob = to_contiguous_f64(out_b);
  const std::vector<double> la = to_contiguous_f64(lse_a), lb = to_contiguous_f64(lse_b);
  const double kMinusInf = -std::numeric_limits<double>::infinity();

  MergeOutputs result;
  result.out.assign(oa.size(), 0.0);
  result.lse.assign(la.size(), 0.0);
  for (int64_t n = 0; n < n_outer; ++n) {
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t l = (n * heads + h) * tokens + t;
        const int64_t o = ((n * tokens + t) * heads + h) * dim;
        const double top = std::fmax(la[l], lb[l]);
        if (top == kMinusInf) {
          result.lse[l] = kMinusInf;
          continue;  // out stays 0.
        }
        const double wa = std::exp(la[l] - top), wb = std::exp(lb[l] - top);
        const double total = wa + wb;
        for (int64_t d = 0; d < dim; ++d) {
          const double a = wa != 0.0 ? wa * oa[o + d] : 0.0;
          const double b = wb != 0.0 ? wb * ob[o + d] : 0.0;
          result.out[o + d] = (a + b) / total;
        }
        result.lse[l] =
            std::isnan(la[l]) || std::isnan(lb[l]) ? la[l] + lb[l] : top + std::log(total);
      }
    }
  }
  return result;
}

}  // namespace reference
}  // namespace anyattn
