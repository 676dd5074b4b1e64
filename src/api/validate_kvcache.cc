#include "api/validate_kvcache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "api/args_layout.h"
#include "api/errors.h"
#include "api/tensor_checks.h"
#include "api/validate_varlen.h"

namespace anyattn::api {
namespace {

anyattn_kvcache_params read_cache_params(const char* fn, const anyattn_kvcache_params* cache) {
  anyattn_kvcache_params result;
  anyattn_kvcache_params_init(&result);
  if (cache == nullptr) return result;
  if (cache->struct_size < sizeof(size_t)) {
    fail_invalid(fn, ": cache->struct_size is ", cache->struct_size,
                 "; initialise it with anyattn_kvcache_params_init()");
  }
  const size_t copy = cache->struct_size < sizeof(result) ? cache->struct_size : sizeof(result);
  std::memcpy(static_cast<void*>(&result), cache, copy);
  result.struct_size = sizeof(result);
  return result;
}

void check_same_dtype(const char* fn, const char* name, const anyattn_tensor* t,
                      const anyattn_tensor* q) {
  if (t->dtype != q->dtype) {
    fail_invalid(fn, ": ", name, ".dtype is ", dtype_name(t->dtype), " but q.dtype is ",
                 dtype_name(q->dtype),
                 "; q, the caches, the new keys/values and out share one "
                 "dtype");
  }
}

// The checks and the FwdArgs of both entry points. Without cu_seqlens_q, q and out are dense
// (B, Sq, Hq, D[v]) and lse (B, Hq, Sq); with it, packed (total_q, Hq, D[v]) and (Hq, total_q),
// and the call may not append or rotate.
ValidatedKvcache validate_cache_call(const char* fn, const anyattn_tensor* q,
                                     const anyattn_tensor* k_cache, const anyattn_tensor* v_cache,
                                     const anyattn_tensor* out, const anyattn_tensor* lse,
                                     const anyattn_tensor* cu_seqlens_q, int64_t max_seqlen_q,
                                     const anyattn_kvcache_params* cache_in,
                                     const anyattn_fwd_params* params_in) {
  const anyattn_fwd_params params = read_fwd_params(fn, params_in);
  const anyattn_kvcache_params cache = read_cache_params(fn, cache_in);
  const bool varlen = cu_seqlens_q != nullptr;
  if (varlen) {
    for (const auto& [name, t] :
         {std::pair{"cache->k_new", cache.k_new}, std::pair{"cache->v_new", cache.v_new},
          std::pair{"cache->rotary_cos", cache.rotary_cos},
          std::pair{"cache->rotary_sin", cache.rotary_sin}}) {
      if (t != nullptr) {
        fail_unsupported(fn, ": ", name,
                         " is given; appending and rotary need dense q (anyattn_fwd_kvcache), "
                         "this call only reads the cache");
      }
    }
  }
  const std::initializer_list<int32_t> float_types = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16,
                                                      ANYATTN_DTYPE_BF16};
  const bool paged = cache.block_table != nullptr;
  const char* cache_dims = paged ? "(num_blocks, page_size, Hk, D)" : "(B_cache, S_cache, Hk, D)";
  const int q_ndim = varlen ? 3 : 4;
  const TensorExtent q_extent =
      check_tensor(fn, "q", q, q_ndim, varlen ? "(total_q, Hq, D)" : "(B, Sq, Hq, D)", float_types);
  const TensorExtent k_extent = check_tensor(fn, "k_cache", k_cache, 4, cache_dims, float_types);
  const TensorExtent v_extent = check_tensor(fn, "v_cache", v_cache, 4, cache_dims, float_types);
  const TensorExtent out_extent = check_tensor(
      fn, "out", out, q_ndim, varlen ? "(total_q, Hq, Dv)" : "(B, Sq, Hq, Dv)", float_types);
  check_same_dtype(fn, "k_cache", k_cache, q);
  check_same_dtype(fn, "v_cache", v_cache, q);
  check_same_dtype(fn, "out", out, q);
  // Dense: (B, Sq, Hq, D). Varlen: (total_q, Hq, D), B from cu_seqlens_q, Sq = max_seqlen_q
  // until the lengths are read.
  const int64_t batch = varlen ? read_varlen_batch(fn, cu_seqlens_q) : q->shape[0];
  const int64_t seqlen_q = varlen ? max_seqlen_q : q->shape[1];
  const int64_t heads_q = q->shape[q_ndim - 2];
  const int64_t head_dim = q->shape[q_ndim - 1];
  const int64_t cache_rows = k_cache->shape[0], cache_len = k_cache->shape[1];
  const int64_t heads_k = k_cache->shape[2], head_dim_v = v_cache->shape[3];
  const char* q_heads_name = varlen ? "q.shape[1]" : "q.shape[2]";
  check_head_dims(fn, varlen ? "q.shape[2]" : "q.shape[3]", head_dim, "v_cache.shape[3]",
                  head_dim_v);
  if (k_cache->shape[3] != head_dim) {
    fail_invalid(fn, ": k_cache.shape[3] is ", k_cache->shape[3], "; must equal ",
                 varlen ? "q.shape[2]" : "q.shape[3]", " (D) = ", head_dim);
  }
  if (v_cache->shape[0] != cache_rows || v_cache->shape[1] != cache_len ||
      v_cache->shape[2] != heads_k) {
    fail_invalid(fn, ": v_cache.shape (", v_cache->shape[0], ", ", v_cache->shape[1], ", ",
                 v_cache->shape[2], ", ...) must match k_cache's (", cache_rows, ", ", cache_len,
                 ", ", heads_k, ", ...)");
  }
  check_heads(fn, q_heads_name, heads_q, "k_cache.shape[2]", heads_k);
  if (varlen) {
    if (out->shape[0] != q->shape[0] || out->shape[1] != heads_q || out->shape[2] != head_dim_v) {
      fail_invalid(fn, ": out.shape is (", out->shape[0], ", ", out->shape[1], ", ", out->shape[2],
                   "); expected (total_q, Hq, Dv) = (", q->shape[0], ", ", heads_q, ", ",
                   head_dim_v, ")");
    }
    if (max_seqlen_q < 0 || max_seqlen_q > kMaxExtent) {
      fail_invalid(fn, ": max_seqlen_q is ", max_seqlen_q, "; supported: 0..", kMaxExtent);
    }
  } else if (out->shape[0] != batch || out->shape[1] != seqlen_q || out->shape[2] != heads_q ||
             out->shape[3] != head_dim_v) {
    fail_invalid(fn, ": out.shape is (", out->shape[0], ", ", out->shape[1], ", ", out->shape[2],
                 ", ", out->shape[3], "); expected (B, Sq, Hq, Dv) = (", batch, ", ", seqlen_q,
                 ", ", heads_q, ", ", head_dim_v, ")");
  }
  if (batch > kMaxExtent || seqlen_q > kMaxExtent || cache_len > kMaxExtent) {
    fail_unsupported(fn, ": B, Sq and the cache length are limited to ", kMaxExtent);
  }
  check_no_self_overlap(fn, "out", out);
  check_no_self_overlap(fn, "k_cache", k_cache);
  check_no_self_overlap(fn, "v_cache", v_cache);
  check_disjoint(fn, "out", out_extent, "q", q_extent);
  check_disjoint(fn, "out", out_extent, "k_cache", k_extent);
  check_disjoint(fn, "out", out_extent, "v_cache", v_extent);

