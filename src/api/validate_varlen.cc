#include "api/validate_varlen.h"

#include <vector>

#include "api/args_layout.h"
#include "api/errors.h"
#include "api/tensor_checks.h"

namespace anyattn::api {
namespace {


}  // namespace

std::vector<int32_t> read_cu_seqlens(const char* function, const char* name,
                                     const anyattn_tensor* t, int64_t batch, int64_t total,
                                     const char* total_name, int64_t max_seqlen,
                                     const char* max_name) {
  std::vector<int32_t> cu = read_int32_vector(function, name, t, batch + 1);
  if (cu[0] < 0) fail_invalid(function, ": ", name, "[0] is ", cu[0], "; must be >= 0");
  // Order first: a decreasing entry is the root cause of any "length" error it would produce.
  for (int64_t b = 0; b < batch; ++b) {
    if (cu[b + 1] < cu[b]) {
      fail_invalid(function, ": ", name, " is not non-decreasing: ", name, "[", b, "] = ", cu[b],
                   " > ", name, "[", b + 1, "] = ", cu[b + 1]);
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = static_cast<int64_t>(cu[b + 1]) - cu[b];
    if (length > max_seqlen) {
      fail_invalid(function, ": sequence ", b, " has ", length, " rows by ", name, " but ",
                   max_name, " is ", max_seqlen, "; ", max_name, " must be at least every length");
    }
  }
  if (cu[batch] > total) {
    fail_invalid(function, ": ", name, "[", batch, "] is ", cu[batch], " but ", total_name, " is ",
                 total, "; the sequences must lie within the packed tensor");
  }
  return cu;
}

int64_t read_varlen_batch(const char* function, const anyattn_tensor* cu_seqlens_q) {
  if (cu_seqlens_q == nullptr) fail_invalid(function, ": cu_seqlens_q is NULL; it is required");
  if (cu_seqlens_q->ndim != 1 || cu_seqlens_q->shape[0] < 1) {
    fail_invalid(function, ": cu_seqlens_q must have shape (B + 1) with B >= 0; got ndim ",
                 cu_seqlens_q->ndim, cu_seqlens_q->ndim >= 1 ? ", shape[0] " : "",
                 cu_seqlens_q->ndim >= 1 ? cu_seqlens_q->shape[0] : 0);
  }
  const int64_t batch = cu_seqlens_q->shape[0] - 1;
  if (batch > kMaxExtent) {
    fail_unsupported(function, ": B is ", batch, "; supported: up to ", kMaxExtent);
  }
  return batch;
}

ValidatedFwd validate_fwd_varlen(const anyattn_tensor* q, const anyattn_tensor* k,
                                 const anyattn_tensor* v, const anyattn_tensor* out,
                                 const anyattn_tensor* lse, const anyattn_tensor* cu_seqlens_q,
                                 const anyattn_tensor* cu_seqlens_k,
                                 const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
                                 int64_t max_seqlen_k, const anyattn_fwd_params* params_in,
                                 const char* function) {
  const anyattn_fwd_params params = read_fwd_params(function, params_in);
  const std::initializer_list<int32_t> float_types = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16,
                                                      ANYATTN_DTYPE_BF16};
  const TensorExtent q_extent = check_tensor(function, "q", q, 3, "(total_q, Hq, D)", float_types);
  const TensorExtent k_extent = check_tensor(function, "k", k, 3, "(total_k, Hk, D)", float_types);
  const TensorExtent v_extent = check_tensor(function, "v", v, 3, "(total_k, Hk, Dv)", float_types);
  const TensorExtent out_extent =
      check_tensor(function, "out", out, 3, "(total_q, Hq, Dv)", float_types);
  for (const auto& [name, t] : {std::pair{"k", k}, std::pair{"v", v}, std::pair{"out", out}}) {
    if (t->dtype != q->dtype) {
      fail_invalid(function, ": ", name, ".dtype is ", dtype_name(t->dtype), " but q.dtype is ",
                   dtype_name(q->dtype), "; q, k, v and out must share one dtype");
    }
  }
  const int64_t total_q = q->shape[0], heads_q = q->shape[1], head_dim = q->shape[2];
  const int64_t total_k = k->shape[0], heads_k = k->shape[1], head_dim_v = v->shape[2];
  check_head_dims(function, "q.shape[2]", head_dim, "v.shape[2]", head_dim_v);
  if (k->shape[2] != head_dim) {
    fail_invalid(function, ": k.shape[2] is ", k->shape[2], "; must equal q.shape[2] (D) = ", head_dim);
  }
  if (v->shape[0] != total_k || v->shape[1] != heads_k) {
    fail_invalid(function, ": v.shape is (", v->shape[0], ", ", v->shape[1], ", ", v->shape[2],
                 "); its total_k and Hk must match k's (", total_k, ", ", heads_k, ")");
  }
  check_heads(function, "q.shape[1]", heads_q, "k.shape[1]", heads_k);
  if (out->shape[0] != total_q || out->shape[1] != heads_q || out->shape[2] != head_dim_v) {
    fail_invalid(function, ": out.shape is (", out->shape[0], ", ", out->shape[1], ", ", out->shape[2],
                 "); expected (total_q, Hq, Dv) = (", total_q, ", ", heads_q, ", ", head_dim_v,
                 ")");
  }
  if (max_seqlen_q < 0 || max_seqlen_q > kMaxExtent) {
    fail_invalid(function, ": max_seqlen_q is ", max_seqlen_q, "; supported: 0..", kMaxExtent);
  }
  if (max_seqlen_k < 0 || max_seqlen_k > kMaxExtent) {
    fail_invalid(function, ": max_seqlen_k is ", max_seqlen_k, "; supported: 0..", kMaxExtent);
  }
  const int64_t batch = read_varlen_batch(function, cu_seqlens_q);

  check_no_self_overlap(function, "out", out);
  check_disjoint(function, "out", out_extent, "q", q_extent);
  check_disjoint(function, "out", out_extent, "k", k_extent);
  check_disjoint(function, "out", out_extent, "v", v_extent);

  ValidatedFwd result;
  result.cu_seqlens_q = read_cu_seqlens(function, "cu_seqlens_q", cu_seqlens_q, batch, total_q,
                                        "total_q", max_seqlen_q, "max_seqlen_q");
  if (cu_seqlens_k == nullptr) fail_invalid(function, ": cu_seqlens_k is NULL; it is required");
  result.cu_seqlens_k = read_cu_seqlens(function, "cu_seqlens_k", cu_seqlens_k, batch, total_k,
                                        "total_k", max_seqlen_k, "max_seqlen_k");
  if (seqused_k != nullptr) {
    result.seqlens_k = read_int32_vector(function, "seqused_k", seqused_k, batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t available =
          static_cast<int64_t>(result.cu_seqlens_k[b + 1]) - result.cu_seqlens_k[b];
      if (result.seqlens_k[b] < 0 || result.seqlens_k[b] > available) {
        fail_invalid(function, ": seqused_k[", b, "] is ", result.seqlens_k[b], "; must be in [0, ",
                     available, "] (the keys of sequence ", b, " by cu_seqlens_k)");
      }
    }
  }

  cpu::FwdArgs& a = result.args;
  fill_packed_layout(q, k, v, out, &a);
  a.batch = batch;
  a.seqlen_q = max_seqlen_q;
  a.seqlen_k = max_seqlen_k;
  if (lse != nullptr) {
    const TensorExtent lse_extent =
        check_tensor(function, "lse", lse, 2, "(Hq, total_q)", {ANYATTN_DTYPE_F32});
    if (lse->shape[0] != heads_q || lse->shape[1] != total_q) {
      fail_invalid(function, ": lse.shape is (", lse->shape[0], ", ", lse->shape[1],
                   "); expected (Hq, total_q) = (", heads_q, ", ", total_q, ")");
    }
    check_no_self_overlap(function, "lse", lse);
    check_disjoint(function, "lse", lse_extent, "q", q_extent);
    check_disjoint(function, "lse", lse_extent, "k", k_extent);
    check_disjoint(function, "lse", lse_extent, "v", v_extent);
    check_disjoint(function, "lse", lse_extent, "out", out_extent);
    fill_lse_layout(lse, true, &a);
  }
  apply_attention_options(function, params, &a);
  result.isa = resolve_isa(function, params.isa);
  a.cu_seqlens_q = result.cu_seqlens_q.data();
  a.cu_seqlens_k = result.cu_seqlens_k.data();
  a.seqlens_k = result.seqlens_k.empty() ? nullptr : result.seqlens_k.data();
  return result;
}

}  // namespace anyattn::api
