#include "api/validate_bwd.h"

#include <cmath>
#include <utility>

#include "api/args_layout.h"
#include "api/errors.h"
#include "api/tensor_checks.h"
#include "api/validate_fwd.h"
#include "api/validate_varlen.h"

namespace anyattn::api {
namespace {

constexpr const char* kFn = "anyattn_bwd";

// Throws unless t's shape equals (a, b, c, d); `name` and `expected_doc` name it in the message.
void check_shape4(const char* name, const anyattn_tensor* t, const char* expected_doc, int64_t a,
                  int64_t b, int64_t c, int64_t d) {
  if (t->shape[0] != a || t->shape[1] != b || t->shape[2] != c || t->shape[3] != d) {
    fail_invalid(kFn, ": ", name, ".shape is (", t->shape[0], ", ", t->shape[1], ", ", t->shape[2],
                 ", ", t->shape[3], "); expected ", expected_doc, " = (", a, ", ", b, ", ", c, ", ",
                 d, ")");
  }
}

// dsinks is given exactly when params.sinks is; then an f32 (Hq) tensor that overlaps no input,
// no gradient and no side input. Sets bwd->dsinks.
template <size_t kInputs>
void check_dsinks(const char* fn, const anyattn_tensor* dsinks, const anyattn_fwd_params& params,
                  int64_t heads_q, const std::pair<const char*, TensorExtent> (&inputs)[kInputs],
                  const std::pair<const char*, const anyattn_tensor*> (&grads)[3],
                  const TensorExtent (&grad_x)[3], cpu::BwdArgs* bwd) {
  if (params.sinks != nullptr && dsinks == nullptr) {
    fail_invalid(fn,
                 ": dsinks is NULL but params->sinks is set; pass an f32 (Hq) tensor to "
                 "receive the sink gradient");
  }
  if (params.sinks == nullptr && dsinks != nullptr) {
    fail_invalid(fn,
                 ": dsinks is given but params->sinks is NULL; dsinks must be NULL without "
                 "sinks");
  }
  if (dsinks != nullptr) {
    const TensorExtent dsinks_x =
        check_tensor(fn, "dsinks", dsinks, 1, "(Hq)", {ANYATTN_DTYPE_F32});
    if (dsinks->shape[0] != heads_q) {
      fail_invalid(fn, ": dsinks.shape[0] is ", dsinks->shape[0], "; expected Hq = ", heads_q);
    }
    check_no_self_overlap(fn, "dsinks", dsinks);
    for (const auto& [in_name, in_x] : inputs)
      check_disjoint(fn, "dsinks", dsinks_x, in_name, in_x);
    for (int g = 0; g < 3; ++g) check_disjoint(fn, "dsinks", dsinks_x, grads[g].first, grad_x[g]);
    const TensorExtent sinks_x =
        check_tensor(fn, "params->sinks", params.sinks, 1, "(Hq)", {ANYATTN_DTYPE_F32});
    check_disjoint(fn, "dsinks", dsinks_x, "params->sinks", sinks_x);
    if (params.alibi_slopes != nullptr) {
      const TensorExtent alibi_x =
          check_tensor(fn, "params->alibi_slopes", params.alibi_slopes, params.alibi_slopes->ndim,
                       "(Hq) or (B, Hq)", {ANYATTN_DTYPE_F32});
      check_disjoint(fn, "dsinks", dsinks_x, "params->alibi_slopes", alibi_x);
    }
    bwd->dsinks = static_cast<float*>(dsinks->data);
    bwd->dsinks_stride = dsinks->shape[0] > 1 ? dsinks->strides[0] : 1;
  }
}

}  // namespace

ValidatedBwd validate_bwd(const anyattn_tensor* dout, const anyattn_tensor* q,
                          const anyattn_tensor* k, const anyattn_tensor* v,
                          const anyattn_tensor* out, const anyattn_tensor* lse,
                          const anyattn_tensor* dq, const anyattn_tensor* dk,
                          const anyattn_tensor* dv, const anyattn_tensor* dsinks,
                          const anyattn_fwd_params* params_in) {
  const anyattn_fwd_params params = read_fwd_params(kFn, params_in);
  const std::initializer_list<int32_t> float_types = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16,
                                                      ANYATTN_DTYPE_BF16};
  const TensorExtent dout_x = check_tensor(kFn, "dout", dout, 4, "(B, Sq, Hq, Dv)", float_types);
  const TensorExtent q_x = check_tensor(kFn, "q", q, 4, "(B, Sq, Hq, D)", float_types);
  const TensorExtent k_x = check_tensor(kFn, "k", k, 4, "(B, Sk, Hk, D)", float_types);
  const TensorExtent v_x = check_tensor(kFn, "v", v, 4, "(B, Sk, Hk, Dv)", float_types);
  const TensorExtent out_x = check_tensor(kFn, "out", out, 4, "(B, Sq, Hq, Dv)", float_types);
  const TensorExtent lse_x = check_tensor(kFn, "lse", lse, 3, "(B, Hq, Sq)", {ANYATTN_DTYPE_F32});
  const TensorExtent dq_x = check_tensor(kFn, "dq", dq, 4, "(B, Sq, Hq, D)", float_types);
  const TensorExtent dk_x = check_tensor(kFn, "dk", dk, 4, "(B, Sk, Hk, D)", float_types);
  const TensorExtent dv_x = check_tensor(kFn, "dv", dv, 4, "(B, Sk, Hk, Dv)", float_types);
  for (const auto& [name, t] :
       {std::pair{"dout", dout}, std::pair{"k", k}, std::pair{"v", v}, std::pair{"out", out},
        std::pair{"dq", dq}, std::pair{"dk", dk}, std::pair{"dv", dv}}) {
    if (t->dtype != q->dtype) {
      fail_invalid(kFn, ": ", name, ".dtype is ", dtype_name(t->dtype), " but q.dtype is ",
                   dtype_name(q->dtype),
                   "; q, k, v, out, dout, dq, dk and dv must share one dtype");
    }
  }
  const int64_t batch = q->shape[0], seqlen_q = q->shape[1], heads_q = q->shape[2];
  const int64_t head_dim = q->shape[3];
  const int64_t seqlen_k = k->shape[1], heads_k = k->shape[2], head_dim_v = v->shape[3];
  check_head_dims(kFn, "q.shape[3]", head_dim, "v.shape[3]", head_dim_v);
  check_shape4("k", k, "(B, Sk, Hk, D)", batch, seqlen_k, heads_k, head_dim);
  check_shape4("v", v, "(B, Sk, Hk, Dv)", batch, seqlen_k, heads_k, head_dim_v);
  check_heads(kFn, "q.shape[2]", heads_q, "k.shape[2]", heads_k);
  check_shape4("out", out, "(B, Sq, Hq, Dv)", batch, seqlen_q, heads_q, head_dim_v);
  check_shape4("dout", dout, "(B, Sq, Hq, Dv)", batch, seqlen_q, heads_q, head_dim_v);
  check_shape4("dq", dq, "(B, Sq, Hq, D)", batch, seqlen_q, heads_q, head_dim);
  check_shape4("dk", dk, "(B, Sk, Hk, D)", batch, seqlen_k, heads_k, head_dim);
  check_shape4("dv", dv, "(B, Sk, Hk, Dv)", batch, seqlen_k, heads_k, head_dim_v);
  if (lse->shape[0] != batch || lse->shape[1] != heads_q || lse->shape[2] != seqlen_q) {
    fail_invalid(kFn, ": lse.shape is (", lse->shape[0], ", ", lse->shape[1], ", ", lse->shape[2],
                 "); expected (B, Hq, Sq) = (", batch, ", ", heads_q, ", ", seqlen_q, ")");
  }
  check_extent(kFn, "B", batch);
  check_extent(kFn, "Sq", seqlen_q);
  check_extent(kFn, "Sk", seqlen_k);
  check_extent(kFn, "Hq", heads_q);

