#include "api/validate_fwd.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "api/args_layout.h"
#include "api/errors.h"
#include "api/tensor_checks.h"
#include "cpu/forward/finalize.h"
#include "cpu/kernel_registry.h"

namespace anyattn::api {

static_assert(cpu::kMaxStagedColumns >= kMaxHeadDim, "an output row must fit the staging row");

namespace {

constexpr const char* kFn = "anyattn_fwd";

// Converts a window bound (-1 = unbounded) to the kernels' representation.
int64_t window_bound(int64_t value) {
  return value < 0 || value >= cpu::kUnboundedWindow ? cpu::kUnboundedWindow : value;
}

// Validates an optional f32 per-head tensor (ALiBi slopes or sinks). Returns its element pointer.
const float* check_per_head_tensor(const char* function, const char* name, const anyattn_tensor* t,
                                   int64_t batch, int64_t heads_q, bool allow_batch,
                                   int64_t* batch_stride, int64_t* head_stride) {
  if (t->ndim == 2 && allow_batch) {
    check_tensor(function, name, t, 2, "(B, Hq)", {ANYATTN_DTYPE_F32});
    if (t->shape[0] != batch || t->shape[1] != heads_q) {
      fail_invalid(function, ": ", name, ".shape is (", t->shape[0], ", ", t->shape[1],
                   "); expected (", heads_q, ") or (B, Hq) = (", batch, ", ", heads_q, ")");
    }
    *batch_stride = t->strides[0];
    *head_stride = t->shape[1] > 1 ? t->strides[1] : 1;
  } else {
    check_tensor(function, name, t, 1, allow_batch ? "(Hq) or 2 (B, Hq)" : "(Hq)",
                 {ANYATTN_DTYPE_F32});
    if (t->shape[0] != heads_q) {
      fail_invalid(function, ": ", name, ".shape[0] is ", t->shape[0], "; expected Hq = ", heads_q);
    }
    *batch_stride = 0;
    *head_stride = t->shape[0] > 1 ? t->strides[0] : 1;
  }
  return static_cast<const float*>(t->data);
}

}  // namespace

anyattn_fwd_params read_fwd_params(const char* function, const anyattn_fwd_params* params) {
  anyattn_fwd_params result;
  anyattn_fwd_params_init(&result);
  if (params == nullptr) return result;
  if (params->struct_size < sizeof(size_t)) {
    fail_invalid(function, ": params->struct_size is ", params->struct_size,
                 "; initialise params with anyattn_fwd_params_init()");
  }
  const size_t copy = params->struct_size < sizeof(result) ? params->struct_size : sizeof(result);
  std::memcpy(static_cast<void*>(&result), params, copy);
  result.struct_size = sizeof(result);
  return result;
}

anyattn_isa resolve_isa(const char* function, int32_t requested) {
  if (!cpu::is_isa_value(requested)) {
    fail_invalid(function, ": params->isa is ", requested, "; supported: ", cpu::isa_value_list());
  }
  anyattn_isa isa = static_cast<anyattn_isa>(requested);
  if (isa == ANYATTN_ISA_AUTO) {
    const char* forced = std::getenv("ANYATTN_ISA");
    if (forced == nullptr || *forced == '\0' || std::strcmp(forced, "auto") == 0) {
      return cpu::best_supported_isa();
    }
    isa = cpu::isa_from_name(forced);
    if (isa == ANYATTN_ISA_AUTO) {
      fail_invalid(function, ": environment variable ANYATTN_ISA is \"", forced,
                   "\"; supported: ", cpu::isa_name_list());
    }
  }
  if (cpu::find_fwd_kernel(isa) == nullptr) {
    fail_unsupported(function, ": ISA path ", anyattn_isa_name(isa),
                     " is not available (not compiled in, or this CPU lacks the instructions); "
                     "available: ",
                     cpu::supported_isa_list());
  }
  return isa;
}

void apply_attention_options(const char* function, const anyattn_fwd_params& params,
                             cpu::FwdArgs* args) {
  if (!std::isfinite(params.softmax_scale)) {
    fail_invalid(function, ": params->softmax_scale is ", params.softmax_scale,
                 "; must be finite (0 selects the default 1/sqrt(D))");
  }
  // With D = 0 every score is 0 whatever the scale: the default is then 1, not 1/sqrt(0).
  args->softmax_scale =
      params.softmax_scale != 0.f ? params.softmax_scale
      : args->head_dim == 0
          ? 1.f
          : static_cast<float>(1.0 / std::sqrt(static_cast<double>(args->head_dim)));
  if (!(params.softcap >= 0.f) || !std::isfinite(params.softcap)) {
    fail_invalid(function, ": params->softcap is ", params.softcap,
                 "; must be finite and >= 0 (0 disables it)");
  }
  args->softcap = params.softcap;
  if (params.window_left < -1) {
    fail_invalid(function, ": params->window_left is ", params.window_left,
                 "; must be >= -1 (-1 = unbounded)");
  }
  if (params.window_right < -1) {
    fail_invalid(function, ": params->window_right is ", params.window_right,
                 "; must be >= -1 (-1 = unbounded)");
  }
  args->window_left = window_bound(params.window_left);
  args->window_right = params.causal ? 0 : window_bound(params.window_right);

  if (params.alibi_slopes != nullptr) {
    args->alibi_slopes = check_per_head_tensor(
        function, "params->alibi_slopes", params.alibi_slopes, args->batch, args->heads_q, true,
        &args->alibi_batch_stride, &args->alibi_head_stride);
  }
  if (params.sinks != nullptr) {
    int64_t unused_batch_stride = 0;
    args->sinks =
        check_per_head_tensor(function, "params->sinks", params.sinks, args->batch, args->heads_q,
                              false, &unused_batch_stride, &args->sinks_stride);
  }
  if (std::isnan(params.dropout_p) || params.dropout_p < 0.f || params.dropout_p >= 1.f) {
    fail_invalid(function, ": params->dropout_p is ", params.dropout_p, "; must be in [0, 1)");
  }
  if (params.dropout_p > 0.f) {
    args->dropout_threshold = cpu::dropout_threshold(params.dropout_p);
    args->dropout_key = cpu::dropout_key(params.dropout_seed, params.dropout_offset);
    args->dropout_scale = 1.f / (1.f - params.dropout_p);
  }
  if (params.num_splits < 0) {
    fail_invalid(function, ": params->num_splits is ", params.num_splits,
                 "; must be >= 0 (0 = automatic)");
  }
  args->num_splits = params.num_splits;
}

ValidatedFwd validate_fwd(const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
                          const anyattn_tensor* out, const anyattn_tensor* lse,
                          const anyattn_fwd_params* params_in) {
  const anyattn_fwd_params params = read_fwd_params(kFn, params_in);
  const std::initializer_list<int32_t> float_types = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16,
                                                      ANYATTN_DTYPE_BF16};
  const TensorExtent q_extent = check_tensor(kFn, "q", q, 4, "(B, Sq, Hq, D)", float_types);
  const TensorExtent k_extent = check_tensor(kFn, "k", k, 4, "(B, Sk, Hk, D)", float_types);
  const TensorExtent v_extent = check_tensor(kFn, "v", v, 4, "(B, Sk, Hk, Dv)", float_types);
  const TensorExtent out_extent = check_tensor(kFn, "out", out, 4, "(B, Sq, Hq, Dv)", float_types);
  for (const auto& [name, t] : {std::pair{"k", k}, std::pair{"v", v}, std::pair{"out", out}}) {
    if (t->dtype != q->dtype) {
      fail_invalid(kFn, ": ", name, ".dtype is ", dtype_name(t->dtype), " but q.dtype is ",
                   dtype_name(q->dtype), "; q, k, v and out must share one dtype");
    }
  }
  const int64_t batch = q->shape[0], seqlen_q = q->shape[1], heads_q = q->shape[2];
  const int64_t head_dim = q->shape[3];
  const int64_t seqlen_k = k->shape[1], heads_k = k->shape[2], head_dim_v = v->shape[3];

