// Argument validation for anyattn_bwd: turns the caller's descriptors and params into a
// cpu::BwdArgs that satisfies every invariant documented in cpu/bwd_args.h and cpu/fwd_args.h, or
// throws ApiError naming the parameter, the value given and what is supported. Reads no tensor
// data.
#ifndef ANYATTN_API_VALIDATE_BWD_H_
#define ANYATTN_API_VALIDATE_BWD_H_

#include "anyattn/anyattn.h"
#include "cpu/bwd_args.h"

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

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_BWD_H_
