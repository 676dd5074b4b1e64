// The f64 reference of anyattn's backward contract (docs/backward.md), with dropout.
//
// Like reference.h: plain loops in double precision, one query row at a time, meant to be read.
// It recomputes the forward (out and lse, with dropout) from q, k, v itself and differentiates
// the loss L = sum(dout * out) by hand, row by row:
//   P_ij = exp(s_ij - lse_i), Z_ij = keep(b, h, i, j) / (1 - p) (1 without dropout)
//   out_i = sum_j P_ij Z_ij v_j
//   dv_j += P_ij Z_ij dout_i;  dP_ij = Z_ij <dout_i, v_j>;  D_i = sum_j P_ij dP_ij
//   dS_ij = P_ij (dP_ij - D_i);  dX_ij = dS_ij * (1 - tanh^2) with softcap, else dS_ij
//   dq_i += scale dX_ij k_j;  dk_j += scale dX_ij q_i;  dsink_h -= exp(sink_h - lse_i) D_i
// The dropout keep mask is common/philox.h's dropout_keep, the same function the kernels use.
// Inputs are assumed valid; nothing is checked.
#ifndef ANYATTN_REFERENCE_REFERENCE_BWD_H_
#define ANYATTN_REFERENCE_REFERENCE_BWD_H_

#include <cstdint>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/reference.h"

namespace anyattn {
namespace reference {

struct DropoutOptions {
  double p = 0.0;  // 0 = off
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Forward results and gradients, contiguous, for q_rows query rows and k_rows key rows:
//   out (q_rows, Hq, Dv), lse (Hq, q_rows), dq (q_rows, Hq, D), dk (k_rows, Hk, D),
//   dv (k_rows, Hk, Dv), dsinks (Hq).
struct Gradients {
  std::vector<double> out, lse, dq, dk, dv, dsinks;
  // Per gradient element, the sum of the absolute values of the terms it is summed from (through
  // P, dP and D_i): the size a rounding error is relative to where the terms cancel.
  std::vector<double> dq_terms, dk_terms, dv_terms, dsinks_terms;

  // Every vector above sized for these extents and zeroed.
  void assign_zeros(int64_t q_rows, int64_t k_rows, int64_t Hq, int64_t Hk, int64_t D, int64_t Dv);
};

// One sequence: q_rows = Sq, k_rows = Sk.
using SequenceGradients = Gradients;

// The core: forward and backward of one sequence (batch index `batch`, which the dropout mask
// reads). dout is (Sq, Hq, Dv) contiguous. dsinks is all zeros without sinks.
// D_i = <dout_i, out_i> comes from the exact forward, or from `out_given` ((Sq, Hq, Dv)
// contiguous) when it is not null: the out a backward kernel is handed, already rounded to its
// dtype, which moves every gradient but dv by a term linear in the rounding.
SequenceGradients backprop_one_sequence(const SequenceInputs& in, const double* dout,
                                        const ScoreOptions& options, const DropoutOptions& dropout,
                                        int64_t batch, const double* out_given = nullptr);

// Contiguous dense results: out (B, Sq, Hq, Dv), lse (B, Hq, Sq), dq (B, Sq, Hq, D),
// dk (B, Sk, Hk, D), dv (B, Sk, Hk, Dv), dsinks (Hq) summed over the batch.
using DenseGradients = Gradients;

// The reference for anyattn_bwd (and for anyattn_fwd with dropout): strided tensors of any
// supported dtype, read exactly as doubles. Honours every field of params (NULL = defaults) that
// affects the result, dropout included. With `out_given` (B, Sq, Hq, Dv), the gradients are those
// of a backward handed that out (see backprop_one_sequence); out and lse stay the exact forward's.
DenseGradients bwd_dense(const anyattn_tensor& q, const anyattn_tensor& k, const anyattn_tensor& v,
                         const anyattn_tensor& dout, const anyattn_fwd_params* params,
                         const anyattn_tensor* out_given = nullptr);

// Contiguous varlen results: out (total_q, Hq, Dv), lse (Hq, total_q), dq (total_q, Hq, D),
// dk (total_k, Hk, D), dv (total_k, Hk, Dv), dsinks (Hq) summed over the sequences. Entries of rows
// outside every sequence are 0, and those rows are flagged 0 in q_row_in_sequence /
// k_row_in_sequence; the keys of a sequence beyond its seqused_k are inside it, with zero
// gradients.
struct VarlenGradients : Gradients {
  std::vector<char> q_row_in_sequence, k_row_in_sequence;
};

// The reference for anyattn_bwd_varlen (packed (total, H, X) tensors, int32 cu_seqlens, optional
// seqused_k): every sequence differentiated on its own, sequence b with batch index b for the
// dropout mask and (B, Hq) ALiBi slopes. `out_given` (total_q, Hq, Dv) as in bwd_dense.
VarlenGradients bwd_varlen(const anyattn_tensor& q, const anyattn_tensor& k,
                           const anyattn_tensor& v, const anyattn_tensor& dout,
                           const anyattn_tensor& cu_seqlens_q, const anyattn_tensor& cu_seqlens_k,
                           const anyattn_tensor* seqused_k, const anyattn_fwd_params* params,
                           const anyattn_tensor* out_given = nullptr);

}  // namespace reference
}  // namespace anyattn

#endif  // ANYATTN_REFERENCE_REFERENCE_BWD_H_
