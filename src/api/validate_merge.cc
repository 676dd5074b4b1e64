#include "api/validate_merge.h"

#include <cstring>

#include "api/errors.h"
#include "api/tensor_checks.h"

namespace anyattn::api {
namespace {

constexpr const char* kFn = "anyattn_merge_attention_states";

bool same_view(const anyattn_tensor* a, const anyattn_tensor* b) {
  if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d])) {
      return false;
    }
  }
  return true;
}

// Output strides as (outer, token, head); lse strides as (outer, head, token).
void output_strides(const anyattn_tensor* t, int64_t* outer, int64_t* token, int64_t* head) {
  const bool batched = t->ndim == 4;
  *outer = batched ? t->strides[0] : 0;
  *token = t->strides[batched ? 1 : 0];
  *head = t->strides[batched ? 2 : 1];
}
void lse_strides(const anyattn_tensor* t, int64_t* outer, int64_t* head, int64_t* token) {
  const bool batched = t->ndim == 3;
  *outer = batched ? t->strides[0] : 0;
  *head = t->strides[batched ? 1 : 0];
  *token = t->strides[batched ? 2 : 1];
}

}  // namespace

cpu::MergeArgs validate_merge(const anyattn_tensor* out_a, const anyattn_tensor* lse_a,
                              const anyattn_tensor* out_b, const anyattn_tensor* lse_b,
                              const anyattn_tensor* out, const anyattn_tensor* lse_out) {
  if (out_a == nullptr) fail_invalid(kFn, ": out_a is NULL; a tensor descriptor is required");
  const int ndim = out_a->ndim;
  if (ndim != 3 && ndim != 4) {
    fail_invalid(kFn, ": out_a.ndim is ", ndim, "; expected 3 (T, H, Dv) or 4 (B, S, H, Dv)");
  }
  const char* out_dims = ndim == 3 ? "(T, H, Dv)" : "(B, S, H, Dv)";
  const char* lse_dims = ndim == 3 ? "(H, T)" : "(B, H, S)";
  const std::initializer_list<int32_t> float_types = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16,
                                                      ANYATTN_DTYPE_BF16};
  const TensorExtent ea = check_tensor(kFn, "out_a", out_a, ndim, out_dims, float_types);
  const TensorExtent eb = check_tensor(kFn, "out_b", out_b, ndim, out_dims, float_types);
  const TensorExtent eo = check_tensor(kFn, "out", out, ndim, out_dims, float_types);
  const TensorExtent ela =
      check_tensor(kFn, "lse_a", lse_a, ndim - 1, lse_dims, {ANYATTN_DTYPE_F32});
  const TensorExtent elb =
      check_tensor(kFn, "lse_b", lse_b, ndim - 1, lse_dims, {ANYATTN_DTYPE_F32});
  for (const auto& [name, t] : {std::pair{"out_b", out_b}, std::pair{"out", out}}) {
    if (t->dtype != out_a->dtype) {
      fail_invalid(kFn, ": ", name, ".dtype is ", dtype_name(t->dtype), " but out_a.dtype is ",
                   dtype_name(out_a->dtype), "; the outputs must share one dtype");
    }
    for (int d = 0; d < ndim; ++d) {
      if (t->shape[d] != out_a->shape[d]) {
        fail_invalid(kFn, ": ", name, ".shape[", d, "] is ", t->shape[d], " but out_a.shape[", d,
                     "] is ", out_a->shape[d], "; the outputs must have one shape");
      }
    }
  }
  cpu::MergeArgs m;
  m.dtype = static_cast<cpu::DType>(out_a->dtype);
  m.outer = ndim == 4 ? out_a->shape[0] : 1;
  m.tokens = out_a->shape[ndim - 3];
  m.heads = out_a->shape[ndim - 2];
  m.head_dim = out_a->shape[ndim - 1];
  if (m.head_dim > 256) {
    fail_unsupported(kFn, ": the head dim (last dimension) is ", m.head_dim,
                     "; supported: up to 256");
  }
  for (const auto& [name, t] :
       {std::pair{"lse_a", lse_a}, std::pair{"lse_b", lse_b}, std::pair{"lse_out", lse_out}}) {
    if (t == nullptr) continue;
    const bool ok =
        ndim == 3 ? (t->shape[0] == m.heads && t->shape[1] == m.tokens)
                  : (t->shape[0] == m.outer && t->shape[1] == m.heads && t->shape[2] == m.tokens);
    if (!ok) {
      fail_invalid(kFn, ": ", name, " must have shape ", lse_dims, " matching the outputs (",
                   ndim == 4 ? "B = " : "", ndim == 4 ? std::to_string(m.outer) + ", " : "",
                   "H = ", m.heads, ", ", ndim == 3 ? "T" : "S", " = ", m.tokens, ")");
    }
  }
  check_no_self_overlap(kFn, "out", out);
  if (!same_view(out, out_a)) check_disjoint(kFn, "out", eo, "out_a", ea);
  if (!same_view(out, out_b)) check_disjoint(kFn, "out", eo, "out_b", eb);
  check_disjoint(kFn, "out", eo, "lse_a", ela);
  check_disjoint(kFn, "out", eo, "lse_b", elb);
  if (lse_out != nullptr) {
    const TensorExtent elo =
        check_tensor(kFn, "lse_out", lse_out, ndim - 1, lse_dims, {ANYATTN_DTYPE_F32});
    check_no_self_overlap(kFn, "lse_out", lse_out);
    if (!same_view(lse_out, lse_a)) check_disjoint(kFn, "lse_out", elo, "lse_a", ela);
    if (!same_view(lse_out, lse_b)) check_disjoint(kFn, "lse_out", elo, "lse_b", elb);
    check_disjoint(kFn, "lse_out", elo, "out_a", ea);
    check_disjoint(kFn, "lse_out", elo, "out_b", eb);
    check_disjoint(kFn, "lse_out", elo, "out", eo);
    m.lse_out = static_cast<float*>(lse_out->data);
    lse_strides(lse_out, &m.lo_outer_stride, &m.lo_head_stride, &m.lo_token_stride);
  }
  m.out_a = out_a->data;
  output_strides(out_a, &m.a_outer_stride, &m.a_token_stride, &m.a_head_stride);
  m.out_b = out_b->data;
  output_strides(out_b, &m.b_outer_stride, &m.b_token_stride, &m.b_head_stride);
  m.out = out->data;
  output_strides(out, &m.o_outer_stride, &m.o_token_stride, &m.o_head_stride);
  m.lse_a = static_cast<const float*>(lse_a->data);
  lse_strides(lse_a, &m.la_outer_stride, &m.la_head_stride, &m.la_token_stride);
  m.lse_b = static_cast<const float*>(lse_b->data);
  lse_strides(lse_b, &m.lb_outer_stride, &m.lb_head_stride, &m.lb_token_stride);
  return m;
}

}  // namespace anyattn::api
