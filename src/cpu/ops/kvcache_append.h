// The in-place append of anyattn_fwd_kvcache: new keys (rotated when a rotary table is given) and
// values are written into the cache at each sequence's current length. Runs after validation and
// before attention.
#ifndef ANYATTN_CPU_OPS_KVCACHE_APPEND_H_
#define ANYATTN_CPU_OPS_KVCACHE_APPEND_H_

#include <cstdint>
#include <vector>

#include "common/fwd_args.h"

namespace anyattn::cpu {

struct CacheAppend {
  int64_t new_tokens = 0;  // S_new; 0 = nothing to append
  const void* k_new = nullptr;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  const void* v_new = nullptr;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;
  // Rotary rows for the new keys: row b * new_tokens + t holds the cos (sin) of position
  // cache_seqlens[b] + t, rotary_dim / 2 floats each. Empty: no rotary.
  std::vector<float> rotary_cos, rotary_sin;
};

// Writes the new keys and values of every sequence into the cache described by `args` (whose
// k/v pointers are the caches, with the addressing of key_row_offset). cache_seqlens[b] is where
// sequence b's first new token goes, as a cache position. Multithreaded over (sequence, token).
void append_to_cache(const FwdArgs& args, const CacheAppend& append,
                     const std::vector<int32_t>& cache_seqlens);

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_OPS_KVCACHE_APPEND_H_
