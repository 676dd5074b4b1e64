// The f64 reference implementation of anyattn's forward contract (docs/semantics.md).
//
// It is the oracle of the tests and a teaching copy of the semantics: plain loops in double
// precision, one query row at a time, with no tiling, no online softmax and no shortcuts. It is
// slow (O(Sq * Sk * (D + Dv)) per head, with a scores buffer of one row) and meant to be read.
//
// Layering, so that varlen and KV-cache references can be added beside the dense one:
//   - attend_one_sequence() is the core: one sequence, all heads, inputs already gathered into
//     contiguous double arrays. Masks and ALiBi positions are relative to that sequence.
//   - fwd_dense() gathers each batch entry of strided anyattn_tensor inputs and calls the core.
//     A varlen reference would slice the packed tensors with cu_seqlens and call the same core; a
//     KV-cache reference would gather the cache rows of each sequence first.
//
// Inputs are assumed valid (the tests validate through the library first); the reference checks
// nothing and never fails.
#ifndef ANYATTN_REFERENCE_REFERENCE_H_
#define ANYATTN_REFERENCE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "anyattn/anyattn.h"

namespace anyattn {
namespace reference {

// ---- Reading tensors ----------------------------------------------------------------------------

// Number of elements of t's logical shape (the product of its first ndim dimensions).
int64_t num_elements(const anyattn_tensor& t);

// The element of t at `index` (t.ndim coordinates), converted exactly to double. Handles f32, f16,
// bf16 and i32 and any strides (including 0 and negative ones).
double load(const anyattn_tensor& t, const int64_t* index);

// All of t, gathered into a C-contiguous row-major vector of its logical shape.
std::vector<double> to_contiguous_f64(const anyattn_tensor& t);

// Batch entry b of a rank-4 f32, f16 or bf16 tensor (B, S, H, X) as a rank-3 view (S, H, X).
anyattn_tensor batch_slice(const anyattn_tensor& t, int64_t b);

// ---- Options ------------------------------------------------------------------------------------

// The score and mask options of one call, resolved to plain numbers.
struct ScoreOptions {
  double softmax_scale = 1.0;  // Never 0 here: the default 1/sqrt(D) is already applied.
  double softcap = 0.0;        // 0 = off.
  int64_t window_left = -1;    // -1 = unbounded.
  int64_t window_right = -1;   // -1 = unbounded; causal is already folded in as 0.
};

// Resolves anyattn_fwd_params (NULL = all defaults) for a problem of query/key head dim
// `head_dim`: softmax_scale 0 becomes 1/sqrt(head_dim) and causal sets window_right to 0 (the
// window_left given is kept, as in flash-attn). `params` must be a full, current struct.
ScoreOptions resolve_options(const anyattn_fwd_params* params, int64_t head_dim);

// Bottom-right aligned mask: key j is visible to query i of a (seqlen_q x seqlen_k) problem iff
//   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
// where a window of -1 leaves that side unbounded.
bool key_visible(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k,
                 const ScoreOptions& options);

// ---- The core: one sequence ---------------------------------------------------------------------

// One sequence's inputs, contiguous and row-major.
struct SequenceInputs {
  int64_t seqlen_q = 0;                  // Sq
  int64_t seqlen_k = 0;                  // Sk
  int64_t num_heads_q = 0;               // Hq
  int64_t num_heads_k = 0;               // Hk, divides Hq
  int64_t head_dim = 0;                  // D
  int64_t head_dim_v = 0;                // Dv
  const double* q = nullptr;             // (Sq, Hq, D)
  const double* k = nullptr;             // (Sk, Hk, D)
  const double* v = nullptr;             // (Sk, Hk, Dv)
  const double* alibi_slopes = nullptr;  // (Hq) or nullptr for no ALiBi
  const double* sinks = nullptr;         // (Hq) or nullptr for no sinks
};

// Attention of one sequence, every query head. Writes
//   out: (Sq, Hq, Dv) contiguous, and
//   lse: lse[h * lse_head_stride + i] for h < Hq, i < Sq (natural log; includes the sink).
// For each query head h, reading kv head h / (Hq / Hk), and each query row i:
//   s_ij = softmax_scale * <q_i, k_j>; then softcap; then ALiBi; then the mask.
//   out_i = sum_j e^{s_ij} v_j / (e^{sink_h} + sum_j e^{s_ij}), lse_i = log(denominator).
// A row that sees no key gets out = 0 and lse = sink_h (or -inf without sinks).
// NaN inputs propagate to exactly the rows that read them.
void attend_one_sequence(const SequenceInputs& in, const ScoreOptions& options, double* out,
                         double* lse, int64_t lse_head_stride);

// ---- Dense forward ------------------------------------------------------------------------------

struct DenseOutputs {
  std::vector<double> out;  // (B, Sq, Hq, Dv), contiguous
  std::vector<double> lse;  // (B, Hq, Sq), contiguous
};

// The reference for anyattn_fwd: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv) with any
// strides and dtype f32/f16/bf16, read exactly as doubles. Honours every field of `params` (NULL =
// defaults) that affects the result: softmax_scale, softcap, causal, window, alibi_slopes ((Hq)
// or (B, Hq), f32) and sinks ((Hq), f32). Dropout, num_splits and isa are ignored.
DenseOutputs fwd_dense(const anyattn_tensor& q, const anyattn_tensor& k, const anyattn_tensor& v,
                       const anyattn_fwd_params* params);

}  // namespace reference
}  // namespace anyattn

#endif  // ANYATTN_REFERENCE_REFERENCE_H_
