#include "api/validate_bwd.h"

#include "api/args_layout.h"
#include "api/attention_options.h"
#include "api/entry_tables.h"
#include "api/errors.h"
#include "api/validate_fwd.h"
#include "api/validate_varlen.h"

namespace anyattn::api {
namespace {

// What the backward adds to its forward's checks, dense or packed: the gradients against
// `gradient_table`, the side inputs the gradients must not overlap, dropout, and dsinks.
void check_gradients(CallCheck* call, const TensorTable& gradient_table, bool batched,
                     const GradientTensors& g, const anyattn_fwd_params& params,
                     cpu::BwdArgs* bwd) {
  const char* fn = call->function();
  const anyattn_tensor* const in_table_order[] = {g.dout, g.dq, g.dk, g.dv};
  call->check(gradient_table, in_table_order);
  fill_gradient_layout(g.dout, g.dq, g.dk, g.dv, batched, bwd);
  // The side inputs are read while the gradients are written.
  if (params.alibi_slopes != nullptr) {
    call->add_side_input("params->alibi_slopes", params.alibi_slopes);
  }
  if (params.sinks != nullptr) call->add_side_input("params->sinks", params.sinks);
  bwd->dropout_p = params.dropout_p;
  bwd->dropout_seed = params.dropout_seed;
  bwd->dropout_offset = params.dropout_offset;
  bwd->own_forward = params.bwd_own_forward != 0;

  if (params.sinks != nullptr && g.dsinks == nullptr) {
    fail_invalid(fn,
                 ": dsinks is NULL but params->sinks is set; pass an f32 (Hq) tensor to "
                 "receive the sink gradient");
  }
  if (params.sinks == nullptr && g.dsinks != nullptr) {
    fail_invalid(fn,
                 ": dsinks is given but params->sinks is NULL; dsinks must be NULL without "
                 "sinks");
  }
  if (g.dsinks != nullptr) {
    const anyattn_tensor* const sink_gradient[] = {g.dsinks};
    call->check(tables::kDsinks, sink_gradient);
    bwd->dsinks = static_cast<float*>(g.dsinks->data);
    bwd->dsinks_stride = g.dsinks->shape[0] > 1 ? g.dsinks->strides[0] : 1;
  }
}

}  // namespace

ValidatedBwd validate_bwd(const AttentionTensors& forward, const GradientTensors& gradients,
                          const anyattn_fwd_params* params_in) {
  CallCheck call("anyattn_bwd");
  const anyattn_fwd_params params = read_fwd_params(call.function(), params_in);
  ValidatedBwd result;
  result.args.fwd = check_dense_attention(&call, tables::kBwdForward, forward, params);
  check_gradients(&call, tables::kBwdGradients, /*batched=*/true, gradients, params,
                  &result.args);
  result.isa = resolve_isa(call.function(), params.isa);
  return result;
}

ValidatedBwdVarlen validate_bwd_varlen(const AttentionTensors& forward,
                                       const GradientTensors& gradients,
                                       const VarlenLengths& lengths,
                                       const anyattn_fwd_params* params_in) {
  CallCheck call("anyattn_bwd_varlen");
  const anyattn_fwd_params params = read_fwd_params(call.function(), params_in);
  ValidatedBwdVarlen result;
  result.forward =
      check_varlen_attention(&call, tables::kBwdVarlenForward, forward, lengths, params);
  result.bwd.args.fwd = result.forward.args;
  check_gradients(&call, tables::kBwdVarlenGradients, /*batched=*/false, gradients, params,
                  &result.bwd.args);
  result.forward.isa = resolve_isa(call.function(), params.isa);
  result.bwd.isa = result.forward.isa;
  return result;
}

}  // namespace anyattn::api
