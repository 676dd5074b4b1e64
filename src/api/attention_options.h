// The scalar side of a call: the caller's versioned params structs, the attention options every
// forward and backward entry point shares, and the choice of ISA path.
#ifndef ANYATTN_API_ATTENTION_OPTIONS_H_
#define ANYATTN_API_ATTENTION_OPTIONS_H_

#include "anyattn/anyattn.h"
#include "common/fwd_args.h"

namespace anyattn::api {

// Copies `params` (or the defaults when null) honouring struct_size: fields past struct_size keep
// their defaults. Throws if struct_size cannot even hold the size field.
anyattn_fwd_params read_fwd_params(const char* function, const anyattn_fwd_params* params);
anyattn_kvcache_params read_cache_params(const char* function,
                                         const anyattn_kvcache_params* cache);

// Validates the attention options shared by every forward and backward entry point (scale,
// softcap, window, ALiBi, sinks, dropout, splits, precision) and stores them in *args, whose
// dtype, batch, heads_q and head_dim must already be set.
void apply_attention_options(const char* function, const anyattn_fwd_params& params,
                             cpu::FwdArgs* args);

// Resolves ANYATTN_ISA_AUTO (and the ANYATTN_ISA environment variable) and checks that the CPU can
// run the requested path. Throws ANYATTN_E_UNSUPPORTED otherwise.
anyattn_isa resolve_isa(const char* function, int32_t requested);

}  // namespace anyattn::api

#endif  // ANYATTN_API_ATTENTION_OPTIONS_H_