  ValidatedKvcache result;
  ValidatedFwd& attention = result.attention;
  cpu::FwdArgs& a = attention.args;

  // New keys and values.
  int64_t new_tokens = 0;
  if ((cache.k_new == nullptr) != (cache.v_new == nullptr)) {
    fail_invalid(fn, ": cache->k_new and cache->v_new must be given together");
  }
  if (cache.k_new != nullptr) {
    const TensorExtent kn =
        check_tensor(fn, "cache->k_new", cache.k_new, 4, "(B, S_new, Hk, D)", float_types);
    const TensorExtent vn =
        check_tensor(fn, "cache->v_new", cache.v_new, 4, "(B, S_new, Hk, Dv)", float_types);
    check_same_dtype(fn, "cache->k_new", cache.k_new, q);
    check_same_dtype(fn, "cache->v_new", cache.v_new, q);
    new_tokens = cache.k_new->shape[1];
    const int64_t* ks = cache.k_new->shape;
    const int64_t* vs = cache.v_new->shape;
    if (ks[0] != batch || ks[2] != heads_k || ks[3] != head_dim) {
      fail_invalid(fn, ": cache->k_new.shape is (", ks[0], ", ", ks[1], ", ", ks[2], ", ", ks[3],
                   "); expected (B, S_new, Hk, D) = (", batch, ", S_new, ", heads_k, ", ", head_dim,
                   ")");
    }
    if (vs[0] != batch || vs[1] != new_tokens || vs[2] != heads_k || vs[3] != head_dim_v) {
      fail_invalid(fn, ": cache->v_new.shape is (", vs[0], ", ", vs[1], ", ", vs[2], ", ", vs[3],
                   "); expected (B, S_new, Hk, Dv) = (", batch, ", ", new_tokens, ", ", heads_k,
                   ", ", head_dim_v, ")");
    }
    for (const auto& [name, e] : {std::pair{"k_cache", k_extent}, std::pair{"v_cache", v_extent}}) {
      check_disjoint(fn, name, e, "cache->k_new", kn);
      check_disjoint(fn, name, e, "cache->v_new", vn);
    }
    // Writing one cache would then change the other.
    check_disjoint(fn, "k_cache", k_extent, "v_cache", v_extent);
    result.append.new_tokens = new_tokens;
    result.append.k_new = cache.k_new->data;
    result.append.k_new_batch_stride = cache.k_new->strides[0];
    result.append.k_new_row_stride = cache.k_new->strides[1];
    result.append.k_new_head_stride = cache.k_new->strides[2];
    result.append.v_new = cache.v_new->data;
    result.append.v_new_batch_stride = cache.v_new->strides[0];
    result.append.v_new_row_stride = cache.v_new->strides[1];
    result.append.v_new_head_stride = cache.v_new->strides[2];
  }

