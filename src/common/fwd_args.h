// The validated description of one forward attention call, in the form every CPU kernel reads.
//
// Built only by api/validate_fwd.cc, after every check has passed: a kernel may rely on every
// invariant documented here without re-checking it. All strides are in elements, int64.
#ifndef ANYATTN_COMMON_FWD_ARGS_H_
#define ANYATTN_COMMON_FWD_ARGS_H_

#include <cstdint>

#include "common/philox.h"

namespace anyattn::cpu {

// Numbered as anyattn_dtype. The 8-bit types are KV-cache element types only (FwdArgs::kv_dtype).
enum class DType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2, kFp8E4M3 = 4, kFp8E5M2 = 5, kI8 = 6 };

constexpr bool is_kv8(DType dtype) {
  return dtype == DType::kFp8E4M3 || dtype == DType::kFp8E5M2 || dtype == DType::kI8;
}

// Window bound meaning "no limit on this side". Large enough that no valid index reaches it, small
// enough that i + Sk - Sq +/- it never overflows int64.
constexpr int64_t kUnboundedWindow = int64_t{1} << 48;

struct FwdArgs {
  DType dtype = DType::kF32;     // of q and out (and of k and v unless they are an 8-bit cache)
  DType kv_dtype = DType::kF32;  // of k and v: dtype, or an 8-bit type (KV-cache calls only)

  int64_t batch = 0;       // B
  int64_t seqlen_q = 0;    // Sq
  int64_t seqlen_k = 0;    // Sk
  // Validated calls may have Hq = Hk = 0 and head dims of 0; run_fwd and run_bwd return early
  // or rewrite those (cpu/shared/unit_head_dims.h), so the kernels see the ranges below.
  int64_t heads_q = 0;     // Hq >= 1
  int64_t heads_k = 0;     // Hk >= 1, Hq % Hk == 0
  int64_t head_dim = 0;    // D in [1, kMaxHeadDim] (common/head_dims.h)
  int64_t head_dim_v = 0;  // Dv in [1, kMaxHeadDimV]

  // q[b][i][h][d] = q_data[b*q_batch_stride + i*q_row_stride + h*q_head_stride + d]; likewise k,
  // v and out. lse[b][h][i] = lse_data[b*lse_batch_stride + h*lse_head_stride + i*lse_row_stride].
  const void* q = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  const void* k = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  const void* v = nullptr;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  void* out = nullptr;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  float softmax_scale = 0.f;  // resolved: never the "0 = default" marker
  float softcap = 0.f;        // 0 = off, else > 0
  // ANYATTN_PRECISION_FAST on a bf16 call: P V may take each probability rounded once to bf16
  // (to nearest even); paths without bf16 dot products ignore it.
  bool bf16_probabilities = false;
  // Visible keys for query i: [i + Sk - Sq - window_left, i + Sk - Sq + window_right].
  int64_t window_left = kUnboundedWindow;
  int64_t window_right = kUnboundedWindow;

  // slope of (b, h) = alibi_slopes[b*alibi_batch_stride + h*alibi_head_stride]; batch stride 0
  // for slopes of shape (Hq).
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0, alibi_head_stride = 0;
  // sink of head h = sinks[h*sinks_stride], natural-log score units.
  const float* sinks = nullptr;
  int64_t sinks_stride = 0;

  int32_t num_splits = 0;  // 0 = choose from the shape

  // Dropout (dropout_threshold == 0: off). Probability P_ij of query head h is kept iff
  // dropout_keep(dropout_key, b, h, i, j, dropout_threshold), and then scaled by dropout_scale =
  // 1 / (1 - p); the softmax denominator and the LSE do not see the dropout.
  uint32_t dropout_threshold = 0;
  PhiloxKey dropout_key;
  float dropout_scale = 1.f;

