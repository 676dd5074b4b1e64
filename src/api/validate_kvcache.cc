#include "api/validate_kvcache.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "api/args_layout.h"
#include "api/attention_options.h"
#include "api/call_check.h"
#include "api/entry_tables.h"
#include "api/errors.h"
#include "api/tensor_checks.h"
#include "api/validate_kvcache_scales.h"
#include "api/validate_varlen.h"

namespace anyattn::api {
namespace {

// What the steps of a cache call share once its tensors are checked.
struct CacheCall {
  const char* fn;
  const anyattn_kvcache_params& cache;
  bool paged;
  int64_t batch = 0;       // B
  int64_t seqlen_q = 0;    // Sq, or max_seqlen_q for packed queries
  int64_t head_dim = 0;    // D
  int64_t cache_rows = 0;  // B_cache, or num_blocks when paged
  int64_t cache_len = 0;   // S_cache, or page_size when paged
  int64_t new_tokens = 0;  // S_new; 0 without new keys
};

// Packed queries: the call only reads the cache, so nothing may be appended or rotated.
void reject_cache_writes(const char* fn, const anyattn_kvcache_params& cache) {
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

const TensorTable& cache_table(bool varlen, bool paged) {
  if (varlen) return paged ? tables::kCacheVarlenPaged : tables::kCacheVarlenContiguous;
  return paged ? tables::kCachePaged : tables::kCacheContiguous;
}

// The new keys and values (B, S_new, Hk, D[v]), which must not overlap the caches they are
// written into; the caches must not overlap each other either, or writing one would change the
// other, unless they are one shared latent cache (v_cache a column prefix view of k_cache, as
// absorbed MLA passes it): the append then writes each row once, from k_new, so v_new must be the
// same view of k_new, and rotary (which would rotate V's columns as K's) is not supported. Sets
// call->new_tokens and the append's pointers and strides.
void check_new_keys(CallCheck* check, CacheCall* call, const AttentionTensors& t,
                    cpu::CacheAppend* append) {
  const anyattn_kvcache_params& cache = call->cache;
  if ((cache.k_new == nullptr) != (cache.v_new == nullptr)) {
    fail_invalid(call->fn, ": cache->k_new and cache->v_new must be given together");
  }
  if (cache.k_new == nullptr) return;
  const anyattn_tensor* const new_keys[] = {cache.k_new, cache.v_new};
  check->check(tables::kAppend, new_keys);
  for (const char* written : {"k_cache", "v_cache"}) {
    check->require_disjoint(written, "cache->k_new");
    check->require_disjoint(written, "cache->v_new");
  }
  if (!is_column_prefix(t.v, t.k)) {
    check->require_disjoint("k_cache", "v_cache");
  } else if (!is_column_prefix(cache.v_new, cache.k_new)) {
    fail_invalid(call->fn,
                 ": v_cache is a column view of k_cache (a shared latent cache), so cache->v_new "
                 "must be the same view of cache->k_new: the append writes each shared row once");
  } else if (cache.rotary_cos != nullptr) {
    fail_unsupported(call->fn,
                     ": rotary embedding with a shared latent cache (v_cache a column view of "
                     "k_cache) would rotate v's columns with k's; rotate k_new before the call");
  }
  call->new_tokens = (*check)[Dim::kNewTokens];
  append->new_tokens = call->new_tokens;
  read_strides(cache.k_new, true, &append->k_new, &append->k_new_batch_stride,
               &append->k_new_row_stride, &append->k_new_head_stride);
  read_strides(cache.v_new, true, &append->v_new, &append->v_new_batch_stride,
               &append->v_new_row_stride, &append->v_new_head_stride);
}

// Where each sequence's keys live: pages through the block table, cache rows through
// cache_batch_idx, or cache row b. Returns the cache positions one sequence can hold.
int64_t locate_sequences(const CacheCall& call, ValidatedFwd* attention) {
  const anyattn_kvcache_params& cache = call.cache;
  const char* fn = call.fn;
  if (call.paged) {
    auto [columns, table] = read_int32_matrix(fn, "cache->block_table", cache.block_table,
                                              call.batch);
    if (call.cache_len < 1) fail_invalid(fn, ": the page size (k_cache.shape[1]) must be >= 1");
    if (cache.cache_batch_idx != nullptr) {
      fail_invalid(fn, ": cache->cache_batch_idx cannot be combined with cache->block_table");
    }
    attention->block_table = std::move(table);
    attention->args.block_table_stride = columns;
    attention->args.page_size = call.cache_len;
    return columns * call.cache_len;
  }
  if (cache.cache_batch_idx == nullptr) {
    if (call.cache_rows != call.batch) {
      fail_invalid(fn, ": k_cache.shape[0] is ", call.cache_rows, " but B is ", call.batch,
                   "; give cache->cache_batch_idx to map sequences to cache rows");
    }
    return call.cache_len;
  }
  std::vector<int32_t>& index = attention->kv_batch_index;
  index = read_int32_vector(fn, "cache->cache_batch_idx", cache.cache_batch_idx, call.batch);
  for (int64_t b = 0; b < call.batch; ++b) {
    if (index[b] < 0 || index[b] >= call.cache_rows) {
      fail_invalid(fn, ": cache->cache_batch_idx[", b, "] is ", index[b],
                   "; must be in [0, B_cache = ", call.cache_rows, ")");
    }
  }
  if (call.new_tokens > 0) {
    std::vector<int32_t> sorted = index;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      fail_invalid(fn,
                   ": cache->cache_batch_idx repeats a cache batch while new keys are "
                   "appended; two sequences would write the same cache rows");
    }
  }
  return call.cache_len;
}

// The stored length of every sequence before the append: cache_seqlens, or one cache_seqlen for
// all (-1: the whole cache less the new keys).
std::vector<int32_t> read_stored_lengths(const CacheCall& call) {
  const anyattn_kvcache_params& cache = call.cache;
  if (cache.cache_seqlens != nullptr) {
    return read_int32_vector(call.fn, "cache->cache_seqlens", cache.cache_seqlens, call.batch);
  }
  int64_t length = cache.cache_seqlen;
  if (length == -1) {
    if (call.paged) {
      fail_invalid(call.fn,
                   ": a paged cache needs cache->cache_seqlens or cache->cache_seqlen >= 0");
    }
    length = call.cache_len - call.new_tokens;
  }
  if (length < 0 || length > kMaxExtent) {
    fail_invalid(call.fn, ": cache->cache_seqlen is ", cache.cache_seqlen,
                 "; must be -1 (whole cache) or in [0, ", kMaxExtent, "]");
  }
  return std::vector<int32_t>(static_cast<size_t>(call.batch), static_cast<int32_t>(length));
}

// Sequence b of a paged cache reads or writes positions [start, end): every page holding one
// must be a valid block.
void check_pages(const CacheCall& call, const ValidatedFwd& attention, int64_t b, int64_t start,
                 int64_t end) {
  const int32_t* row = attention.block_table.data() + b * attention.args.block_table_stride;
  for (int64_t page = start / call.cache_len; page * call.cache_len < end; ++page) {
    if (row[page] < 0 || row[page] >= call.cache_rows) {
      fail_invalid(call.fn, ": cache->block_table[", b, "][", page, "] is ", row[page],
                   "; must be in [0, num_blocks = ", call.cache_rows,
                   ") for every page holding a position the call reads or writes");
    }
  }
}

// Reads the lengths and left padding and checks each sequence's key range against the cache:
// within `capacity` after the append, and on valid pages. Sets the attention's seqlens_k and
// k_start and returns the longest key range (the attention's Sk).
int64_t read_key_ranges(const CacheCall& call, int64_t capacity, ValidatedKvcache* result) {
  const char* fn = call.fn;
  ValidatedFwd& attention = result->attention;
  result->cache_seqlens = read_stored_lengths(call);
  attention.k_start.assign(static_cast<size_t>(call.batch), 0);
  if (call.cache.cache_leftpad != nullptr) {
    attention.k_start =
        read_int32_vector(fn, "cache->cache_leftpad", call.cache.cache_leftpad, call.batch);
  }
  attention.seqlens_k.resize(static_cast<size_t>(call.batch));
  int64_t max_keys = 0;
  for (int64_t b = 0; b < call.batch; ++b) {
    const int64_t stored = result->cache_seqlens[b];
    const int64_t total = stored + call.new_tokens;
    const int64_t start = attention.k_start[b];
    if (stored < 0) {
      fail_invalid(fn, ": cache->cache_seqlens[", b, "] is ", stored, "; must be >= 0");
    }
    if (total > capacity) {
      fail_invalid(fn, ": sequence ", b, " needs ", total, " cache positions (cache_seqlens ",
                   stored, " + S_new ", call.new_tokens, ") but the cache holds ", capacity,
                   call.paged ? " (block_table columns x page_size)" : " (S_cache)");
    }
    if (start < 0 || start > stored) {
      fail_invalid(fn, ": cache->cache_leftpad[", b, "] is ", start, "; must be in [0, ",
                   "cache_seqlens[", b, "] = ", stored, "]");
    }
    if (call.paged) check_pages(call, attention, b, start, total);
    attention.seqlens_k[b] = static_cast<int32_t>(total);
    max_keys = std::max(max_keys, total - start);
  }
  return max_keys;
}

// Two sequences must not append into the same row of a page (pages may be shared for reading).
void check_appends_distinct(const CacheCall& call, const ValidatedKvcache& result) {
  if (!call.paged || call.new_tokens == 0) return;
  const int64_t page_size = call.cache_len;
  const std::vector<int32_t>& table = result.attention.block_table;
  const int64_t columns = result.attention.args.block_table_stride;
  std::vector<std::pair<int64_t, int64_t>> written;  // (page * page_size + row, sequence)
  written.reserve(static_cast<size_t>(call.batch * call.new_tokens));
  for (int64_t b = 0; b < call.batch; ++b) {
    const int64_t first = result.cache_seqlens[b];
    for (int64_t p = first; p < first + call.new_tokens; ++p) {
      written.emplace_back(table[b * columns + p / page_size] * page_size + p % page_size, b);
    }
  }
  std::sort(written.begin(), written.end());
  for (size_t i = 1; i < written.size(); ++i) {
    if (written[i].first == written[i - 1].first) {
      fail_invalid(call.fn, ": sequences ", written[i - 1].second, " and ", written[i].second,
                   " would both append into row ", written[i].first % page_size, " of page ",
                   written[i].first / page_size, " (cache->block_table maps them to it)");
    }
  }
}

// For every sequence b, the `rows` rows of `table` (positions x `width` floats) from position
// first[b] on, as rows b * rows + t of the result.
std::vector<float> gather_rows(const std::vector<float>& table, int64_t width,
                               const std::vector<int32_t>& first, int64_t rows) {
  std::vector<float> gathered(first.size() * static_cast<size_t>(rows * width));
  for (size_t b = 0; b < first.size(); ++b) {
    std::copy_n(table.begin() + first[b] * width, rows * width,
                gathered.begin() + static_cast<int64_t>(b) * rows * width);
  }
  return gathered;
}

// Rotary: the new keys at their cache positions, q at cache_seqlens[b] (+ i when the mask is
// causal or windowed, as flash-attn does). Checks the tables and gathers, as f32, the rows the
// attention (rows b * needed_rows + t) and the append (rows b * new_tokens + t) read.
void gather_rotary(CallCheck* check, const CacheCall& call, bool causal,
                   ValidatedKvcache* result) {
  const anyattn_kvcache_params& cache = call.cache;
  const char* fn = call.fn;
  if ((cache.rotary_cos == nullptr) != (cache.rotary_sin == nullptr)) {
    fail_invalid(fn, ": cache->rotary_cos and cache->rotary_sin must be given together");
  }
  if (cache.rotary_cos == nullptr) return;
  if (call.new_tokens == 0) {
    fail_invalid(fn,
                 ": rotary embedding needs new keys (cache->k_new): the cached keys are "
                 "stored already rotated");
  }
  const anyattn_tensor* const rotary[] = {cache.rotary_cos, cache.rotary_sin};
  check->check(tables::kRotary, rotary);
  const int64_t positions = (*check)[Dim::kRotaryPositions];
  const int64_t half = (*check)[Dim::kRotaryHalf];
  if (half < 1 || 2 * half > call.head_dim) {
    fail_invalid(fn, ": rotary_dim = 2 * cache->rotary_cos.shape[1] = ", 2 * half,
                 "; must be in [2, D = ", call.head_dim, "]");
  }
  cpu::FwdArgs& a = result->attention.args;
  const bool q_per_row =
      causal || a.window_left < cpu::kUnboundedWindow || a.window_right < cpu::kUnboundedWindow;
  const int64_t q_rows = q_per_row ? std::max<int64_t>(call.seqlen_q, 1) : 1;
  const int64_t needed_rows = std::max(call.new_tokens, q_rows);
  for (int64_t b = 0; b < call.batch; ++b) {
    if (result->cache_seqlens[b] + needed_rows > positions) {
      fail_invalid(fn, ": cache->rotary_cos has ", positions, " positions but sequence ", b,
                   " uses positions up to ", result->cache_seqlens[b] + needed_rows - 1);
    }
  }
  const std::vector<float> cos_all =
      read_float_rows(fn, "cache->rotary_cos", cache.rotary_cos, positions);
  const std::vector<float> sin_all =
      read_float_rows(fn, "cache->rotary_sin", cache.rotary_sin, positions);
  ValidatedFwd& attention = result->attention;
  const std::vector<int32_t>& first = result->cache_seqlens;
  attention.rotary_cos = gather_rows(cos_all, half, first, needed_rows);
  attention.rotary_sin = gather_rows(sin_all, half, first, needed_rows);
  result->append.rotary_cos = gather_rows(cos_all, half, first, call.new_tokens);
  result->append.rotary_sin = gather_rows(sin_all, half, first, call.new_tokens);
  attention.q_position.resize(static_cast<size_t>(call.batch));
  for (int64_t b = 0; b < call.batch; ++b) {
    attention.q_position[b] = static_cast<int32_t>(b * needed_rows);
  }
  a.rotary_dim = 2 * half;
  a.rotary_interleaved = cache.rotary_interleaved != 0;
  a.rotary_q_per_row = q_per_row;
  a.rotary_stride = half;
}

// Points the attention's arguments at the arrays validation copied.
void point_at_copies(ValidatedFwd* attention) {
  cpu::FwdArgs& a = attention->args;
  const auto data_or_null = [](auto& values) { return values.empty() ? nullptr : values.data(); };
  a.seqlens_k = attention->seqlens_k.data();
  a.k_start = attention->k_start.data();
  a.kv_batch_index = data_or_null(attention->kv_batch_index);
  a.block_table = data_or_null(attention->block_table);
  a.rotary_cos = data_or_null(attention->rotary_cos);
  a.rotary_sin = data_or_null(attention->rotary_sin);
  a.q_position = data_or_null(attention->q_position);
  a.cu_seqlens_q = data_or_null(attention->cu_seqlens_q);
}

// Both entry points, step by step. Without cu_seqlens_q, q and out are dense (B, Sq, Hq, D[v])
// and lse (B, Hq, Sq); with it, packed (total_q, Hq, D[v]) and (Hq, total_q), and the call may
// not append or rotate.
ValidatedKvcache validate_cache_call(const char* fn, const AttentionTensors& t,
                                     const anyattn_tensor* cu_seqlens_q, int64_t max_seqlen_q,
                                     const anyattn_kvcache_params* cache_in,
                                     const anyattn_fwd_params* params_in) {
  const anyattn_fwd_params params = read_fwd_params(fn, params_in);
  const anyattn_kvcache_params cache = read_cache_params(fn, cache_in);
  const bool varlen = cu_seqlens_q != nullptr;
  if (varlen) reject_cache_writes(fn, cache);

  CallCheck check(fn);
  CacheCall call{fn, cache, cache.block_table != nullptr};
  const anyattn_tensor* const in_table_order[] = {t.q, t.k, t.v, t.out, t.lse};
  check.check(cache_table(varlen, call.paged), in_table_order);
  call.batch = varlen ? read_varlen_batch(fn, cu_seqlens_q) : check[Dim::kB];
  call.seqlen_q = varlen ? check_max_seqlen(fn, "max_seqlen_q", max_seqlen_q) : check[Dim::kSq];
  call.head_dim = check[Dim::kD];
  call.cache_rows = t.k->shape[0];
  call.cache_len = t.k->shape[1];

  ValidatedKvcache result;
  ValidatedFwd& attention = result.attention;
  cpu::FwdArgs& a = attention.args;
  check_new_keys(&check, &call, t, &result.append);
  const int64_t capacity = locate_sequences(call, &attention);
  const int64_t max_keys = read_key_ranges(call, capacity, &result);
  check_appends_distinct(call, result);

  if (varlen) {
    attention.cu_seqlens_q = read_cu_seqlens(fn, "cu_seqlens_q", cu_seqlens_q, call.batch,
                                             t.q->shape[0], "total_q", max_seqlen_q,
                                             "max_seqlen_q");
    fill_packed_queries_cache_layout(t.q, t.k, t.v, t.out, &a);
    a.batch = call.batch;
    // The longest sequence, not max_seqlen_q: the plan (direct decode loop or blocks) follows it.
    a.seqlen_q = 0;
    for (int64_t b = 0; b < call.batch; ++b) {
      a.seqlen_q =
          std::max<int64_t>(a.seqlen_q, attention.cu_seqlens_q[b + 1] - attention.cu_seqlens_q[b]);
    }
  } else {
    fill_dense_layout(t.q, t.k, t.v, t.out, &a);
  }
  a.seqlen_k = max_keys;
  fill_lse_layout(t.lse, varlen, &a);
  apply_attention_options(fn, params, &a);
  if (a.dropout_threshold != 0) {
    fail_unsupported(fn, ": params->dropout_p is ", params.dropout_p,
                     "; dropout is not supported with a KV cache (inference only)");
  }
  gather_rotary(&check, call, params.causal != 0, &result);
  check_cache_scales(&check, cache, t.k->dtype, call.batch, call.paged, call.new_tokens > 0,
                     &attention);
  attention.isa = resolve_isa(fn, params.isa);
  point_at_copies(&attention);
  return result;
}

}  // namespace

ValidatedKvcache validate_fwd_kvcache(const AttentionTensors& tensors,
                                      const anyattn_kvcache_params* cache,
                                      const anyattn_fwd_params* params) {
  return validate_cache_call("anyattn_fwd_kvcache", tensors, nullptr, 0, cache, params);
}

ValidatedFwd validate_fwd_kvcache_varlen(const AttentionTensors& tensors,
                                         const anyattn_tensor* cu_seqlens_q, int64_t max_seqlen_q,
                                         const anyattn_kvcache_params* cache,
                                         const anyattn_fwd_params* params) {
  constexpr const char* kFn = "anyattn_fwd_kvcache_varlen";
  if (cu_seqlens_q == nullptr) fail_invalid(kFn, ": cu_seqlens_q is NULL; it is required");
  return validate_cache_call(kFn, tensors, cu_seqlens_q, max_seqlen_q, cache, params).attention;
}

}  // namespace anyattn::api
