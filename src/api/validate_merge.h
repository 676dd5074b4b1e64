// Argument validation for anyattn_merge_attention_states.
#ifndef ANYATTN_API_VALIDATE_MERGE_H_
#define ANYATTN_API_VALIDATE_MERGE_H_

#include "anyattn/anyattn.h"
#include "cpu/ops/merge_states.h"

namespace anyattn::api {

// Accepts (T, H, Dv) outputs with (H, T) lse, or (B, S, H, Dv) outputs with (B, H, S) lse. out
// may be exactly out_a or out_b, lse_out exactly lse_a or lse_b; any other overlap between the
// written tensors and the inputs is rejected.
cpu::MergeArgs validate_merge(const anyattn_tensor* out_a, const anyattn_tensor* lse_a,
                              const anyattn_tensor* out_b, const anyattn_tensor* lse_b,
                              const anyattn_tensor* out, const anyattn_tensor* lse_out);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_MERGE_H_
