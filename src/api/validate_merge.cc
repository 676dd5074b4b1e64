#include "api/validate_merge.h"

#include "api/args_layout.h"
#include "api/call_check.h"
#include "api/entry_tables.h"
#include "api/errors.h"

namespace anyattn::api {

cpu::MergeArgs validate_merge(const anyattn_tensor* out_a, const anyattn_tensor* lse_a,
                              const anyattn_tensor* out_b, const anyattn_tensor* lse_b,
                              const anyattn_tensor* out, const anyattn_tensor* lse_out) {
  CallCheck check("anyattn_merge_attention_states");
  // out_a's rank chooses the layout.
  require_descriptor(check.function(), "out_a", out_a);
  const bool batched = out_a->ndim == 4;
  if (out_a->ndim != 3 && !batched) {
    fail_invalid(check.function(), ": out_a.ndim is ", out_a->ndim,
                 "; expected 3 (T, H, Dv) or 4 (B, S, H, Dv)");
  }
  const anyattn_tensor* const tensors[] = {out_a, lse_a, out_b, lse_b, out, lse_out};
  check.check(batched ? tables::kMergeBatched : tables::kMergeTokens, tensors);

  cpu::MergeArgs m;
  m.dtype = static_cast<cpu::DType>(out_a->dtype);
  m.outer = batched ? check[Dim::kB] : 1;
  m.tokens = check[batched ? Dim::kMergeS : Dim::kMergeT];
  m.heads = check[Dim::kMergeH];
  m.head_dim = check[Dim::kMergeDv];
  // Outputs are (outer, token, head), lse (outer, head, token).
  read_strides(out_a, batched, &m.out_a, &m.a_outer_stride, &m.a_token_stride, &m.a_head_stride);
  read_strides(out_b, batched, &m.out_b, &m.b_outer_stride, &m.b_token_stride, &m.b_head_stride);
  read_strides(out, batched, &m.out, &m.o_outer_stride, &m.o_token_stride, &m.o_head_stride);
  read_strides(lse_a, batched, &m.lse_a, &m.la_outer_stride, &m.la_head_stride,
               &m.la_token_stride);
  read_strides(lse_b, batched, &m.lse_b, &m.lb_outer_stride, &m.lb_head_stride,
               &m.lb_token_stride);
  if (lse_out != nullptr) {
    read_strides(lse_out, batched, &m.lse_out, &m.lo_outer_stride, &m.lo_head_stride,
                 &m.lo_token_stride);
  }
  return m;
}

}  // namespace anyattn::api
