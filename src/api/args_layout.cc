#include "api/args_layout.h"

namespace anyattn::api {
namespace {

// q ([B,] Sq, Hq, D) and out ([B,] Sq, Hq, Dv): dtype, Hq, D, pointers and strides.
void fill_queries(const anyattn_tensor* q, const anyattn_tensor* out, bool batched,
                  cpu::FwdArgs* a) {
  const int first = batched ? 1 : 0;
  a->dtype = static_cast<cpu::DType>(q->dtype);
  a->heads_q = q->shape[first + 1];
  a->head_dim = q->shape[first + 2];
  read_strides(q, batched, &a->q, &a->q_batch_stride, &a->q_row_stride, &a->q_head_stride);
  read_strides(out, batched, &a->out, &a->out_batch_stride, &a->out_row_stride,
               &a->out_head_stride);
}

// k ([B',] Sk, Hk, D) and v ([B',] Sk, Hk, Dv): Hk, Dv, pointers and strides; Sk when batched.
void fill_keys(const anyattn_tensor* k, const anyattn_tensor* v, bool batched, cpu::FwdArgs* a) {
  const int first = batched ? 1 : 0;
  if (batched) a->seqlen_k = k->shape[1];
  a->heads_k = k->shape[first + 1];
  a->kv_dtype = static_cast<cpu::DType>(k->dtype);
  a->head_dim_v = v->shape[first + 2];
  read_strides(k, batched, &a->k, &a->k_batch_stride, &a->k_row_stride, &a->k_head_stride);
  read_strides(v, batched, &a->v, &a->v_batch_stride, &a->v_row_stride, &a->v_head_stride);
}

}  // namespace

void fill_dense_layout(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                       const anyattn_tensor* out, cpu::FwdArgs* a) {
  fill_queries(q, out, true, a);
  a->batch = q->shape[0];
  a->seqlen_q = q->shape[1];
  fill_keys(k, v, true, a);
}

void fill_packed_layout(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                        const anyattn_tensor* out, cpu::FwdArgs* a) {
  fill_queries(q, out, false, a);
  fill_keys(k, v, false, a);
}

void fill_packed_queries_cache_layout(const anyattn_tensor* q, const anyattn_tensor* k,
                                      const anyattn_tensor* v, const anyattn_tensor* out,
                                      cpu::FwdArgs* a) {
  fill_queries(q, out, false, a);
  fill_keys(k, v, true, a);
}

void fill_lse_layout(const anyattn_tensor* lse, bool packed, cpu::FwdArgs* a) {
  if (lse == nullptr) return;
  read_strides(lse, !packed, &a->lse, &a->lse_batch_stride, &a->lse_head_stride,
               &a->lse_row_stride);
}

void fill_gradient_layout(const anyattn_tensor* dout, const anyattn_tensor* dq,
                          const anyattn_tensor* dk, const anyattn_tensor* dv, bool batched,
                          cpu::BwdArgs* b) {
  read_strides(dout, batched, &b->dout, &b->dout_batch_stride, &b->dout_row_stride,
               &b->dout_head_stride);
  read_strides(dq, batched, &b->dq, &b->dq_batch_stride, &b->dq_row_stride, &b->dq_head_stride);
  read_strides(dk, batched, &b->dk, &b->dk_batch_stride, &b->dk_row_stride, &b->dk_head_stride);
  read_strides(dv, batched, &b->dv, &b->dv_batch_stride, &b->dv_row_stride, &b->dv_head_stride);
}

}  // namespace anyattn::api
