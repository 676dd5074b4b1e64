/* Compiled by build.rs against include/anyattn/anyattn.h. It reports the header's layouts and
 * constants to the Rust tests (tests/abi.rs), which compare them with the hand-written
 * declarations in src/lib.rs. The typed function-pointer table below fails to compile when a
 * signature in the header changes, which is the cue to update src/lib.rs. */
#include <stddef.h>
#include <stdint.h>

#include "anyattn/anyattn.h"

#define FIELD(type, field) {#type "." #field, offsetof(type, field), sizeof(((type*)0)->field)}

typedef struct anyattn_sys_field {
  const char* name;
  size_t offset;
  size_t size;
} anyattn_sys_field;

static const anyattn_sys_field kFields[] = {
    FIELD(anyattn_tensor, data),
    FIELD(anyattn_tensor, dtype),
    FIELD(anyattn_tensor, ndim),
    FIELD(anyattn_tensor, shape),
    FIELD(anyattn_tensor, strides),
    FIELD(anyattn_fwd_params, struct_size),
    FIELD(anyattn_fwd_params, softmax_scale),
    FIELD(anyattn_fwd_params, softcap),
    FIELD(anyattn_fwd_params, causal),
    FIELD(anyattn_fwd_params, window_left),
    FIELD(anyattn_fwd_params, window_right),
    FIELD(anyattn_fwd_params, alibi_slopes),
    FIELD(anyattn_fwd_params, sinks),
    FIELD(anyattn_fwd_params, dropout_p),
    FIELD(anyattn_fwd_params, dropout_seed),
    FIELD(anyattn_fwd_params, dropout_offset),
    FIELD(anyattn_fwd_params, num_splits),
    FIELD(anyattn_fwd_params, isa),
    FIELD(anyattn_fwd_params, bwd_own_forward),
    FIELD(anyattn_fwd_params, precision),
    FIELD(anyattn_kernel_info, name),
    FIELD(anyattn_kernel_info, isa),
    FIELD(anyattn_kernel_info, supported),
    FIELD(anyattn_kernel_info, vector_lanes),
    FIELD(anyattn_kernel_info, tile_rows),
    FIELD(anyattn_kernel_info, tile_keys),
    FIELD(anyattn_kvcache_params, struct_size),
    FIELD(anyattn_kvcache_params, k_new),
    FIELD(anyattn_kvcache_params, v_new),
    FIELD(anyattn_kvcache_params, cache_seqlens),
    FIELD(anyattn_kvcache_params, cache_seqlen),
    FIELD(anyattn_kvcache_params, cache_batch_idx),
    FIELD(anyattn_kvcache_params, cache_leftpad),
    FIELD(anyattn_kvcache_params, block_table),
    FIELD(anyattn_kvcache_params, rotary_cos),
    FIELD(anyattn_kvcache_params, rotary_sin),
    FIELD(anyattn_kvcache_params, rotary_interleaved),
    FIELD(anyattn_kvcache_params, k_descale),
    FIELD(anyattn_kvcache_params, v_descale),
    FIELD(anyattn_kvcache_params, k_token_scale),
    FIELD(anyattn_kvcache_params, v_token_scale),
};

size_t anyattn_sys_abi_field_count(void) { return sizeof(kFields) / sizeof(kFields[0]); }

/* Name, offset and size of field i, for i < anyattn_sys_abi_field_count(). */
const char* anyattn_sys_abi_field(size_t i, size_t* offset, size_t* size) {
  *offset = kFields[i].offset;
  *size = kFields[i].size;
  return kFields[i].name;
}

size_t anyattn_sys_abi_sizeof_tensor(void) { return sizeof(anyattn_tensor); }
size_t anyattn_sys_abi_alignof_tensor(void) { return offsetof(struct { char c; anyattn_tensor t; }, t); }
size_t anyattn_sys_abi_sizeof_fwd_params(void) { return sizeof(anyattn_fwd_params); }
size_t anyattn_sys_abi_alignof_fwd_params(void) {
  return offsetof(struct { char c; anyattn_fwd_params p; }, p);
}
size_t anyattn_sys_abi_sizeof_kernel_info(void) { return sizeof(anyattn_kernel_info); }
size_t anyattn_sys_abi_sizeof_kvcache_params(void) { return sizeof(anyattn_kvcache_params); }
size_t anyattn_sys_abi_sizeof_enum(void) { return sizeof(anyattn_status); }

/* Every integer constant of the header, by name, as the Rust declarations spell them. */
typedef struct anyattn_sys_constant {
  const char* name;
  int64_t value;
} anyattn_sys_constant;

#define CONSTANT(name) {#name, (int64_t)(name)}

