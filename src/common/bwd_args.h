// The validated description of one backward attention call, in the form the CPU backward kernels
// read. Built only by api/validate_bwd.cc after every check has passed.
//
// `fwd` holds everything the forward call had (sizes, q/k/v/out/lse pointers and strides, scale,
// softcap, window, ALiBi, sinks); its out and lse are INPUTS here (out from the forward, lse
// required). The gradient outputs have the layouts of the tensors they differentiate.
#ifndef ANYATTN_COMMON_BWD_ARGS_H_
#define ANYATTN_COMMON_BWD_ARGS_H_

#include <cstdint>

#include "common/fwd_args.h"

namespace anyattn::cpu {

struct BwdArgs {
  FwdArgs fwd;  // fwd.lse is never null; fwd.out is read, not written

  // dout[b][i][h][c] = dout[b*dout_batch_stride + i*dout_row_stride + h*dout_head_stride + c]
  const void* dout = nullptr;
  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  // Gradients, dtype of q: dq (B, Sq, Hq, D), dk (B, Sk, Hk, D), dv (B, Sk, Hk, Dv).
  void* dq = nullptr;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  void* dk = nullptr;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  void* dv = nullptr;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  // dsink of head h at dsinks[h * dsinks_stride]; non-null iff fwd.sinks is.
  float* dsinks = nullptr;
  int64_t dsinks_stride = 0;

  // Dropout: off when dropout_p == 0. Kept elements are scaled by 1 / (1 - dropout_p).
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;

  // fwd.out and fwd.lse are this library's forward results for exactly these inputs
  // (anyattn_fwd_params::bwd_own_forward): f32 rows whose keys lie in one block may then be
  // normalised from their own scores (bwd_kernel-inl.h, tile_gradients).
  bool own_forward = false;
};

}  // namespace anyattn::cpu

#endif  // ANYATTN_COMMON_BWD_ARGS_H_