  // Where each sequence's keys live.
  int64_t capacity = cache_len;  // cache positions available to one sequence
  if (paged) {
    auto [columns, table] = read_int32_matrix(fn, "cache->block_table", cache.block_table, batch);
    if (cache_len < 1) fail_invalid(fn, ": the page size (k_cache.shape[1]) must be >= 1");
    if (cache.cache_batch_idx != nullptr) {
      fail_invalid(fn, ": cache->cache_batch_idx cannot be combined with cache->block_table");
    }
    attention.block_table = std::move(table);
    a.block_table_stride = columns;
    a.page_size = cache_len;
    capacity = columns * cache_len;
  } else if (cache.cache_batch_idx != nullptr) {
    attention.kv_batch_index =
        read_int32_vector(fn, "cache->cache_batch_idx", cache.cache_batch_idx, batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int32_t index = attention.kv_batch_index[b];
      if (index < 0 || index >= cache_rows) {
        fail_invalid(fn, ": cache->cache_batch_idx[", b, "] is ", index,
                     "; must be in [0, B_cache = ", cache_rows, ")");
      }
    }
    if (new_tokens > 0) {
      std::vector<int32_t> sorted = attention.kv_batch_index;
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
        fail_invalid(fn,
                     ": cache->cache_batch_idx repeats a cache batch while new keys are "
                     "appended; two sequences would write the same cache rows");
      }
    }
  } else if (cache_rows != batch) {
    fail_invalid(fn, ": k_cache.shape[0] is ", cache_rows, " but B is ", batch,
                 "; give cache->cache_batch_idx to map sequences to cache rows");
  }

