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

}  // namespace

void append_to_cache(const FwdArgs& args, const CacheAppend& append,
                     const std::vector<int32_t>& cache_seqlens) {
  if (append.new_tokens == 0 || args.batch == 0) return;
  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());
  const bool rotary = !append.rotary_cos.empty();
  const int64_t half = args.rotary_dim / 2;
  lease.run_each(args.batch * append.new_tokens, [&](int64_t task, int) {
    const int64_t b = task / append.new_tokens;
    const int64_t t = task % append.new_tokens;
    // The cache position of this token, as a key index of the sequence (key_row_offset adds the
    // sequence's first cache position).
    SeqInfo seq = sequence_info(args, b);
    const int64_t key = cache_seqlens[b] + t - seq.k_first;
    const float* cos = rotary ? append.rotary_cos.data() + task * half : nullptr;
    const float* sin = rotary ? append.rotary_sin.data() + task * half : nullptr;
    // A cache without columns (D or Dv = 0) may have no memory at all: it is not addressed.
    for (int64_t head = 0; head < args.heads_k; ++head) {
      // A row without columns has no cache memory, but its token scale does: an empty row's
      // scale is 0, as for an all-zero row.
      if (args.head_dim == 0 && args.k_token_scale != nullptr) {
        args.k_token_scale[key_row_offset(args, seq, key, head, args.k_scale_batch_stride,
                                          args.k_scale_row_stride, args.k_scale_head_stride)] = 0.f;
      }
      if (args.head_dim_v == 0 && args.v_token_scale != nullptr) {
        args.v_token_scale[key_row_offset(args, seq, key, head, args.v_scale_batch_stride,
                                          args.v_scale_row_stride, args.v_scale_head_stride)] = 0.f;
      }
      if (args.head_dim > 0) {
        const int64_t k_src = b * append.k_new_batch_stride + t * append.k_new_row_stride +
                              head * append.k_new_head_stride;
        const int64_t k_dst = key_row_offset(args, seq, key, head, args.k_batch_stride,
                                             args.k_row_stride, args.k_head_stride);
        float* scale = args.k_token_scale == nullptr
                           ? nullptr
                           : args.k_token_scale + key_row_offset(args, seq, key, head,
                                                                 args.k_scale_batch_stride,
                                                                 args.k_scale_row_stride,
                                                                 args.k_scale_head_stride);
        const RowTarget target{element_address(const_cast<void*>(args.k), args.kv_dtype, k_dst),
                               args.k_descale_of(b, head), scale};
        write_row(element_address(append.k_new, args.dtype, k_src), args.dtype, target,
                  args.kv_dtype, args.head_dim, cos, sin, args.rotary_dim,
                  args.rotary_interleaved);
      }
      // A shared latent cache (v a column prefix of k; validate_kvcache.cc made v_new the same
      // view of k_new) already holds the row written as k's.
      if (args.head_dim_v > 0 && !args.v_is_k_prefix()) {
        const int64_t v_src = b * append.v_new_batch_stride + t * append.v_new_row_stride +
                              head * append.v_new_head_stride;
        const int64_t v_dst = key_row_offset(args, seq, key, head, args.v_batch_stride,
                                             args.v_row_stride, args.v_head_stride);
        float* scale = args.v_token_scale == nullptr
                           ? nullptr
                           : args.v_token_scale + key_row_offset(args, seq, key, head,
                                                                 args.v_scale_batch_stride,
                                                                 args.v_scale_row_stride,
                                                                 args.v_scale_head_stride);
        const RowTarget target{element_address(const_cast<void*>(args.v), args.kv_dtype, v_dst),
                               args.v_descale_of(b, head), scale};
        write_row(element_address(append.v_new, args.dtype, v_src), args.dtype, target,
                  args.kv_dtype, args.head_dim_v, nullptr, nullptr, 0, false);
      }
    }
  });
}

}  // namespace anyattn::cpu
