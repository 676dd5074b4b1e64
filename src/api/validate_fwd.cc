#include "api/validate_fwd.h"

#include "api/args_layout.h"
#include "api/attention_options.h"
#include "api/entry_tables.h"
#include "cpu/forward/finalize.h"

namespace anyattn::api {

static_assert(cpu::kMaxStagedColumns >= kMaxHeadDimV, "an output row must fit the staging row");

cpu::FwdArgs check_dense_attention(CallCheck* call, const TensorTable& table,
                                   const AttentionTensors& t, const anyattn_fwd_params& params) {
  const anyattn_tensor* const in_table_order[] = {t.q, t.k, t.v, t.out, t.lse};
  call->check(table, in_table_order);
  cpu::FwdArgs args;
  fill_dense_layout(t.q, t.k, t.v, t.out, &args);
  fill_lse_layout(t.lse, /*packed=*/false, &args);
  apply_attention_options(call->function(), params, &args);
  return args;
}

ValidatedFwd validate_fwd(const AttentionTensors& tensors, const anyattn_fwd_params* params_in) {
  CallCheck call("anyattn_fwd");
  const anyattn_fwd_params params = read_fwd_params(call.function(), params_in);
  ValidatedFwd result;
  result.args = check_dense_attention(&call, tables::kFwd, tensors, params);
  result.isa = resolve_isa(call.function(), params.isa);
  return result;
}

}  // namespace anyattn::api
