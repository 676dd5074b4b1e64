// The C ABI entry points (include/anyattn/anyattn.h). Each one validates its arguments through
// the api/ layer and converts every C++ exception into a status code: nothing throws across this
// boundary.
#include <cstring>

#include "anyattn/anyattn.h"
#include "api/attention_options.h"
#include "api/errors.h"
#include "api/tensor_checks.h"
#include "api/validate_bwd.h"
#include "api/validate_fwd.h"
#include "api/validate_kvcache.h"
#include "api/validate_merge.h"
#include "api/validate_varlen.h"
#include "cpu/backward/bwd_driver.h"
#include "cpu/forward/fwd_driver.h"
#include "cpu/kernel_registry.h"
#include "cpu/ops/kvcache_append.h"
#include "cpu/ops/merge_states.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

using anyattn::api::guarded_call;

extern "C" {

int anyattn_version(void) {
  return ANYATTN_VERSION;
}

const char* anyattn_version_string(void) {
#define ANYATTN_STRINGIFY2(x) #x
#define ANYATTN_STRINGIFY(x) ANYATTN_STRINGIFY2(x)
  return ANYATTN_STRINGIFY(ANYATTN_VERSION_MAJOR) "." ANYATTN_STRINGIFY(
      ANYATTN_VERSION_MINOR) "." ANYATTN_STRINGIFY(ANYATTN_VERSION_PATCH);
#undef ANYATTN_STRINGIFY
#undef ANYATTN_STRINGIFY2
}

const char* anyattn_last_error(void) {
  return anyattn::api::last_error();
}

const char* anyattn_status_name(anyattn_status status) {
  switch (status) {
    case ANYATTN_OK:
      return "ANYATTN_OK";
    case ANYATTN_E_INVALID_ARGUMENT:
      return "ANYATTN_E_INVALID_ARGUMENT";
    case ANYATTN_E_UNSUPPORTED:
      return "ANYATTN_E_UNSUPPORTED";
    case ANYATTN_E_OUT_OF_MEMORY:
      return "ANYATTN_E_OUT_OF_MEMORY";
    case ANYATTN_E_INTERNAL:
      return "ANYATTN_E_INTERNAL";
  }
  return "ANYATTN_E_UNKNOWN";
}

anyattn_status anyattn_tensor_init_contiguous(anyattn_tensor* t, void* data, anyattn_dtype dtype,
                                              int32_t ndim, const int64_t* shape) {
  return guarded_call("anyattn_tensor_init_contiguous", [&] {
    using anyattn::api::fail_invalid;
    constexpr const char* kFn = "anyattn_tensor_init_contiguous";
    if (t == nullptr) fail_invalid(kFn, ": t is NULL");
    if (shape == nullptr) fail_invalid(kFn, ": shape is NULL");
    if (ndim < 1 || ndim > ANYATTN_MAX_NDIM) {
      fail_invalid(kFn, ": ndim is ", ndim, "; supported: 1..", ANYATTN_MAX_NDIM);
    }
    if (anyattn::api::dtype_size(dtype) == 0) {
      fail_invalid(kFn, ": dtype is ", static_cast<int>(dtype), "; supported: f32, f16, bf16, i32");
    }
    anyattn_tensor result;
    std::memset(&result, 0, sizeof(result));
    result.data = data;
    result.dtype = dtype;
    result.ndim = ndim;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] < 0) fail_invalid(kFn, ": shape[", d, "] is ", shape[d], "; must be >= 0");
      result.shape[d] = shape[d];
      result.strides[d] = stride;
      if (shape[d] > 0 && __builtin_mul_overflow(stride, shape[d], &stride)) {
        fail_invalid(kFn, ": the shape has more elements than int64 can count");
      }
    }
    *t = result;
  });
}

int anyattn_isa_supported(anyattn_isa isa) {
  return isa != ANYATTN_ISA_AUTO && anyattn::cpu::find_fwd_kernel(isa) != nullptr ? 1 : 0;
}

