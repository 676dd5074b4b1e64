// Argument validation for anyattn_bwd: turns the caller's descriptors and params into a
// cpu::BwdArgs that satisfies every invariant documented in cpu/backward/bwd_args.h and cpu/forward/fwd_args.h, or
// throws ApiError naming the parameter, the value given and what is supported. Reads no tensor
// data.
#ifndef ANYATTN_API_VALIDATE_BWD_H_
#define ANYATTN_API_VALIDATE_BWD_H_

#include "anyattn/anyattn.h"
#include "api/validate_fwd.h"
#include "cpu/backward/bwd_args.h"

namespace anyattn::api {

struct ValidatedBwd {
  cpu::BwdArgs args;
  anyattn_isa isa = ANYATTN_ISA_AUTO;  // resolved: never ANYATTN_ISA_AUTO
};

// Checks, in order: the ten tensors (rank, dtype, unit last stride, extent), their shapes against
// q's (B, Sq, Hq, D) and k's (Sk, Hk) and v's Dv, GQA divisibility, head dims, size limits; that
// no gradient overlaps itself, another gradient or any input; then params as anyattn_fwd does
// (dropout_p in [0, 1) is accepted); finally that dsinks is given exactly when params->sinks is.
ValidatedBwd validate_bwd(const anyattn_tensor* dout, const anyattn_tensor* q,
                          const anyattn_tensor* k, const anyattn_tensor* v,
                          const anyattn_tensor* out, const anyattn_tensor* lse,
                          const anyattn_tensor* dq, const anyattn_tensor* dk,
                          const anyattn_tensor* dv, const anyattn_tensor* dsinks,
                          const anyattn_fwd_params* params);

// A validated anyattn_bwd_varlen call. bwd.args.fwd points into forward's length arrays, so the
// two travel together (moving keeps the arrays in place).
struct ValidatedBwdVarlen {
  ValidatedFwd forward;
  ValidatedBwd bwd;
};

// Checks, in order: NULL lse; everything anyattn_fwd_varlen checks (q, k, v, out, lse (Hq,
// total_q), cu_seqlens_q/k, seqused_k, max_seqlen_q/k, params; messages name anyattn_bwd_varlen);
// then dout (total_q, Hq, Dv), dq (total_q, Hq, D), dk (total_k, Hk, D), dv (total_k, Hk, Dv):
// rank, dtype, shape; that no gradient overlaps itself, another gradient, an input or a side input;
// finally dsinks as in validate_bwd.
ValidatedBwdVarlen validate_bwd_varlen(const anyattn_tensor* dout, const anyattn_tensor* q,
                                       const anyattn_tensor* k, const anyattn_tensor* v,
                                       const anyattn_tensor* out, const anyattn_tensor* lse,
                                       const anyattn_tensor* dq, const anyattn_tensor* dk,
                                       const anyattn_tensor* dv, const anyattn_tensor* dsinks,
                                       const anyattn_tensor* cu_seqlens_q,
                                       const anyattn_tensor* cu_seqlens_k,
                                       const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
                                       int64_t max_seqlen_k, const anyattn_fwd_params* params);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_BWD_H_
