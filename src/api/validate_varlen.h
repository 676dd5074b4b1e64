// Argument validation for anyattn_fwd_varlen: packed sequences described by cu_seqlens.
#ifndef ANYATTN_API_VALIDATE_VARLEN_H_
#define ANYATTN_API_VALIDATE_VARLEN_H_

#include "anyattn/anyattn.h"
#include "api/validate_fwd.h"

namespace anyattn::api {

// Checks every tensor, every cu_seqlens / seqused_k value and every option; throws ApiError
// naming the parameter otherwise. The result owns copies of the length arrays.
ValidatedFwd validate_fwd_varlen(const anyattn_tensor* q, const anyattn_tensor* k,
                                 const anyattn_tensor* v, const anyattn_tensor* out,
                                 const anyattn_tensor* lse, const anyattn_tensor* cu_seqlens_q,
                                 const anyattn_tensor* cu_seqlens_k,
                                 const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
                                 int64_t max_seqlen_k, const anyattn_fwd_params* params);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_VARLEN_H_
