// Argument validation for anyattn_fwd: turns the caller's descriptors and params into a
// cpu::FwdArgs that satisfies every invariant documented in common/fwd_args.h, or throws
// ApiError naming the parameter, the value given and what is supported. Reads no tensor data.
#ifndef ANYATTN_API_VALIDATE_FWD_H_
#define ANYATTN_API_VALIDATE_FWD_H_

#include <vector>

#include "anyattn/anyattn.h"
#include "api/call_check.h"
#include "api/call_tensors.h"
#include "common/fwd_args.h"

namespace anyattn::api {

// A validated call. The per-sequence arrays the kernels read (cu_seqlens, cache lengths, block
// tables, rotary rows) are private copies made during validation, so a caller changing its arrays
// concurrently cannot turn a validated call into an out-of-bounds one. Move-only: args points
// into the vectors.
struct ValidatedFwd {
  cpu::FwdArgs args;
  anyattn_isa isa = ANYATTN_ISA_AUTO;  // resolved: never ANYATTN_ISA_AUTO
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_k, seqlens_k, k_start, kv_batch_index, block_table,
      q_position;
  std::vector<float> rotary_cos, rotary_sin;
  std::vector<float> k_descale, v_descale;  // 8-bit cache descales, (B, Hk) row-major

  ValidatedFwd() = default;
  ValidatedFwd(ValidatedFwd&&) = default;
  ValidatedFwd& operator=(ValidatedFwd&&) = default;
  ValidatedFwd(const ValidatedFwd&) = delete;
  ValidatedFwd& operator=(const ValidatedFwd&) = delete;
};

// anyattn_fwd: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv), out (B, Sq, Hq, Dv) written,
// lse (B, Hq, Sq) f32 written or NULL; then params and the ISA.
ValidatedFwd validate_fwd(const AttentionTensors& tensors, const anyattn_fwd_params* params);

// The dense attention shared by anyattn_fwd and anyattn_bwd: checks q, k, v, out and lse against
// `table` (tables::kFwd or tables::kBwdForward) in `call`, then the attention options, and returns
// the forward's arguments.
cpu::FwdArgs check_dense_attention(CallCheck* call, const TensorTable& table,
                                   const AttentionTensors& tensors,
                                   const anyattn_fwd_params& params);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_FWD_H_