  // Gradients are written: each must address its elements once and share no byte with an input
  // or with another gradient.
  const std::pair<const char*, TensorExtent> inputs[] = {
      {"dout", dout_x}, {"q", q_x}, {"k", k_x}, {"v", v_x}, {"out", out_x}, {"lse", lse_x}};
  const std::pair<const char*, const anyattn_tensor*> grads[] = {
      {"dq", dq}, {"dk", dk}, {"dv", dv}};
  const TensorExtent grad_x[] = {dq_x, dk_x, dv_x};
  for (int g = 0; g < 3; ++g) {
    check_no_self_overlap(kFn, grads[g].first, grads[g].second);
    for (const auto& [in_name, in_x] : inputs)
      check_disjoint(kFn, grads[g].first, grad_x[g], in_name, in_x);
    for (int other = 0; other < g; ++other) {
      check_disjoint(kFn, grads[g].first, grad_x[g], grads[other].first, grad_x[other]);
    }
  }

  ValidatedBwd result;
  cpu::BwdArgs& bwd = result.args;
  cpu::FwdArgs& a = bwd.fwd;
  fill_dense_layout(q, k, v, out, &a);
  fill_lse_layout(lse, false, &a);
  bwd.dout = dout->data;
  bwd.dout_batch_stride = dout->strides[0];
  bwd.dout_row_stride = dout->strides[1];
  bwd.dout_head_stride = dout->strides[2];
  bwd.dq = dq->data;
  bwd.dq_batch_stride = dq->strides[0];
  bwd.dq_row_stride = dq->strides[1];
  bwd.dq_head_stride = dq->strides[2];
  bwd.dk = dk->data;
  bwd.dk_batch_stride = dk->strides[0];
  bwd.dk_row_stride = dk->strides[1];
  bwd.dk_head_stride = dk->strides[2];
  bwd.dv = dv->data;
  bwd.dv_batch_stride = dv->strides[0];
  bwd.dv_row_stride = dv->strides[1];
  bwd.dv_head_stride = dv->strides[2];