static const anyattn_sys_constant kConstants[] = {
    CONSTANT(ANYATTN_VERSION_MAJOR),
    CONSTANT(ANYATTN_VERSION_MINOR),
    CONSTANT(ANYATTN_VERSION_PATCH),
    CONSTANT(ANYATTN_VERSION),
    CONSTANT(ANYATTN_OK),
    CONSTANT(ANYATTN_E_INVALID_ARGUMENT),
    CONSTANT(ANYATTN_E_UNSUPPORTED),
    CONSTANT(ANYATTN_E_OUT_OF_MEMORY),
    CONSTANT(ANYATTN_E_INTERNAL),
    CONSTANT(ANYATTN_DTYPE_F32),
    CONSTANT(ANYATTN_DTYPE_F16),
    CONSTANT(ANYATTN_DTYPE_BF16),
    CONSTANT(ANYATTN_DTYPE_I32),
    CONSTANT(ANYATTN_DTYPE_FP8_E4M3),
    CONSTANT(ANYATTN_DTYPE_FP8_E5M2),
    CONSTANT(ANYATTN_DTYPE_I8),
    CONSTANT(ANYATTN_MAX_NDIM),
    CONSTANT(ANYATTN_ISA_AUTO),
    CONSTANT(ANYATTN_ISA_PORTABLE),
    CONSTANT(ANYATTN_ISA_AVX2),
    CONSTANT(ANYATTN_ISA_AVX512),
    CONSTANT(ANYATTN_ISA_AVX512_AMX),
    CONSTANT(ANYATTN_ISA_NEON),
};

size_t anyattn_sys_abi_constant_count(void) { return sizeof(kConstants) / sizeof(kConstants[0]); }

const char* anyattn_sys_abi_constant(size_t i, int64_t* value) {
  *value = kConstants[i].value;
  return kConstants[i].name;
}

/* The signatures src/lib.rs declares, written in C. A mismatch with the header is a compile error
 * (build.rs passes -Werror=incompatible-pointer-types). */
typedef struct anyattn_sys_signatures {
  int (*version)(void);
  const char* (*version_string)(void);
  const char* (*last_error)(void);
  const char* (*status_name)(anyattn_status);
  anyattn_status (*tensor_init_contiguous)(anyattn_tensor*, void*, anyattn_dtype, int32_t,
                                           const int64_t*);
  int (*isa_supported)(anyattn_isa);
  anyattn_isa (*isa_default)(void);
  const char* (*isa_name)(anyattn_isa);
  int (*fwd_kernel_count)(void);
  anyattn_status (*fwd_kernel_info)(int, anyattn_kernel_info*);
  void (*set_num_threads)(int);
  int (*get_num_threads)(void);
  void (*fwd_params_init)(anyattn_fwd_params*);
  anyattn_status (*fwd)(const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                        const anyattn_tensor*, const anyattn_tensor*, const anyattn_fwd_params*);
  anyattn_status (*fwd_varlen)(const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                               const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                               const anyattn_tensor*, const anyattn_tensor*, int64_t, int64_t,
                               const anyattn_fwd_params*);
  void (*kvcache_params_init)(anyattn_kvcache_params*);
  anyattn_status (*fwd_kvcache)(const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                                const anyattn_tensor*, const anyattn_tensor*,
                                const anyattn_kvcache_params*, const anyattn_fwd_params*);
  anyattn_status (*merge_attention_states)(const anyattn_tensor*, const anyattn_tensor*,
                                           const anyattn_tensor*, const anyattn_tensor*,
                                           const anyattn_tensor*, const anyattn_tensor*);
  anyattn_status (*bwd)(const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                        const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                        const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                        const anyattn_tensor*, const anyattn_fwd_params*);
  anyattn_status (*bwd_varlen)(const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                               const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                               const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                               const anyattn_tensor*, const anyattn_tensor*, const anyattn_tensor*,
                               const anyattn_tensor*, int64_t, int64_t, const anyattn_fwd_params*);
} anyattn_sys_signatures;

const anyattn_sys_signatures anyattn_sys_abi_signatures = {
    anyattn_version,
    anyattn_version_string,
    anyattn_last_error,
    anyattn_status_name,
    anyattn_tensor_init_contiguous,
    anyattn_isa_supported,
    anyattn_isa_default,
    anyattn_isa_name,
    anyattn_fwd_kernel_count,
    anyattn_fwd_kernel_info,
    anyattn_set_num_threads,
    anyattn_get_num_threads,
    anyattn_fwd_params_init,
    anyattn_fwd,
    anyattn_fwd_varlen,
    anyattn_kvcache_params_init,
    anyattn_fwd_kvcache,
    anyattn_merge_attention_states,
    anyattn_bwd,
    anyattn_bwd_varlen,
};
