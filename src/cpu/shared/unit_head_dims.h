// Calls with a head dim of 0 (docs/semantics.md, section 6), run as calls with head dim 1.
//
// D = 0: every score is an empty dot product, exactly 0, which is what head dim 1 gives with q and
// k reading a zero. Dv = 0: out (and dv) have no columns, but the LSE is defined, and so are the
// backward's dq, dk and dsinks (all 0: dP = dout V^T and delta = rowsum(dout * out) are 0); head
// dim 1 with v, out and dout reading a zero gives them. The tensors without columns have no
// memory to use: their reads go to kZeroRow (all strides 0) and their writes to a scratch buffer
// that the caller owns and discards. Nothing here reads or writes a caller's tensor.
#ifndef ANYATTN_CPU_SHARED_UNIT_HEAD_DIMS_H_
#define ANYATTN_CPU_SHARED_UNIT_HEAD_DIMS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/bwd_args.h"
#include "common/fwd_args.h"
#include "common/head_dims.h"

namespace anyattn::cpu {

// Zeros: one row of the largest head dim in any dtype, for kernels that read a whole row.
alignas(64) inline constexpr float kZeroRow[kMaxHeadDim] = {};

// A read tensor whose every element is the zero at kZeroRow.
inline void read_zeros(const void** data, int64_t* batch_stride, int64_t* row_stride,
                       int64_t* head_stride) {
  *data = kZeroRow;
  *batch_stride = *row_stride = *head_stride = 0;
}

// A written (rows, heads, 1) tensor in `scratch`: with cumulative lengths `cu` (varlen) the rows
// are [0, cu[batch]) and the batch stride 0; without, `seqlen` rows per batch. A float holds an
// element of any dtype, so `scratch` is sized in elements.
inline void* write_scratch(int64_t batch, const int32_t* cu, int64_t seqlen, int64_t heads,
                           std::vector<float>* scratch, int64_t* batch_stride, int64_t* row_stride,
                           int64_t* head_stride) {
  const int64_t rows = cu != nullptr ? cu[batch] : batch * seqlen;
  scratch->assign(static_cast<size_t>(std::max<int64_t>(rows * heads, 1)), 0.f);
  *batch_stride = cu != nullptr ? 0 : seqlen * heads;
  *row_stride = heads;
  *head_stride = 1;
  return scratch->data();
}

// A forward call with D = 0 or Dv = 0 (and Dv = 0 only with an LSE to write) rewritten with head
// dim 1; out is written to `out_scratch` when Dv = 0.
inline FwdArgs with_unit_head_dims(const FwdArgs& args, std::vector<float>* out_scratch) {
  FwdArgs a = args;
  if (a.head_dim == 0) {
    read_zeros(&a.q, &a.q_batch_stride, &a.q_row_stride, &a.q_head_stride);
    read_zeros(&a.k, &a.k_batch_stride, &a.k_row_stride, &a.k_head_stride);
    a.head_dim = 1;
  }
  if (a.head_dim_v == 0) {
    read_zeros(&a.v, &a.v_batch_stride, &a.v_row_stride, &a.v_head_stride);
    a.out = write_scratch(a.batch, a.cu_seqlens_q, a.seqlen_q, a.heads_q, out_scratch,
                          &a.out_batch_stride, &a.out_row_stride, &a.out_head_stride);
    a.head_dim_v = 1;
  }
  return a;
}

// Scratch gradients of a backward call rewritten by with_unit_head_dims.
struct UnitHeadDimsScratch {
  std::vector<float> dq, dk, dv;
};

// A backward call with D = 0 or Dv = 0 rewritten with head dim 1: dq and dk (D = 0) or dv
// (Dv = 0) are written to `scratch`; out and dout (Dv = 0) read zeros.
inline BwdArgs with_unit_head_dims(const BwdArgs& args, UnitHeadDimsScratch* scratch) {
  BwdArgs b = args;
  FwdArgs& f = b.fwd;
  if (f.head_dim == 0) {
    read_zeros(&f.q, &f.q_batch_stride, &f.q_row_stride, &f.q_head_stride);
    read_zeros(&f.k, &f.k_batch_stride, &f.k_row_stride, &f.k_head_stride);
    b.dq = write_scratch(f.batch, f.cu_seqlens_q, f.seqlen_q, f.heads_q, &scratch->dq,
                         &b.dq_batch_stride, &b.dq_row_stride, &b.dq_head_stride);
    b.dk = write_scratch(f.batch, f.cu_seqlens_k, f.seqlen_k, f.heads_k, &scratch->dk,
                         &b.dk_batch_stride, &b.dk_row_stride, &b.dk_head_stride);
    f.head_dim = 1;
  }
  if (f.head_dim_v == 0) {
    read_zeros(&f.v, &f.v_batch_stride, &f.v_row_stride, &f.v_head_stride);
    const void* zeros = nullptr;
    read_zeros(&zeros, &f.out_batch_stride, &f.out_row_stride, &f.out_head_stride);
    f.out = const_cast<void*>(zeros);  // read, never written, by the backward
    read_zeros(&b.dout, &b.dout_batch_stride, &b.dout_row_stride, &b.dout_head_stride);
    b.dv = write_scratch(f.batch, f.cu_seqlens_k, f.seqlen_k, f.heads_k, &scratch->dv,
                         &b.dv_batch_stride, &b.dv_row_stride, &b.dv_head_stride);
    f.head_dim_v = 1;
  }
  return b;
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_SHARED_UNIT_HEAD_DIMS_H_
