// Argument validation for anyattn_fwd_varlen: packed sequences described by cu_seqlens.
#ifndef ANYATTN_API_VALIDATE_VARLEN_H_
#define ANYATTN_API_VALIDATE_VARLEN_H_

#include <cstdint>
#include <vector>

#include "anyattn/anyattn.h"
#include "api/validate_fwd.h"

namespace anyattn::api {

// B of a varlen call from cu_seqlens_q (B + 1): throws unless it is a 1-D tensor of at least one
// element, and B at most kMaxExtent. `function` names the entry point in the error.
int64_t read_varlen_batch(const char* function, const anyattn_tensor* cu_seqlens_q);

// Reads cu_seqlens (B + 1 values, named `name`) and checks: non-decreasing, first >= 0, last <=
// total (the packed tensor's rows, named total_name), every length <= max_seqlen (named max_name).
std::vector<int32_t> read_cu_seqlens(const char* function, const char* name,
                                     const anyattn_tensor* t, int64_t batch, int64_t total,
                                     const char* total_name, int64_t max_seqlen,
                                     const char* max_name);

// Checks every tensor, every cu_seqlens / seqused_k value and every option; throws ApiError
// naming the parameter otherwise, with messages that start with `function` (the entry point the
// caller called: the backward validates its forward inputs here under its own name). The result
// owns copies of the length arrays.
ValidatedFwd validate_fwd_varlen(const anyattn_tensor* q, const anyattn_tensor* k,
                                 const anyattn_tensor* v, const anyattn_tensor* out,
                                 const anyattn_tensor* lse, const anyattn_tensor* cu_seqlens_q,
                                 const anyattn_tensor* cu_seqlens_k,
                                 const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
                                 int64_t max_seqlen_k, const anyattn_fwd_params* params,
                                 const char* function = "anyattn_fwd_varlen");

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_VARLEN_H_