  apply_attention_options(kFn, params, &a);
  // The side inputs are read while gradients are written: they must not overlap either.
  for (const auto& [side_name, side] : {std::pair{"params->alibi_slopes", params.alibi_slopes},
                                        std::pair{"params->sinks", params.sinks}}) {
    if (side == nullptr) continue;
    const TensorExtent side_x =
        check_tensor(kFn, side_name, side, side->ndim, "(Hq) or (B, Hq)", {ANYATTN_DTYPE_F32});
    for (int g = 0; g < 3; ++g) check_disjoint(kFn, grads[g].first, grad_x[g], side_name, side_x);
  }
  bwd.dropout_p = params.dropout_p;
  bwd.dropout_seed = params.dropout_seed;
  bwd.dropout_offset = params.dropout_offset;

  check_dsinks(kFn, dsinks, params, heads_q, inputs, grads, grad_x, &bwd);
  result.isa = resolve_isa(kFn, params.isa);
  return result;
}

ValidatedBwdVarlen validate_bwd_varlen(const anyattn_tensor* dout, const anyattn_tensor* q,
                                       const anyattn_tensor* k, const anyattn_tensor* v,
                                       const anyattn_tensor* out, const anyattn_tensor* lse,
                                       const anyattn_tensor* dq, const anyattn_tensor* dk,
                                       const anyattn_tensor* dv, const anyattn_tensor* dsinks,
                                       const anyattn_tensor* cu_seqlens_q,
                                       const anyattn_tensor* cu_seqlens_k,
                                       const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
                                       int64_t max_seqlen_k, const anyattn_fwd_params* params_in) {
  constexpr const char* kVarlenFn = "anyattn_bwd_varlen";
  if (lse == nullptr) {
    fail_invalid(kVarlenFn,
                 ": lse is NULL; the backward needs the forward's f32 (Hq, total_q) LSE");
  }
  ValidatedBwdVarlen result;
  // The forward's checks of q, k, v, out, lse, the lengths and params, under this function's name.
  result.forward = validate_fwd_varlen(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                       max_seqlen_q, max_seqlen_k, params_in, kVarlenFn);
  const anyattn_fwd_params params = read_fwd_params(kVarlenFn, params_in);
  const std::initializer_list<int32_t> float_types = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16,
                                                      ANYATTN_DTYPE_BF16};
  const cpu::FwdArgs& a = result.forward.args;
  const int64_t total_q = q->shape[0], total_k = k->shape[0];
  const TensorExtent dout_x =
      check_tensor(kVarlenFn, "dout", dout, 3, "(total_q, Hq, Dv)", float_types);
  const TensorExtent dq_x = check_tensor(kVarlenFn, "dq", dq, 3, "(total_q, Hq, D)", float_types);
  const TensorExtent dk_x = check_tensor(kVarlenFn, "dk", dk, 3, "(total_k, Hk, D)", float_types);
  const TensorExtent dv_x = check_tensor(kVarlenFn, "dv", dv, 3, "(total_k, Hk, Dv)", float_types);
  for (const auto& [name, t] :
       {std::pair{"dout", dout}, std::pair{"dq", dq}, std::pair{"dk", dk}, std::pair{"dv", dv}}) {
    if (t->dtype != q->dtype) {
      fail_invalid(kVarlenFn, ": ", name, ".dtype is ", dtype_name(t->dtype), " but q.dtype is ",
                   dtype_name(q->dtype),
                   "; q, k, v, out, dout, dq, dk and dv must share one dtype");
    }
  }
  const struct {
    const char* name;
    const anyattn_tensor* t;
    const char* doc;
    int64_t rows, heads, dim;
  } expected[] = {{"dout", dout, "(total_q, Hq, Dv)", total_q, a.heads_q, a.head_dim_v},
                  {"dq", dq, "(total_q, Hq, D)", total_q, a.heads_q, a.head_dim},
                  {"dk", dk, "(total_k, Hk, D)", total_k, a.heads_k, a.head_dim},
                  {"dv", dv, "(total_k, Hk, Dv)", total_k, a.heads_k, a.head_dim_v}};
  for (const auto& e : expected) {
    if (e.t->shape[0] != e.rows || e.t->shape[1] != e.heads || e.t->shape[2] != e.dim) {
      fail_invalid(kVarlenFn, ": ", e.name, ".shape is (", e.t->shape[0], ", ", e.t->shape[1], ", ",
                   e.t->shape[2], "); expected ", e.doc, " = (", e.rows, ", ", e.heads, ", ", e.dim,
                   ")");
    }
  }
  const TensorExtent q_x = check_tensor(kVarlenFn, "q", q, 3, "(total_q, Hq, D)", float_types);
  const TensorExtent k_x = check_tensor(kVarlenFn, "k", k, 3, "(total_k, Hk, D)", float_types);
  const TensorExtent v_x = check_tensor(kVarlenFn, "v", v, 3, "(total_k, Hk, Dv)", float_types);
  const TensorExtent out_x =
      check_tensor(kVarlenFn, "out", out, 3, "(total_q, Hq, Dv)", float_types);
  const TensorExtent lse_x =
      check_tensor(kVarlenFn, "lse", lse, 2, "(Hq, total_q)", {ANYATTN_DTYPE_F32});
  const std::pair<const char*, TensorExtent> inputs[] = {
      {"dout", dout_x}, {"q", q_x}, {"k", k_x}, {"v", v_x}, {"out", out_x}, {"lse", lse_x}};
  const std::pair<const char*, const anyattn_tensor*> grads[] = {
      {"dq", dq}, {"dk", dk}, {"dv", dv}};
  const TensorExtent grad_x[] = {dq_x, dk_x, dv_x};
  for (int g = 0; g < 3; ++g) {
    check_no_self_overlap(kVarlenFn, grads[g].first, grads[g].second);
    for (const auto& [in_name, in_x] : inputs)
      check_disjoint(kVarlenFn, grads[g].first, grad_x[g], in_name, in_x);
    for (int other = 0; other < g; ++other) {
      check_disjoint(kVarlenFn, grads[g].first, grad_x[g], grads[other].first, grad_x[other]);
    }
  }
  for (const auto& [side_name, side] : {std::pair{"params->alibi_slopes", params.alibi_slopes},
                                        std::pair{"params->sinks", params.sinks}}) {
    if (side == nullptr) continue;
    const TensorExtent side_x = check_tensor(kVarlenFn, side_name, side, side->ndim,
                                             "(Hq) or (B, Hq)", {ANYATTN_DTYPE_F32});
    for (int g = 0; g < 3; ++g) {
      check_disjoint(kVarlenFn, grads[g].first, grad_x[g], side_name, side_x);
    }
  }

  cpu::BwdArgs& bwd = result.bwd.args;
  bwd.fwd = a;
  bwd.dout = dout->data;
  bwd.dout_row_stride = dout->strides[0];
  bwd.dout_head_stride = dout->strides[1];
  bwd.dq = dq->data;
  bwd.dq_row_stride = dq->strides[0];
  bwd.dq_head_stride = dq->strides[1];
  bwd.dk = dk->data;
  bwd.dk_row_stride = dk->strides[0];
  bwd.dk_head_stride = dk->strides[1];
  bwd.dv = dv->data;
  bwd.dv_row_stride = dv->strides[0];
  bwd.dv_head_stride = dv->strides[1];
  bwd.dropout_p = params.dropout_p;
  bwd.dropout_seed = params.dropout_seed;
  bwd.dropout_offset = params.dropout_offset;
  check_dsinks(kVarlenFn, dsinks, params, a.heads_q, inputs, grads, grad_x, &bwd);
  result.bwd.isa = result.forward.isa;
  return result;
}

}  // namespace anyattn::api
