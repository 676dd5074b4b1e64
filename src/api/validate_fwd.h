// Argument validation for anyattn_fwd: turns the caller's descriptors and params into a
// cpu::FwdArgs that satisfies every invariant documented in cpu/forward/fwd_args.h, or throws ApiError
// naming the parameter, the value given and what is supported. Reads no tensor data.
#ifndef ANYATTN_API_VALIDATE_FWD_H_
#define ANYATTN_API_VALIDATE_FWD_H_

#include <vector>

#include "anyattn/anyattn.h"
#include "cpu/forward/fwd_args.h"

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

  ValidatedFwd() = default;
  ValidatedFwd(ValidatedFwd&&) = default;
  ValidatedFwd& operator=(ValidatedFwd&&) = default;
  ValidatedFwd(const ValidatedFwd&) = delete;
  ValidatedFwd& operator=(const ValidatedFwd&) = delete;
};

// Copies `params` (or the defaults when null) honouring struct_size: fields past struct_size keep
// their defaults. Throws if struct_size cannot even hold the size field.
anyattn_fwd_params read_fwd_params(const char* function, const anyattn_fwd_params* params);

ValidatedFwd validate_fwd(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                          const anyattn_tensor* out, const anyattn_tensor* lse,
                          const anyattn_fwd_params* params);

// Validates the attention options shared by every forward entry point (scale, softcap, window,
// ALiBi, sinks, dropout, splits) and stores them in *args, whose batch, heads_q and head_dim must
// already be set.
void apply_attention_options(const char* function, const anyattn_fwd_params& params,
                             cpu::FwdArgs* args);

// Resolves ANYATTN_ISA_AUTO (and the ANYATTN_ISA environment variable) and checks that the CPU can
// run the requested path. Throws ANYATTN_E_UNSUPPORTED otherwise.
anyattn_isa resolve_isa(const char* function, int32_t requested);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_FWD_H_