anyattn_isa anyattn_isa_default(void) {
  try {
    return anyattn::api::resolve_isa("anyattn_isa_default", ANYATTN_ISA_AUTO);
  } catch (...) {  // ANYATTN_ISA names an unknown or unrunnable path: anyattn_fwd will say so
    return anyattn::cpu::best_supported_isa();
  }
}

const char* anyattn_isa_name(anyattn_isa isa) { return anyattn::cpu::isa_name(isa); }

int64_t anyattn_dtype_size(int32_t dtype) { return anyattn::api::dtype_size(dtype); }

int anyattn_fwd_kernel_count(void) {
  return static_cast<int>(anyattn::cpu::fwd_kernels_end() - anyattn::cpu::fwd_kernels_begin());
}

anyattn_status anyattn_fwd_kernel_info(int index, anyattn_kernel_info* info) {
  return guarded_call("anyattn_fwd_kernel_info", [&] {
    constexpr const char* kFn = "anyattn_fwd_kernel_info";
    if (info == nullptr) anyattn::api::fail_invalid(kFn, ": info is NULL");
    const int count = anyattn_fwd_kernel_count();
    if (index < 0 || index >= count) {
      anyattn::api::fail_invalid(kFn, ": index is ", index, "; supported: 0..", count - 1);
    }
    const anyattn::cpu::FwdKernel& kernel = anyattn::cpu::fwd_kernels_begin()[index];
    info->name = kernel.name;
    info->isa = kernel.isa;
    info->supported = kernel.cpu_supports() ? 1 : 0;
    info->vector_lanes = kernel.vector_lanes;
    info->tile_rows = kernel.tile_rows;
    info->tile_keys = kernel.tile_keys;
  });
}

void anyattn_set_num_threads(int n) {
  anyattn::runtime::set_num_threads(n);
}

int anyattn_get_num_threads(void) {
  return anyattn::runtime::get_num_threads();
}

void anyattn_set_host_parallel(anyattn_host_parallel_fn parallel) {
  anyattn::runtime::set_host_parallel(parallel);
}

void anyattn_fwd_params_init(anyattn_fwd_params* params) {
  if (params == nullptr) return;
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  params->softmax_scale = 0.f;
  params->softcap = 0.f;
  params->causal = 0;
  params->window_left = -1;
  params->window_right = -1;
  params->alibi_slopes = nullptr;
  params->sinks = nullptr;
  params->dropout_p = 0.f;
  params->num_splits = 0;
  params->isa = ANYATTN_ISA_AUTO;
  params->bwd_own_forward = 0;
  params->precision = ANYATTN_PRECISION_DEFAULT;
}

anyattn_status anyattn_fwd(const anyattn_tensor* q, const anyattn_tensor* k,
                           const anyattn_tensor* v, const anyattn_tensor* out,
                           const anyattn_tensor* lse, const anyattn_fwd_params* params) {
  return guarded_call("anyattn_fwd", [&] {
    const anyattn::api::ValidatedFwd call = anyattn::api::validate_fwd({q, k, v, out, lse}, params);
    anyattn::cpu::run_fwd(call.args, call.isa);
  });
}

anyattn_status anyattn_fwd_varlen(const anyattn_tensor* q, const anyattn_tensor* k,
                                  const anyattn_tensor* v, const anyattn_tensor* out,
                                  const anyattn_tensor* lse, const anyattn_tensor* cu_seqlens_q,
                                  const anyattn_tensor* cu_seqlens_k,
                                  const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, const anyattn_fwd_params* params) {
  return guarded_call("anyattn_fwd_varlen", [&] {
    const anyattn::api::ValidatedFwd call =
        anyattn::api::validate_fwd_varlen({q, k, v, out, lse},
                                          {cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                           max_seqlen_k},
                                          params);
    anyattn::cpu::run_fwd(call.args, call.isa);
  });
}

void anyattn_kvcache_params_init(anyattn_kvcache_params* cache) {
  if (cache == nullptr) return;
  std::memset(cache, 0, sizeof(*cache));
  cache->struct_size = sizeof(*cache);
  cache->cache_seqlen = -1;
}

