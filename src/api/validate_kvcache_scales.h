// Validation of the scales of an 8-bit KV cache (anyattn_kvcache_params: k_descale, v_descale,
// k_token_scale, v_token_scale), a step of validate_kvcache.cc run after the cache tensors and
// the new keys are checked and before anything is written.
#ifndef ANYATTN_API_VALIDATE_KVCACHE_SCALES_H_
#define ANYATTN_API_VALIDATE_KVCACHE_SCALES_H_

#include <cstdint>
#include <vector>

#include "anyattn/anyattn.h"
#include "api/call_check.h"
#include "api/validate_fwd.h"

namespace anyattn::api {

// Checks the four scale tensors of `cache` for a call with `batch` sequences whose caches
// (already checked by `check`, binding Hk and the cache dims) have dtype `cache_dtype`:
//   - scales given for an f32/f16/bf16 cache: ANYATTN_E_INVALID_ARGUMENT;
//   - an 8-bit shared latent cache (v a column prefix of k) takes K's scales for its V rows:
//     v_descale NULL or equal to k_descale entry by entry, v_token_scale NULL or the very view
//     of k_token_scale (ANYATTN_E_INVALID_ARGUMENT otherwise);
//   - a descale: f32 of shape (1), (Hk) or (B, Hk); every entry finite and >= 0, and when
//     `appending` a normal positive number (the append divides by it);
//   - token scales: both or neither (a shared latent cache: k_token_scale alone), f32
//     (B_cache, S_cache, Hk) or (num_blocks, page_size, Hk) when `paged`, disjoint from the
//     caches and the new keys; not read here (cache data).
// Copies the descales into attention->k_descale / v_descale, expanded to (B, Hk) row-major so
// that the kernels index every granularity alike, and points the scale fields of
// attention->args at them and at the token scales (a shared latent cache's V at K's).
void check_cache_scales(CallCheck* check, const anyattn_kvcache_params& cache, int32_t cache_dtype,
                        int64_t batch, bool paged, bool appending, ValidatedFwd* attention);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_KVCACHE_SCALES_H_
