// Copies validated tensor descriptors into the kernels' argument structs: data pointers, element
// strides and the problem dimensions. Call only after the tensors' ranks and shapes have been
// checked (call_check.h).
#ifndef ANYATTN_API_ARGS_LAYOUT_H_
#define ANYATTN_API_ARGS_LAYOUT_H_

#include <cstdint>

#include "anyattn/anyattn.h"
#include "common/bwd_args.h"
#include "common/fwd_args.h"

namespace anyattn::api {

// The data pointer and the strides of the three outer dimensions of `t`, named for the common
// case (batch, row, head) but taken in order: with `batched` false, `t` has no leading batch
// dimension and the batch stride is 0. An lse (B, Hq, Sq) passes its head stride as `row` and its
// row stride as `head`.
template <class Pointer>
void read_strides(const anyattn_tensor* t, bool batched, Pointer* data, int64_t* batch,
                  int64_t* row, int64_t* head) {
  const int first = batched ? 1 : 0;
  *data = static_cast<Pointer>(t->data);
  *batch = batched ? t->strides[0] : 0;
  *row = t->strides[first];
  *head = t->strides[first + 1];
}

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

// lse (B, Hq, Sq) for dense calls, (Hq, total_q) for packed ones; nothing when lse is NULL.
void fill_lse_layout(const anyattn_tensor* lse, bool packed, cpu::FwdArgs* args);

// The gradients' pointers and strides: dout, dq like q, dk like k, dv like v, dense (batched) or
// packed.
void fill_gradient_layout(const anyattn_tensor* dout, const anyattn_tensor* dq,
                          const anyattn_tensor* dk, const anyattn_tensor* dv, bool batched,
                          cpu::BwdArgs* bwd);

}  // namespace anyattn::api

#endif  // ANYATTN_API_ARGS_LAYOUT_H_
