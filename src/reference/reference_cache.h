// The f64 reference for the variable-length, KV-cache and merge entry points
// (anyattn_fwd_varlen, anyattn_fwd_kvcache, anyattn_merge_attention_states; their contract is
// docs/varlen_kvcache.md).
//
// Like reference.h it is plain loops in double precision, meant to be read. Each entry point
// gathers the rows of every sequence into contiguous double arrays (GatheredSequence) and hands
// them to attend_one_sequence(), so masks and ALiBi positions are per sequence by construction.
//
// Inputs are assumed valid (the tests validate through the library first); nothing is checked.
#ifndef ANYATTN_REFERENCE_REFERENCE_CACHE_H_
#define ANYATTN_REFERENCE_REFERENCE_CACHE_H_

#include <cstdint>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/reference.h"

namespace anyattn {
namespace reference {

// One sequence's inputs gathered out of packed or cached tensors, contiguous and row-major.
struct GatheredSequence {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  std::vector<double> q;             // (Sq, Hq, D)
  std::vector<double> k;             // (Sk, Hk, D)
  std::vector<double> v;             // (Sk, Hk, Dv)
  std::vector<double> alibi_slopes;  // (Hq), or empty for no ALiBi
  std::vector<double> sinks;         // (Hq), or empty for no sinks
};

// Shapes shared by every sequence of one call.
struct HeadShape {
  int64_t num_heads_q = 0, num_heads_k = 0, head_dim = 0, head_dim_v = 0;
};

// attend_one_sequence() on a gathered sequence: out (Sq, Hq, Dv) and lse[h * lse_head_stride + i].
void attend_gathered(const GatheredSequence& seq, const HeadShape& shape,
                     const ScoreOptions& options, double* out, double* lse,
                     int64_t lse_head_stride);

// ---- Varlen -------------------------------------------------------------------------------------

struct VarlenOutputs {
  std::vector<double> out;            // (total_q, Hq, Dv); rows outside every sequence are 0
  std::vector<double> lse;            // (Hq, total_q); entries outside every sequence are 0
  std::vector<char> row_in_sequence;  // (total_q): 1 for rows [cu_seqlens_q[0], cu_seqlens_q[B])
};

// The sequences of an anyattn_fwd_varlen call: sequence b has q rows [cu_q[b], cu_q[b+1]) and
// the first seqused_k[b] (else all) of k/v rows [cu_k[b], cu_k[b+1]). ALiBi slopes (Hq) are
// shared; (B, Hq) slopes give sequence b row b.
std::vector<GatheredSequence> gather_varlen(const anyattn_tensor& q, const anyattn_tensor& k,
                                            const anyattn_tensor& v,
                                            const anyattn_tensor& cu_seqlens_q,
                                            const anyattn_tensor& cu_seqlens_k,
                                            const anyattn_tensor* seqused_k,
                                            const anyattn_fwd_params* params);

// The reference for anyattn_fwd_varlen: every sequence attended on its own, as a dense problem.
VarlenOutputs fwd_varlen(const anyattn_tensor& q, const anyattn_tensor& k, const anyattn_tensor& v,
                         const anyattn_tensor& cu_seqlens_q, const anyattn_tensor& cu_seqlens_k,
                         const anyattn_tensor* seqused_k, const anyattn_fwd_params* params);

// ---- Rotary -------------------------------------------------------------------------------------

// Rotates the first rotary_dim values of `x` by one position's angles: pairs (2t, 2t+1) when
// interleaved (GPT-J), else (t, t + rotary_dim/2) (GPT-NeoX):
//   (x_a, x_b) <- (x_a cos_t - x_b sin_t, x_a sin_t + x_b cos_t),  t < rotary_dim / 2.
void rotate(double* x, const double* cos, const double* sin, int64_t rotary_dim, bool interleaved);

// ---- KV cache -----------------------------------------------------------------------------------

// How values are rounded while the KV-cache inputs are prepared.
enum class Rounding {
  // The f64 truth: rotary in double precision, nothing rounded.
  kExact,
  // What a framework working in the input dtype computes (the "naive same dtype" side of the
  // acceptance rule): rotary in f32, the rotated q and new keys rounded to q's dtype.
  kLikeInputDtype,
};

struct KvcacheInputs {
  std::vector<GatheredSequence> sequences;  // (B) sequences, after the append
  // The logical k_cache / v_cache after the append, C-contiguous f64 of their logical shapes. For
  // an 8-bit cache: the stored values (before the scales), the append quantized by the shared
  // routine (common/kv8_convert.h) from the new rows rotated in f32, as the library does; the
  // sequences then hold the dequantized values stored * descale * token_scale, in f64. A shared
  // latent cache (v_cache a column prefix of k_cache) is one row per key: V the first Dv stored
  // values of the K row, dequantized with K's factors.
  std::vector<double> k_cache, v_cache;
  // 8-bit caches with token scales: the scales after the append, C-contiguous (N, R, Hk) (a
  // shared latent cache without v_token_scale: K's again for V).
  std::vector<double> k_token_scale, v_token_scale;
  // (cache tensor index of dim 0, dim 1) of every appended position, in the order (b, t).
  std::vector<int64_t> appended_rows;
};

// The cache position `position` of sequence b as (dim-0 index, dim-1 index) of k_cache: the page
// block_table[b][position / page_size] and row position % page_size for a paged cache, else the
// batch cache_batch_idx[b] (or b) and row `position`.
void cache_location(const anyattn_tensor& k_cache, const anyattn_kvcache_params& cache, int64_t b,
                    int64_t position, int64_t* batch_or_page, int64_t* row);

// The KV-cache call's inputs as each sequence sees them: the new keys (rotated at positions
// cache_seqlens[b] + t) and values written into a copy of the cache, q rotated at
// cache_seqlens[b] + i (causal or windowed) or cache_seqlens[b] (otherwise), and the keys of
// positions [cache_leftpad[b], cache_seqlens[b] + S_new) gathered per sequence.
KvcacheInputs gather_kvcache(const anyattn_tensor& q, const anyattn_tensor& k_cache,
                             const anyattn_tensor& v_cache, const anyattn_kvcache_params& cache,
                             const anyattn_fwd_params* params, Rounding rounding);

struct KvcacheOutputs {
  std::vector<double> out;               // (B, Sq, Hq, Dv)
  std::vector<double> lse;               // (B, Hq, Sq)
  std::vector<double> k_cache, v_cache;  // after the append, as in KvcacheInputs
  std::vector<double> k_token_scale, v_token_scale;
  std::vector<int64_t> appended_rows;
};

// The descale of an 8-bit cache for sequence b, kv head h: descale of shape (1), (Hk) or (B, Hk);
// 1 when null.
double cache_descale(const anyattn_tensor* descale, int64_t b, int64_t h);

// The reference for anyattn_fwd_kvcache (exact rounding).
KvcacheOutputs fwd_kvcache(const anyattn_tensor& q, const anyattn_tensor& k_cache,
                           const anyattn_tensor& v_cache, const anyattn_kvcache_params& cache,
                           const anyattn_fwd_params* params);

// ---- Merge --------------------------------------------------------------------------------------

struct MergeOutputs {
  std::vector<double> out;  // the shape of out_a, C-contiguous
  std::vector<double> lse;  // the shape of lse_a, C-contiguous
};

// The reference for anyattn_merge_attention_states on (T, H, Dv) outputs with (H, T) LSEs, or
// (B, S, H, Dv) with (B, H, S):
//   m = max(lse_a, lse_b); w_x = e^{lse_x - m};
//   out = (w_a out_a + w_b out_b) / (w_a + w_b); lse = m + log(w_a + w_b).
// Both -inf gives out = 0 and lse = -inf; a -inf side contributes nothing (even a NaN out row).
MergeOutputs merge_states(const anyattn_tensor& out_a, const anyattn_tensor& lse_a,
                          const anyattn_tensor& out_b, const anyattn_tensor& lse_b);

}  // namespace reference
}  // namespace anyattn

#endif  // ANYATTN_REFERENCE_REFERENCE_CACHE_H_
