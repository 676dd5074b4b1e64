// Argument validation for anyattn_fwd_kvcache and anyattn_fwd_kvcache_varlen: contiguous or paged
// caches, cache lengths, left padding, batch indices, new keys to append and rotary tables, with
// dense or packed varlen queries. Everything the append and the attention will touch is checked
// here, before anything is written.
#ifndef ANYATTN_API_VALIDATE_KVCACHE_H_
#define ANYATTN_API_VALIDATE_KVCACHE_H_

#include "anyattn/anyattn.h"
#include "api/call_tensors.h"
#include "api/validate_fwd.h"
#include "cpu/ops/kvcache_append.h"

namespace anyattn::api {

struct ValidatedKvcache {
  ValidatedFwd attention;              // the attention over the cache, after the append
  cpu::CacheAppend append;             // the in-place append (append.new_tokens == 0: none)
  std::vector<int32_t> cache_seqlens;  // before the append
};

// anyattn_fwd_kvcache: tensors.k and tensors.v are k_cache and v_cache.
ValidatedKvcache validate_fwd_kvcache(const AttentionTensors& tensors,
                                      const anyattn_kvcache_params* cache,
                                      const anyattn_fwd_params* params);

// anyattn_fwd_kvcache_varlen: packed queries (total_q, Hq, D) with cu_seqlens_q against a cache
// that the call only reads (k_new, v_new and the rotary tables must be NULL).
ValidatedFwd validate_fwd_kvcache_varlen(const AttentionTensors& tensors,
                                         const anyattn_tensor* cu_seqlens_q, int64_t max_seqlen_q,
                                         const anyattn_kvcache_params* cache,
                                         const anyattn_fwd_params* params);

}  // namespace anyattn::api

#endif  // ANYATTN_API_VALIDATE_KVCACHE_H_
