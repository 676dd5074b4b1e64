// Argument validation for anyattn_bwd and anyattn_bwd_varlen: turns the caller's descriptors and
// params into a cpu::BwdArgs that satisfies every invariant documented in common/bwd_args.h
// and common/fwd_args.h, or throws ApiError naming the parameter, the value given and what
// is supported. Reads no tensor data.
#ifndef ANYATTN_API_VALIDATE_BWD_H_
#define ANYATTN_API_VALIDATE_BWD_H_

#include "anyattn/anyattn.h"
#include "api/call_tensors.h"
#include "api/validate_fwd.h"
#include "common/bwd_args.h"

namespace anyattn::api {

struct ValidatedBwd {
  cpu::BwdArgs args;
  anyattn_isa isa = ANYATTN_ISA_AUTO;  // resolved: never ANYATTN_ISA_AUTO
};

// Validates as the forward plus the gradients: q, k, v, out and lse (required, read) as
// anyattn_fwd checks them (tables::kBwdForward) and params as anyattn_fwd does (dropout_p in
// [0, 1) is accepted); then dout (B, Sq, Hq, Dv), dq (B, Sq, Hq, D), dk (B, Sk, Hk, D) and dv
// (B, Sk, Hk, Dv) (tables::kBwdGradients), none of the gradients overlapping itself, another
// tensor or a side input (ALiBi slopes, sinks); finally dsinks (Hq), given exactly when
// params->sinks is.
ValidatedBwd validate_bwd(const AttentionTensors& forward, const GradientTensors& gradients,
                          const anyattn_fwd_params* params);

// A validated anyattn_bwd_varlen call. bwd.args.fwd points into forward's length arrays, so the
// two travel together (moving keeps the arrays in place).
struct ValidatedBwdVarlen {
  ValidatedFwd forward;
  ValidatedBwd bwd;
};

// Validates as anyattn_fwd_varlen plus the gradients: q, k, v, out, lse (required, read), the
// lengths and params as anyattn_fwd_varlen checks them; then dout (total_q, Hq, Dv), dq (total_q,
// Hq, D), dk (total_k, Hk, D) and dv (total_k, Hk, Dv), and dsinks, as in validate_bwd. Every
// message names anyattn_bwd_varlen.
ValidatedBwdVarlen validate_bwd_varlen(const AttentionTensors& forward,
                                       const GradientTensors& gradients,
                                       const VarlenLengths& lengths,
                                       const anyattn_fwd_params* params);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_BWD_H_
