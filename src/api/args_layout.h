// Copies validated tensor descriptors into cpu::FwdArgs: data pointers, element strides and the
// problem dimensions. Shared by every entry point's validation; call only after the tensors'
// ranks and shapes have been checked.
#ifndef ANYATTN_API_ARGS_LAYOUT_H_
#define ANYATTN_API_ARGS_LAYOUT_H_

#include "anyattn/anyattn.h"
#include "cpu/forward/fwd_args.h"

namespace anyattn::api {

// Dense tensors: q (B, Sq, Hq, D), k (B', Sk, Hk, D), v (B', Sk, Hk, Dv), out (B, Sq, Hq, Dv).
// Sets dtype, B, Sq, Sk, Hq, Hk, D, Dv from the shapes, and every pointer and stride.
void fill_dense_layout(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                       const anyattn_tensor* out, cpu::FwdArgs* args);

// Packed varlen tensors: q (total_q, Hq, D), k (total_k, Hk, D), v (total_k, Hk, Dv),
// out (total_q, Hq, Dv). Sets dtype, Hq, Hk, D, Dv and every pointer and stride (batch strides
// 0); the caller sets B and the maximum lengths.
void fill_packed_layout(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                        const anyattn_tensor* out, cpu::FwdArgs* args);

// Packed varlen queries against a 4-D KV cache: q (total_q, Hq, D), out (total_q, Hq, Dv), and
// k (B', S', Hk, D), v (B', S', Hk, Dv), contiguous or paged. Sets dtype, Sk (the cache's second
// dimension), Hq, Hk, D, Dv and every pointer and stride (q/out batch strides 0); the caller sets
// B and the maximum lengths.
void fill_packed_queries_cache_layout(const anyattn_tensor* q, const anyattn_tensor* k,
                                      const anyattn_tensor* v, const anyattn_tensor* out,
                                      cpu::FwdArgs* args);

// lse (B, Hq, Sq) for dense calls, (Hq, total_q) for packed ones.
void fill_lse_layout(const anyattn_tensor* lse, bool packed, cpu::FwdArgs* args);

}  // namespace anyattn::api

#endif  // ANYATTN_API_ARGS_LAYOUT_H_
