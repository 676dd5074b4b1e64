#include "api/validate_varlen.h"

#include <vector>

#include "api/args_layout.h"
#include "api/attention_options.h"
#include "api/entry_tables.h"
#include "api/errors.h"
#include "api/tensor_checks.h"

namespace anyattn::api {
namespace {

// seqused_k (B): the keys each sequence uses, at most its keys by cu_seqlens_k.
std::vector<int32_t> read_seqused_k(const char* function, const anyattn_tensor* seqused_k,
                                    const std::vector<int32_t>& cu_seqlens_k) {
  const int64_t batch = static_cast<int64_t>(cu_seqlens_k.size()) - 1;
  std::vector<int32_t> used = read_int32_vector(function, "seqused_k", seqused_k, batch);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t available = static_cast<int64_t>(cu_seqlens_k[b + 1]) - cu_seqlens_k[b];
    if (used[b] < 0 || used[b] > available) {
      fail_invalid(function, ": seqused_k[", b, "] is ", used[b], "; must be in [0, ", available,
                   "] (the keys of sequence ", b, " by cu_seqlens_k)");
    }
  }
  return used;
}

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

int64_t check_max_seqlen(const char* function, const char* name, int64_t value) {
  if (value < 0 || value > kMaxExtent) {
    fail_invalid(function, ": ", name, " is ", value, "; supported: 0..", kMaxExtent);
  }
  return value;
}

ValidatedFwd check_varlen_attention(CallCheck* call, const TensorTable& table,
                                    const AttentionTensors& t, const VarlenLengths& lengths,
                                    const anyattn_fwd_params& params) {
  const char* fn = call->function();
  const anyattn_tensor* const in_table_order[] = {t.q, t.k, t.v, t.out, t.lse};
  call->check(table, in_table_order);
  ValidatedFwd result;
  cpu::FwdArgs& a = result.args;
  a.seqlen_q = check_max_seqlen(fn, "max_seqlen_q", lengths.max_seqlen_q);
  a.seqlen_k = check_max_seqlen(fn, "max_seqlen_k", lengths.max_seqlen_k);
  a.batch = read_varlen_batch(fn, lengths.cu_seqlens_q);
  result.cu_seqlens_q = read_cu_seqlens(fn, "cu_seqlens_q", lengths.cu_seqlens_q, a.batch,
                                        (*call)[Dim::kTotalQ], "total_q", a.seqlen_q,
                                        "max_seqlen_q");
  if (lengths.cu_seqlens_k == nullptr) {
    fail_invalid(fn, ": cu_seqlens_k is NULL; it is required");
  }
  result.cu_seqlens_k = read_cu_seqlens(fn, "cu_seqlens_k", lengths.cu_seqlens_k, a.batch,
                                        (*call)[Dim::kTotalK], "total_k", a.seqlen_k,
                                        "max_seqlen_k");
  if (lengths.seqused_k != nullptr) {
    result.seqlens_k = read_seqused_k(fn, lengths.seqused_k, result.cu_seqlens_k);
  }
  fill_packed_layout(t.q, t.k, t.v, t.out, &a);
  fill_lse_layout(t.lse, /*packed=*/true, &a);
  apply_attention_options(fn, params, &a);
  a.cu_seqlens_q = result.cu_seqlens_q.data();
  a.cu_seqlens_k = result.cu_seqlens_k.data();
  a.seqlens_k = result.seqlens_k.empty() ? nullptr : result.seqlens_k.data();
  return result;
}

ValidatedFwd validate_fwd_varlen(const AttentionTensors& tensors, const VarlenLengths& lengths,
                                 const anyattn_fwd_params* params_in) {
  CallCheck call("anyattn_fwd_varlen");
  const anyattn_fwd_params params = read_fwd_params(call.function(), params_in);
  ValidatedFwd result =
      check_varlen_attention(&call, tables::kFwdVarlen, tensors, lengths, params);
  result.isa = resolve_isa(call.function(), params.isa);
  return result;
}

}  // namespace anyattn::api
