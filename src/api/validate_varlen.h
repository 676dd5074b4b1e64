// Argument validation for anyattn_fwd_varlen: packed sequences described by cu_seqlens.
#ifndef ANYATTN_API_VALIDATE_VARLEN_H_
#define ANYATTN_API_VALIDATE_VARLEN_H_

#include <cstdint>
#include <vector>

#include "anyattn/anyattn.h"
#include "api/call_check.h"
#include "api/call_tensors.h"
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

// The length of a varlen dimension's longest sequence, named `name` (max_seqlen_q): throws
// unless 0 <= value <= kMaxExtent.
int64_t check_max_seqlen(const char* function, const char* name, int64_t value);

// anyattn_fwd_varlen: q (total_q, Hq, D), k (total_k, Hk, D), v (total_k, Hk, Dv), out (total_q,
// Hq, Dv) written, lse (Hq, total_q) f32 written or NULL; then max_seqlen_q/k, cu_seqlens_q/k,
// seqused_k, params and the ISA. The result owns copies of the length arrays.
ValidatedFwd validate_fwd_varlen(const AttentionTensors& tensors, const VarlenLengths& lengths,
                                 const anyattn_fwd_params* params);

// The packed attention shared by anyattn_fwd_varlen and anyattn_bwd_varlen: checks q, k, v, out
// and lse against `table` (tables::kFwdVarlen or tables::kBwdVarlenForward) in `call`, then the
// lengths and the attention options. The ISA is left to the caller.
ValidatedFwd check_varlen_attention(CallCheck* call, const TensorTable& table,
                                    const AttentionTensors& tensors, const VarlenLengths& lengths,
                                    const anyattn_fwd_params& params);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_VARLEN_H_
