#include "api/attention_options.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "api/errors.h"
#include "api/tensor_checks.h"
#include "common/philox.h"
#include "cpu/kernel_registry.h"

namespace anyattn::api {
namespace {

// Copies a versioned params struct: `given` (or `defaults` when null) up to its struct_size, the
// rest from `defaults`. `name` and `init` name the parameter and its init function in the error.
template <class Params>
Params read_versioned(const char* function, const char* name, const char* init,
                      const Params* given, Params defaults) {
  if (given == nullptr) return defaults;
  if (given->struct_size < sizeof(size_t)) {
    fail_invalid(function, ": ", name, "->struct_size is ", given->struct_size, "; initialise ",
                 name, " with ", init, "()");
  }
  const size_t copy = given->struct_size < sizeof(Params) ? given->struct_size : sizeof(Params);
  std::memcpy(static_cast<void*>(&defaults), given, copy);
  defaults.struct_size = sizeof(Params);
  return defaults;
}

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
  anyattn_fwd_params defaults;
  anyattn_fwd_params_init(&defaults);
  return read_versioned(function, "params", "anyattn_fwd_params_init", params, defaults);
}

anyattn_kvcache_params read_cache_params(const char* function,
                                         const anyattn_kvcache_params* cache) {
  anyattn_kvcache_params defaults;
  anyattn_kvcache_params_init(&defaults);
  return read_versioned(function, "cache", "anyattn_kvcache_params_init", cache, defaults);
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

namespace {

// params->precision with ANYATTN_PRECISION_DEFAULT resolved (through the ANYATTN_PRECISION
// environment variable).
anyattn_precision resolve_precision(const char* function, int32_t requested) {
  if (requested < ANYATTN_PRECISION_DEFAULT || requested > ANYATTN_PRECISION_FAST) {
    fail_invalid(function, ": params->precision is ", requested,
                 "; supported: 0 (ANYATTN_PRECISION_DEFAULT), 1 (ANYATTN_PRECISION_ACCURATE), "
                 "2 (ANYATTN_PRECISION_FAST)");
  }
  if (requested != ANYATTN_PRECISION_DEFAULT) return static_cast<anyattn_precision>(requested);
  const char* named = std::getenv("ANYATTN_PRECISION");
  if (named == nullptr || *named == '\0' || std::strcmp(named, "accurate") == 0) {
    return ANYATTN_PRECISION_ACCURATE;
  }
  if (std::strcmp(named, "fast") == 0) return ANYATTN_PRECISION_FAST;
  fail_invalid(function, ": environment variable ANYATTN_PRECISION is \"", named,
               "\"; supported: \"accurate\", \"fast\" (or unset)");
}

}  // namespace

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
  args->bf16_probabilities =
      resolve_precision(function, params.precision) == ANYATTN_PRECISION_FAST &&
      args->dtype == cpu::DType::kBF16;
}

}  // namespace anyattn::api