  // Lengths.
  if (cache.cache_seqlens != nullptr) {
    result.cache_seqlens =
        read_int32_vector(fn, "cache->cache_seqlens", cache.cache_seqlens, batch);
  } else {
    int64_t length = cache.cache_seqlen;
    if (length == -1) {
      if (paged) {
        fail_invalid(fn, ": a paged cache needs cache->cache_seqlens or cache->cache_seqlen >= 0");
      }
      length = cache_len - new_tokens;
    }
    if (length < 0 || length > kMaxExtent) {
      fail_invalid(fn, ": cache->cache_seqlen is ", cache.cache_seqlen,
                   "; must be -1 (whole cache) or in [0, ", kMaxExtent, "]");
    }
    result.cache_seqlens.assign(static_cast<size_t>(batch), static_cast<int32_t>(length));
  }
  attention.k_start.assign(static_cast<size_t>(batch), 0);
  if (cache.cache_leftpad != nullptr) {
    attention.k_start = read_int32_vector(fn, "cache->cache_leftpad", cache.cache_leftpad, batch);
  }
  attention.seqlens_k.resize(static_cast<size_t>(batch));
  int64_t max_keys = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t stored = result.cache_seqlens[b];
    const int64_t total = stored + new_tokens;
    const int64_t start = attention.k_start[b];
    if (stored < 0) {
      fail_invalid(fn, ": cache->cache_seqlens[", b, "] is ", stored, "; must be >= 0");
    }
    if (total > capacity) {
      fail_invalid(fn, ": sequence ", b, " needs ", total, " cache positions (cache_seqlens ",
                   stored, " + S_new ", new_tokens, ") but the cache holds ", capacity,
                   paged ? " (block_table columns x page_size)" : " (S_cache)");
    }
    if (start < 0 || start > stored) {
      fail_invalid(fn, ": cache->cache_leftpad[", b, "] is ", start, "; must be in [0, ",
                   "cache_seqlens[", b, "] = ", stored, "]");
    }
    if (paged) {
      for (int64_t page = start / cache_len; page * cache_len < total; ++page) {
        const int32_t entry = attention.block_table[b * a.block_table_stride + page];
        if (entry < 0 || entry >= cache_rows) {
          fail_invalid(fn, ": cache->block_table[", b, "][", page, "] is ", entry,
                       "; must be in [0, num_blocks = ", cache_rows,
                       ") for every page holding a position the call reads or writes");
        }
      }
    }
    attention.seqlens_k[b] = static_cast<int32_t>(total);
    max_keys = std::max(max_keys, total - start);
  }
  if (paged && new_tokens > 0) {
    // Two sequences must not append into the same cache row (pages may be shared for reading).
    std::vector<std::pair<int64_t, int64_t>> written;  // (page * page_size + row, sequence)
    written.reserve(static_cast<size_t>(batch * new_tokens));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t p = result.cache_seqlens[b]; p < result.cache_seqlens[b] + new_tokens; ++p) {
        const int64_t page = attention.block_table[b * a.block_table_stride + p / cache_len];
        written.emplace_back(page * cache_len + p % cache_len, b);
      }
    }
    std::sort(written.begin(), written.end());
    for (size_t i = 1; i < written.size(); ++i) {
      if (written[i].first == written[i - 1].first) {
        fail_invalid(fn, ": sequences ", written[i - 1].second, " and ", written[i].second,
                     " would both append into row ", written[i].first % cache_len, " of page ",
                     written[i].first / cache_len, " (cache->block_table maps them to it)");
      }
    }
  }

  if (varlen) {
    attention.cu_seqlens_q = read_cu_seqlens(fn, "cu_seqlens_q", cu_seqlens_q, batch, q->shape[0],
                                             "total_q", max_seqlen_q, "max_seqlen_q");
    fill_packed_queries_cache_layout(q, k_cache, v_cache, out, &a);
    a.batch = batch;
    // The longest sequence, not max_seqlen_q: the plan (direct decode loop or blocks) follows it.
    a.seqlen_q = 0;
    for (int64_t b = 0; b < batch; ++b) {
      a.seqlen_q =
          std::max<int64_t>(a.seqlen_q, attention.cu_seqlens_q[b + 1] - attention.cu_seqlens_q[b]);
    }
    a.cu_seqlens_q = attention.cu_seqlens_q.data();
  } else {
    fill_dense_layout(q, k_cache, v_cache, out, &a);
  }
  a.seqlen_k = max_keys;
  if (lse != nullptr) {
    const TensorExtent lse_extent =
        varlen ? check_tensor(fn, "lse", lse, 2, "(Hq, total_q)", {ANYATTN_DTYPE_F32})
               : check_tensor(fn, "lse", lse, 3, "(B, Hq, Sq)", {ANYATTN_DTYPE_F32});
    if (varlen && (lse->shape[0] != heads_q || lse->shape[1] != q->shape[0])) {
      fail_invalid(fn, ": lse.shape is (", lse->shape[0], ", ", lse->shape[1],
                   "); expected (Hq, total_q) = (", heads_q, ", ", q->shape[0], ")");
    }
    if (!varlen &&
        (lse->shape[0] != batch || lse->shape[1] != heads_q || lse->shape[2] != seqlen_q)) {
      fail_invalid(fn, ": lse.shape is (", lse->shape[0], ", ", lse->shape[1], ", ", lse->shape[2],
                   "); expected (B, Hq, Sq) = (", batch, ", ", heads_q, ", ", seqlen_q, ")");
    }
    check_no_self_overlap(fn, "lse", lse);
    check_disjoint(fn, "lse", lse_extent, "q", q_extent);
    check_disjoint(fn, "lse", lse_extent, "k_cache", k_extent);
    check_disjoint(fn, "lse", lse_extent, "v_cache", v_extent);
    check_disjoint(fn, "lse", lse_extent, "out", out_extent);
    fill_lse_layout(lse, varlen, &a);
  }
  apply_attention_options(fn, params, &a);
  if (a.dropout_threshold != 0) {
    fail_unsupported(fn, ": params->dropout_p is ", params.dropout_p,
                     "; dropout is not supported with a KV cache (inference only)");
  }

  // Rotary: the new keys at their cache positions, q at cache_seqlens[b] (+ i when the mask is
  // causal or windowed, as flash-attn does).
  if ((cache.rotary_cos == nullptr) != (cache.rotary_sin == nullptr)) {
    fail_invalid(fn, ": cache->rotary_cos and cache->rotary_sin must be given together");
  }
  if (cache.rotary_cos != nullptr) {
    if (new_tokens == 0) {
      fail_invalid(fn,
                   ": rotary embedding needs new keys (cache->k_new): the cached keys are "
                   "stored already rotated");
    }
    for (const auto& [name, t] : {std::pair{"cache->rotary_cos", cache.rotary_cos},
                                  std::pair{"cache->rotary_sin", cache.rotary_sin}}) {
      check_tensor(fn, name, t, 2, "(S_rotary, rotary_dim / 2)",
                   {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16});
    }
    const int64_t rotary_positions = cache.rotary_cos->shape[0];
    const int64_t half = cache.rotary_cos->shape[1];
    if (cache.rotary_sin->shape[0] != rotary_positions || cache.rotary_sin->shape[1] != half) {
      fail_invalid(fn, ": cache->rotary_sin.shape must equal cache->rotary_cos.shape (",
                   rotary_positions, ", ", half, ")");
    }
    if (half < 1 || 2 * half > head_dim) {
      fail_invalid(fn, ": rotary_dim = 2 * cache->rotary_cos.shape[1] = ", 2 * half,
                   "; must be in [2, D = ", head_dim, "]");
    }
    const bool q_per_row = params.causal || a.window_left < cpu::kUnboundedWindow ||
                           a.window_right < cpu::kUnboundedWindow;
    const int64_t q_rows = q_per_row ? std::max<int64_t>(seqlen_q, 1) : 1;
    const int64_t needed_rows = std::max(new_tokens, q_rows);
    for (int64_t b = 0; b < batch; ++b) {
      if (result.cache_seqlens[b] + needed_rows > rotary_positions) {
        fail_invalid(fn, ": cache->rotary_cos has ", rotary_positions, " positions but sequence ",
                     b, " uses positions up to ", result.cache_seqlens[b] + needed_rows - 1);
      }
    }
    // Gather the rows used, as f32: rows b * needed_rows + t = position cache_seqlens[b] + t.
    const std::vector<float> cos_all =
        read_float_rows(fn, "cache->rotary_cos", cache.rotary_cos, rotary_positions);
    const std::vector<float> sin_all =
        read_float_rows(fn, "cache->rotary_sin", cache.rotary_sin, rotary_positions);
    attention.rotary_cos.resize(static_cast<size_t>(batch * needed_rows * half));
    attention.rotary_sin.resize(attention.rotary_cos.size());
    attention.q_position.resize(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < needed_rows; ++t) {
        const int64_t src = (result.cache_seqlens[b] + t) * half;
        const int64_t dst = (b * needed_rows + t) * half;
        std::copy_n(cos_all.begin() + src, half, attention.rotary_cos.begin() + dst);
        std::copy_n(sin_all.begin() + src, half, attention.rotary_sin.begin() + dst);
      }
      attention.q_position[b] = static_cast<int32_t>(b * needed_rows);
    }
    // The append reads the new keys' rows: b * new_tokens + t.
    result.append.rotary_cos.resize(static_cast<size_t>(batch * new_tokens * half));
    result.append.rotary_sin.resize(result.append.rotary_cos.size());
    for (int64_t b = 0; b < batch; ++b) {
      std::copy_n(attention.rotary_cos.begin() + b * needed_rows * half, new_tokens * half,
                  result.append.rotary_cos.begin() + b * new_tokens * half);
      std::copy_n(attention.rotary_sin.begin() + b * needed_rows * half, new_tokens * half,
                  result.append.rotary_sin.begin() + b * new_tokens * half);
    }
    a.rotary_dim = 2 * half;
    a.rotary_interleaved = cache.rotary_interleaved != 0;
    a.rotary_q_per_row = q_per_row;
    a.rotary_stride = half;
  }
  attention.isa = resolve_isa(fn, params.isa);
  a.seqlens_k = attention.seqlens_k.data();
  a.k_start = attention.k_start.data();
  a.kv_batch_index = attention.kv_batch_index.empty() ? nullptr : attention.kv_batch_index.data();
  a.block_table = attention.block_table.empty() ? nullptr : attention.block_table.data();
  a.rotary_cos = attention.rotary_cos.empty() ? nullptr : attention.rotary_cos.data();
  a.rotary_sin = attention.rotary_sin.empty() ? nullptr : attention.rotary_sin.data();
  a.q_position = attention.q_position.empty() ? nullptr : attention.q_position.data();
  return result;
}

}  // namespace