  // ---- Variable-length and KV-cache layouts (all null for dense calls) ----
  // Varlen q: sequence b's positions are rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q/out
  // (q_batch_stride = out_batch_stride = 0); its LSE row i is at
  // lse[h*lse_head_stride + (cu_seqlens_q[b] + i)*lse_row_stride]. seqlen_q is then the maximum.
  const int32_t* cu_seqlens_q = nullptr;
  // Varlen k/v: sequence b's keys start at row cu_seqlens_k[b] of k/v.
  const int32_t* cu_seqlens_k = nullptr;
  // Number of keys of sequence b (varlen seqused_k, or cache length after the append). Without
  // it, Sk_b = cu_seqlens_k[b+1] - cu_seqlens_k[b] (varlen) or seqlen_k (dense).
  const int32_t* seqlens_k = nullptr;
  // KV cache: key 0 of sequence b is cache position k_start[b] (cache_leftpad); the sequence has
  // seqlens_k[b] - k_start[b] keys.
  const int32_t* k_start = nullptr;
  // KV cache: sequence b reads cache batch kv_batch_index[b] (cache_batch_idx).
  const int32_t* kv_batch_index = nullptr;
  // Paged KV cache: cache position p of sequence b lives in page
  // block_table[b*block_table_stride + p / page_size], row p % page_size, where page n starts at
  // element n*k_batch_stride (v_batch_stride for v).
  const int32_t* block_table = nullptr;
  int64_t block_table_stride = 0;
  int64_t page_size = 0;
  // Rotary embedding applied to q rows as they are loaded (KV cache with new keys): position of
  // row i of sequence b is q_position[b] + (rotary_q_per_row ? i : 0); cos/sin rows of
  // rotary_dim / 2 floats, row stride rotary_stride.
  const float* rotary_cos = nullptr;
  const float* rotary_sin = nullptr;
  int64_t rotary_stride = 0;
  int64_t rotary_dim = 0;
  bool rotary_interleaved = false;
  bool rotary_q_per_row = false;
  const int32_t* q_position = nullptr;
  // 8-bit caches (kv_dtype 8-bit; all null otherwise): the value of a cached element of key j,
  // kv head h of sequence b is stored * descale(b, h) * token_scale(j, h), each factor 1 where its
  // pointer is null. descale(b, h) = k_descale[b*k_descale_batch_stride + h*k_descale_head_stride]
  // (finite, >= 0); the token scale of a key lies where key_row_offset puts its row, with the
  // token-scale strides (k_scale_batch_stride: cache batch or page; row; head).
  const float* k_descale = nullptr;
  int64_t k_descale_batch_stride = 0, k_descale_head_stride = 0;
  const float* v_descale = nullptr;
  int64_t v_descale_batch_stride = 0, v_descale_head_stride = 0;
  float* k_token_scale = nullptr;  // written by the append
  int64_t k_scale_batch_stride = 0, k_scale_row_stride = 0, k_scale_head_stride = 0;
  float* v_token_scale = nullptr;
  int64_t v_scale_batch_stride = 0, v_scale_row_stride = 0, v_scale_head_stride = 0;

  int64_t group_size() const { return heads_q / heads_k; }
  float k_descale_of(int64_t b, int64_t h) const {
    return k_descale ? k_descale[b * k_descale_batch_stride + h * k_descale_head_stride] : 1.f;
  }
  float v_descale_of(int64_t b, int64_t h) const {
    return v_descale ? v_descale[b * v_descale_batch_stride + h * v_descale_head_stride] : 1.f;
  }

  // True when v is a column prefix of k: the same memory, strides and (paged) pages, Dv <= D.
  // This is the shared latent cache of absorbed MLA (docs/semantics.md, "Shared latent cache"):
  // V row j is the first Dv values of K row j, so a kernel that has read K row j has V row j too.
  bool v_is_k_prefix() const {
    return v == k && head_dim_v <= head_dim && v_batch_stride == k_batch_stride &&
           v_row_stride == k_row_stride && v_head_stride == k_head_stride;
  }
};

// One sequence of a call: its lengths and the element offsets of its first row in each tensor.
struct SeqInfo {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t q_offset = 0;    // of position 0, head 0
  int64_t out_offset = 0;  // of position 0, head 0
  int64_t lse_offset = 0;  // of position 0, head 0
  int64_t kv_batch = 0;    // cache batch (dense: b); unused for paged caches
  int64_t k_first = 0;     // cache position of key 0 (varlen: cu_seqlens_k[b]; cache: leftpad)
};

