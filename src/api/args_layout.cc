#include "api/args_layout.h"

namespace anyattn::api {
namespace {

// q (B, Sq, Hq, D) and out (B, Sq, Hq, Dv): dtype, B, Sq, Hq, D, pointers and strides.
void fill_dense_queries(const anyattn_tensor* q, const anyattn_tensor* out, cpu::FwdArgs* a) {
  a->dtype = static_cast<cpu::DType>(q->dtype);
  a->batch = q->shape[0];
  a->seqlen_q = q->shape[1];
  a->heads_q = q->shape[2];
  a->head_dim = q->shape[3];
  a->q = q->data;
  a->q_batch_stride = q->strides[0];
  a->q_row_stride = q->strides[1];
  a->q_head_stride = q->strides[2];
  a->out = out->data;
  a->out_batch_stride = out->strides[0];
  a->out_row_stride = out->strides[1];
  a->out_head_stride = out->strides[2];
}

// q (total_q, Hq, D) and out (total_q, Hq, Dv): dtype, Hq, D, pointers and strides.
void fill_packed_queries(const anyattn_tensor* q, const anyattn_tensor* out, cpu::FwdArgs* a) {
  a->dtype = static_cast<cpu::DType>(q->dtype);
  a->heads_q = q->shape[1];
  a->head_dim = q->shape[2];
  a->q = q->data;
  a->q_row_stride = q->strides[0];
  a->q_head_stride = q->strides[1];
  a->out = out->data;
  a->out_row_stride = out->strides[0];
  a->out_head_stride = out->strides[1];
}

// k (B', Sk, Hk, D) and v (B', Sk, Hk, Dv): Sk, Hk, Dv, pointers and strides.
void fill_batched_keys(const anyattn_tensor* k, const anyattn_tensor* v, cpu::FwdArgs* a) {
  a->seqlen_k = k->shape[1];
  a->heads_k = k->shape[2];
  a->head_dim_v = v->shape[3];
  a->k = k->data;
  a->k_batch_stride = k->strides[0];
  a->k_row_stride = k->strides[1];
  a->k_head_stride = k->strides[2];
  a->v = v->data;
  a->v_batch_stride = v->strides[0];
  a->v_row_stride = v->strides[1];
  a->v_head_stride = v->strides[2];
}

}  // namespace

void fill_dense_layout(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                       const anyattn_tensor* out, cpu::FwdArgs* a) {
  fill_dense_queries(q, out, a);
  fill_batched_keys(k, v, a);
}

void fill_packed_layout(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                        const anyattn_tensor* out, cpu::FwdArgs* a) {
  fill_packed_queries(q, out, a);
  a->heads_k = k->shape[1];
  a->head_dim_v = v->shape[2];
  a->k = k->data;
  a->k_row_stride = k->strides[0];
  a->k_head_stride = k->strides[1];
  a->v = v->data;
  a->v_row_stride = v->strides[0];
  a->v_head_stride = v->strides[1];
}

void fill_packed_queries_cache_layout(const anyattn_tensor* q, const anyattn_tensor* k,
                                      const anyattn_tensor* v, const anyattn_tensor* out,
                                      cpu::FwdArgs* a) {
  fill_packed_queries(q, out, a);
  fill_batched_keys(k, v, a);
}

void fill_lse_layout(const anyattn_tensor* lse, bool packed, cpu::FwdArgs* a) {
  a->lse = static_cast<float*>(lse->data);
  if (packed) {
    a->lse_head_stride = lse->strides[0];
    a->lse_row_stride = lse->strides[1];
  } else {
    a->lse_batch_stride = lse->strides[0];
    a->lse_head_stride = lse->strides[1];
    a->lse_row_stride = lse->strides[2];
  }
}

}  // namespace anyattn::api