ValidatedKvcache validate_fwd_kvcache(const anyattn_tensor* q, const anyattn_tensor* k_cache,
                                      const anyattn_tensor* v_cache, const anyattn_tensor* out,
                                      const anyattn_tensor* lse,
                                      const anyattn_kvcache_params* cache,
                                      const anyattn_fwd_params* params) {
  return validate_cache_call("anyattn_fwd_kvcache", q, k_cache, v_cache, out, lse, nullptr, 0,
                             cache, params);
}

ValidatedFwd validate_fwd_kvcache_varlen(const anyattn_tensor* q, const anyattn_tensor* k_cache,
                                         const anyattn_tensor* v_cache, const anyattn_tensor* out,
                                         const anyattn_tensor* lse,
                                         const anyattn_tensor* cu_seqlens_q, int64_t max_seqlen_q,
                                         const anyattn_kvcache_params* cache,
                                         const anyattn_fwd_params* params) {
  constexpr const char* kFn = "anyattn_fwd_kvcache_varlen";
  if (cu_seqlens_q == nullptr) fail_invalid(kFn, ": cu_seqlens_q is NULL; it is required");
  return validate_cache_call(kFn, q, k_cache, v_cache, out, lse, cu_seqlens_q, max_seqlen_q, cache,
                             params)
      .attention;
}

}  // namespace anyattn::api