  check_head_dims(kFn, "q.shape[3]", head_dim, "v.shape[3]", head_dim_v);
  if (k->shape[0] != batch || v->shape[0] != batch || out->shape[0] != batch) {
    fail_invalid(kFn, ": batch sizes differ: q.shape[0] = ", batch, ", k.shape[0] = ", k->shape[0],
                 ", v.shape[0] = ", v->shape[0], ", out.shape[0] = ", out->shape[0]);
  }
  if (k->shape[3] != head_dim) {
    fail_invalid(kFn, ": k.shape[3] is ", k->shape[3], "; must equal q.shape[3] (D) = ", head_dim);
  }
  if (v->shape[1] != seqlen_k || v->shape[2] != heads_k) {
    fail_invalid(kFn, ": v.shape is (", v->shape[0], ", ", v->shape[1], ", ", v->shape[2], ", ",
                 v->shape[3], "); its Sk and Hk must match k's (", seqlen_k, ", ", heads_k, ")");
  }
  check_heads(kFn, "q.shape[2]", heads_q, "k.shape[2]", heads_k);
  if (out->shape[1] != seqlen_q || out->shape[2] != heads_q || out->shape[3] != head_dim_v) {
    fail_invalid(kFn, ": out.shape is (", out->shape[0], ", ", out->shape[1], ", ", out->shape[2],
                 ", ", out->shape[3], "); expected (B, Sq, Hq, Dv) = (", batch, ", ", seqlen_q,
                 ", ", heads_q, ", ", head_dim_v, ")");
  }
  check_extent(kFn, "B", batch);
  check_extent(kFn, "Sq", seqlen_q);
  check_extent(kFn, "Sk", seqlen_k);
  check_extent(kFn, "Hq", heads_q);

  check_no_self_overlap(kFn, "out", out);
  check_disjoint(kFn, "out", out_extent, "q", q_extent);
  check_disjoint(kFn, "out", out_extent, "k", k_extent);
  check_disjoint(kFn, "out", out_extent, "v", v_extent);

  ValidatedFwd result;
  cpu::FwdArgs& a = result.args;
  fill_dense_layout(q, k, v, out, &a);

  if (lse != nullptr) {
    const TensorExtent lse_extent =
        check_tensor(kFn, "lse", lse, 3, "(B, Hq, Sq)", {ANYATTN_DTYPE_F32});
    if (lse->shape[0] != batch || lse->shape[1] != heads_q || lse->shape[2] != seqlen_q) {
      fail_invalid(kFn, ": lse.shape is (", lse->shape[0], ", ", lse->shape[1], ", ", lse->shape[2],
                   "); expected (B, Hq, Sq) = (", batch, ", ", heads_q, ", ", seqlen_q, ")");
    }
    check_no_self_overlap(kFn, "lse", lse);
    check_disjoint(kFn, "lse", lse_extent, "q", q_extent);
    check_disjoint(kFn, "lse", lse_extent, "k", k_extent);
    check_disjoint(kFn, "lse", lse_extent, "v", v_extent);
    check_disjoint(kFn, "lse", lse_extent, "out", out_extent);
    fill_lse_layout(lse, false, &a);
  }

  apply_attention_options(kFn, params, &result.args);
  result.isa = resolve_isa(kFn, params.isa);
  return result;
}

}  // namespace anyattn::api