anyattn_status anyattn_fwd_kvcache(const anyattn_tensor* q, const anyattn_tensor* k_cache,
                                   const anyattn_tensor* v_cache, const anyattn_tensor* out,
                                   const anyattn_tensor* lse, const anyattn_kvcache_params* cache,
                                   const anyattn_fwd_params* params) {
  return guarded_call("anyattn_fwd_kvcache", [&] {
    const anyattn::api::ValidatedKvcache call =
        anyattn::api::validate_fwd_kvcache({q, k_cache, v_cache, out, lse}, cache, params);
    anyattn::cpu::append_to_cache(call.attention.args, call.append, call.cache_seqlens);
    anyattn::cpu::run_fwd(call.attention.args, call.attention.isa);
  });
}

anyattn_status anyattn_fwd_kvcache_varlen(const anyattn_tensor* q, const anyattn_tensor* k_cache,
                                          const anyattn_tensor* v_cache, const anyattn_tensor* out,
                                          const anyattn_tensor* lse,
                                          const anyattn_tensor* cu_seqlens_q, int64_t max_seqlen_q,
                                          const anyattn_kvcache_params* cache,
                                          const anyattn_fwd_params* params) {
  return guarded_call("anyattn_fwd_kvcache_varlen", [&] {
    const anyattn::api::ValidatedFwd call = anyattn::api::validate_fwd_kvcache_varlen(
        {q, k_cache, v_cache, out, lse}, cu_seqlens_q, max_seqlen_q, cache, params);
    anyattn::cpu::run_fwd(call.args, call.isa);
  });
}

anyattn_status anyattn_merge_attention_states(
    const anyattn_tensor* out_a, const anyattn_tensor* lse_a, const anyattn_tensor* out_b,
    const anyattn_tensor* lse_b, const anyattn_tensor* out, const anyattn_tensor* lse_out) {
  return guarded_call("anyattn_merge_attention_states", [&] {
    anyattn::cpu::merge_states(
        anyattn::api::validate_merge(out_a, lse_a, out_b, lse_b, out, lse_out));
  });
}

// ---- Backward (docs/backward.md) ----------------------------------------------------------------

anyattn_status anyattn_bwd(const anyattn_tensor* dout, const anyattn_tensor* q,
                           const anyattn_tensor* k, const anyattn_tensor* v,
                           const anyattn_tensor* out, const anyattn_tensor* lse,
                           const anyattn_tensor* dq, const anyattn_tensor* dk,
                           const anyattn_tensor* dv, const anyattn_tensor* dsinks_or_null,
                           const anyattn_fwd_params* params) {
  return guarded_call("anyattn_bwd", [&] {
    const anyattn::api::ValidatedBwd call =
        anyattn::api::validate_bwd({q, k, v, out, lse}, {dout, dq, dk, dv, dsinks_or_null}, params);
    anyattn::cpu::run_bwd(call.args, call.isa);
  });
}

anyattn_status anyattn_bwd_varlen(const anyattn_tensor* dout, const anyattn_tensor* q,
                                  const anyattn_tensor* k, const anyattn_tensor* v,
                                  const anyattn_tensor* out, const anyattn_tensor* lse,
                                  const anyattn_tensor* dq, const anyattn_tensor* dk,
                                  const anyattn_tensor* dv, const anyattn_tensor* dsinks_or_null,
                                  const anyattn_tensor* cu_seqlens_q,
                                  const anyattn_tensor* cu_seqlens_k,
                                  const anyattn_tensor* seqused_k_or_null, int64_t max_seqlen_q,
                                  int64_t max_seqlen_k, const anyattn_fwd_params* params) {
  return guarded_call("anyattn_bwd_varlen", [&] {
    const anyattn::api::ValidatedBwdVarlen call = anyattn::api::validate_bwd_varlen(
        {q, k, v, out, lse}, {dout, dq, dk, dv, dsinks_or_null},
        {cu_seqlens_q, cu_seqlens_k, seqused_k_or_null, max_seqlen_q, max_seqlen_k}, params);
    anyattn::cpu::run_bwd(call.bwd.args, call.bwd.isa);
  });
}

}  // extern "C"