inline SeqInfo sequence_info(const FwdArgs& a, int64_t b) {
  SeqInfo seq;
  seq.batch = b;
  if (a.cu_seqlens_q != nullptr) {
    const int64_t start = a.cu_seqlens_q[b];
    seq.seqlen_q = a.cu_seqlens_q[b + 1] - start;
    seq.q_offset = start * a.q_row_stride;
    seq.out_offset = start * a.out_row_stride;
    seq.lse_offset = start * a.lse_row_stride;
  } else {
    seq.seqlen_q = a.seqlen_q;
    seq.q_offset = b * a.q_batch_stride;
    seq.out_offset = b * a.out_batch_stride;
    seq.lse_offset = b * a.lse_batch_stride;
  }
  seq.kv_batch = a.kv_batch_index != nullptr ? a.kv_batch_index[b] : b;
  if (a.cu_seqlens_k != nullptr) {
    seq.k_first = a.cu_seqlens_k[b];
    seq.kv_batch = 0;
    seq.seqlen_k = a.seqlens_k != nullptr ? a.seqlens_k[b] : a.cu_seqlens_k[b + 1] - seq.k_first;
  } else {
    seq.k_first = a.k_start != nullptr ? a.k_start[b] : 0;
    seq.seqlen_k = (a.seqlens_k != nullptr ? a.seqlens_k[b] : a.seqlen_k) - seq.k_first;
  }
  return seq;
}

// Element offset of key j (0-based within the sequence), head `head_k`, in k (or v, with v's
// strides passed).
inline int64_t key_row_offset(const FwdArgs& a, const SeqInfo& seq, int64_t j, int64_t head_k,
                              int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  const int64_t position = seq.k_first + j;
  if (a.block_table != nullptr) {
    const int64_t page = a.block_table[seq.batch * a.block_table_stride + position / a.page_size];
    return page * batch_stride + (position % a.page_size) * row_stride + head_k * head_stride;
  }
  return seq.kv_batch * batch_stride + position * row_stride + head_k * head_stride;
}

enum class KvStream { kK, kV };

// The factor by which the stored elements of key j (within `seq`), kv head `head_k`, of the K or V
// stream are multiplied to give their values: descale times token scale, each 1 when absent (1
// for a float cache). Formed in f32.
inline float key_scale(const FwdArgs& a, const SeqInfo& seq, int64_t j, int64_t head_k,
                       KvStream stream) {
  const bool k = stream == KvStream::kK;
  float scale = k ? a.k_descale_of(seq.batch, head_k) : a.v_descale_of(seq.batch, head_k);
  const float* token = k ? a.k_token_scale : a.v_token_scale;
  if (token != nullptr) {
    scale *= token[k ? key_row_offset(a, seq, j, head_k, a.k_scale_batch_stride,
                                      a.k_scale_row_stride, a.k_scale_head_stride)
                     : key_row_offset(a, seq, j, head_k, a.v_scale_batch_stride,
                                      a.v_scale_row_stride, a.v_scale_head_stride)];
  }
  return scale;
}

// key_row_offset for keys [j0, j0 + count) into offsets[0 .. count), walking the pages of a
// paged cache once instead of dividing by the page size for every key.
inline void key_row_offsets(const FwdArgs& a, const SeqInfo& seq, int64_t j0, int64_t count,
                            int64_t head_k, int64_t batch_stride, int64_t row_stride,
                            int64_t head_stride, int64_t* offsets) {
  if (count <= 0) return;
  const int64_t position = seq.k_first + j0;
  if (a.block_table == nullptr) {
    const int64_t first =
        seq.kv_batch * batch_stride + position * row_stride + head_k * head_stride;
    for (int64_t j = 0; j < count; ++j) offsets[j] = first + j * row_stride;
    return;
  }
  const int32_t* pages = a.block_table + seq.batch * a.block_table_stride;
  int64_t page = position / a.page_size;
  int64_t row = position % a.page_size;
  for (int64_t j = 0; j < count; ++j) {
    offsets[j] = pages[page] * batch_stride + row * row_stride + head_k * head_stride;
    if (++row == a.page_size) {
      row = 0;
      ++page;
    }
  }
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_COMMON_FWD_ARGS_H_
