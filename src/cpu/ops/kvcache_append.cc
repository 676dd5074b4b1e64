#include "cpu/ops/kvcache_append.h"

#include "common/head_dims.h"
#include "cpu/shared/half.h"
#include "cpu/shared/rotary.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

namespace anyattn::cpu {
namespace {

// Where one appended row goes: its cache row, and for an 8-bit cache its descale and token scale
// (null: none).
struct RowTarget {
  void* row;
  float descale;
  float* token_scale;
};

// Writes one row of `count` values of `dtype` from src into the cache row of `target` (of
// kv_dtype), rotating the first rotary_dim values (pairs (2t, 2t+1) if interleaved, else
// (t, t + rotary_dim / 2)) when cos is non-null. An 8-bit cache stores the rotated row through
// the one quantization routine (common/kv8_convert.h), which also writes its token scale.
void write_row(const void* src, DType dtype, const RowTarget& target, DType kv_dtype,
               int64_t count, const float* cos, const float* sin, int64_t rotary_dim,
               bool interleaved) {
  float row[kMaxHeadDim];
  for (int64_t c = 0; c < count; ++c) row[c] = load_element(src, dtype, c);
  if (cos != nullptr) apply_rotary(cos, sin, rotary_dim, interleaved, row);
  if (is_kv8(kv_dtype)) {
    convert::quantize_kv8_row(static_cast<convert::Kv8>(kv_dtype), row, count, target.descale,
                              target.token_scale, static_cast<uint8_t*>(target.row));
    return;
  }
  for (int64_t c = 0; c < count; ++c) store_element(target.row, kv_dtype, c, row[c]);
}

// One stream of the append, the keys or the values: where its new rows come from, and where its
// cache rows and (8-bit caches) token scales go.
struct AppendStream {
  KvStream kind;
  int64_t columns;  // D or Dv
  const void* new_rows;
  int64_t new_batch_stride, new_row_stride, new_head_stride;
  void* cache;
  int64_t batch_stride, row_stride, head_stride;
  float* token_scale;  // null: none
  int64_t scale_batch_stride, scale_row_stride, scale_head_stride;
};

AppendStream key_stream(const FwdArgs& args, const CacheAppend& append) {
  return {KvStream::kK, args.head_dim, append.k_new, append.k_new_batch_stride,
          append.k_new_row_stride, append.k_new_head_stride, const_cast<void*>(args.k),
          args.k_batch_stride, args.k_row_stride, args.k_head_stride, args.k_token_scale,
          args.k_scale_batch_stride, args.k_scale_row_stride, args.k_scale_head_stride};
}

AppendStream value_stream(const FwdArgs& args, const CacheAppend& append) {
  return {KvStream::kV, args.head_dim_v, append.v_new, append.v_new_batch_stride,
          append.v_new_row_stride, append.v_new_head_stride, const_cast<void*>(args.v),
          args.v_batch_stride, args.v_row_stride, args.v_head_stride, args.v_token_scale,
          args.v_scale_batch_stride, args.v_scale_row_stride, args.v_scale_head_stride};
}

// Writes new token t of sequence b, kv head `head`, of `stream` into cache key `key` of `seq`
// (rotated when cos is non-null). A row without columns has no cache memory and is not
// addressed, but its token scale is: an empty row's scale is 0, as for an all-zero row.
void append_stream_row(const FwdArgs& args, const SeqInfo& seq, const AppendStream& stream,
                       int64_t b, int64_t t, int64_t key, int64_t head, const float* cos,
                       const float* sin) {
  float* scale = stream.token_scale == nullptr
                     ? nullptr
                     : stream.token_scale + key_row_offset(args, seq, key, head,
                                                           stream.scale_batch_stride,
                                                           stream.scale_row_stride,
                                                           stream.scale_head_stride);
  if (stream.columns == 0) {
    if (scale != nullptr) *scale = 0.f;
    return;
  }
  const int64_t src = b * stream.new_batch_stride + t * stream.new_row_stride +
                      head * stream.new_head_stride;
  const int64_t dst = key_row_offset(args, seq, key, head, stream.batch_stride, stream.row_stride,
                                     stream.head_stride);
  const float descale =
      stream.kind == KvStream::kK ? args.k_descale_of(b, head) : args.v_descale_of(b, head);
  const RowTarget target{element_address(stream.cache, args.kv_dtype, dst), descale, scale};
  write_row(element_address(stream.new_rows, args.dtype, src), args.dtype, target, args.kv_dtype,
            stream.columns, cos, sin, args.rotary_dim, args.rotary_interleaved);
}

}  // namespace

void append_to_cache(const FwdArgs& args, const CacheAppend& append,
                     const std::vector<int32_t>& cache_seqlens) {
  if (append.new_tokens == 0 || args.batch == 0) return;
  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());
  const bool rotary = !append.rotary_cos.empty();
  const int64_t half = args.rotary_dim / 2;
  const AppendStream keys = key_stream(args, append);
  const AppendStream values = value_stream(args, append);
  lease.run_each(args.batch * append.new_tokens, [&](int64_t task, int) {
    const int64_t b = task / append.new_tokens;
    const int64_t t = task % append.new_tokens;
    // The cache position of this token, as a key index of the sequence (key_row_offset adds the
    // sequence's first cache position).
    const SeqInfo seq = sequence_info(args, b);
    const int64_t key = cache_seqlens[b] + t - seq.k_first;
    const float* cos = rotary ? append.rotary_cos.data() + task * half : nullptr;
    const float* sin = rotary ? append.rotary_sin.data() + task * half : nullptr;
    for (int64_t head = 0; head < args.heads_k; ++head) {
      append_stream_row(args, seq, keys, b, t, key, head, cos, sin);
      // A shared latent cache (v a column prefix of k; validate_kvcache.cc made v_new the same
      // view of k_new) already holds the row written as k's.
      if (!args.v_is_k_prefix()) {
        append_stream_row(args, seq, values, b, t, key, head, nullptr, nullptr);
      }
    }
  });
}

}  // namespace anyattn::cpu
