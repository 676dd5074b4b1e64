#include "api/validate_kvcache_scales.h"

#include <cfloat>
#include <cmath>
#include <string>
#include <utility>

#include "api/entry_tables.h"
#include "api/errors.h"
#include "api/tensor_checks.h"

namespace anyattn::api {
namespace {

// Reads descale `name` (shape (1), (Hk) or (B, Hk)) into `expanded`, (B, Hk) row-major, checking
// every entry.
void read_descale(const char* fn, const char* name, const anyattn_tensor* t, int64_t batch,
                  int64_t heads_k, bool appending, std::vector<float>* expanded) {
  require_descriptor(fn, name, t);
  if (t->ndim != 1 && t->ndim != 2) {
    fail_invalid(fn, ": ", name, ".ndim is ", t->ndim,
                 "; expected (1) per tensor, (Hk) per kv head or (B, Hk) per sequence and kv head");
  }
  check_layout(fn, name, t, {ANYATTN_DTYPE_F32});
  const bool per_sequence = t->ndim == 2;
  const bool shape_ok = per_sequence ? t->shape[0] == batch && t->shape[1] == heads_k
                                     : t->shape[0] == 1 || t->shape[0] == heads_k;
  if (!shape_ok) {
    fail_invalid(fn, ": ", name, ".shape is (", t->shape[0],
                 per_sequence ? ", " + std::to_string(t->shape[1]) : std::string(),
                 "); expected (1), (Hk) = (", heads_k, ") or (B, Hk) = (", batch, ", ", heads_k,
                 ")");
  }
  const float* data = static_cast<const float*>(t->data);
  expanded->resize(static_cast<size_t>(batch * heads_k));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads_k; ++h) {
      const int64_t index0 = per_sequence ? b : (t->shape[0] == 1 ? 0 : h);
      const float value =
          per_sequence ? data[b * t->strides[0] + h * t->strides[1]] : data[index0 * t->strides[0]];
      const std::string index = per_sequence
                                    ? "[" + std::to_string(b) + "][" + std::to_string(h) + "]"
                                    : "[" + std::to_string(index0) + "]";
      if (!std::isfinite(value) || value < 0.f) {
        fail_invalid(fn, ": ", name, index, " is ", value,
                     "; a descale must be finite and >= 0 (0 reads the values as 0)");
      }
      if (appending && !(value >= FLT_MIN)) {
        fail_invalid(fn, ": ", name, index, " is ", value,
                     "; appending (cache->k_new given) divides by the descale, so it must be a "
                     "normal positive f32 (>= ",
                     FLT_MIN, ")");
      }
      (*expanded)[b * heads_k + h] = value;
    }
  }
}

}  // namespace

void check_cache_scales(CallCheck* check, const anyattn_kvcache_params& cache, int32_t cache_dtype,
                        int64_t batch, bool paged, bool appending, ValidatedFwd* attention) {
  cpu::FwdArgs* args = &attention->args;
  const char* fn = check->function();
  const std::pair<const char*, const anyattn_tensor*> scales[] = {
      {"cache->k_descale", cache.k_descale},
      {"cache->v_descale", cache.v_descale},
      {"cache->k_token_scale", cache.k_token_scale},
      {"cache->v_token_scale", cache.v_token_scale}};
  if (!is_8bit_dtype(cache_dtype)) {
    for (const auto& [name, t] : scales) {
      if (t != nullptr) {
        fail_invalid(fn, ": ", name, " is given but k_cache.dtype is ", dtype_name(cache_dtype),
                     "; scales apply only to an 8-bit cache (fp8_e4m3, fp8_e5m2, i8)");
      }
    }
    return;
  }
  if (args->v_is_k_prefix()) {
    fail_unsupported(fn, ": v_cache is a column prefix of k_cache (a shared latent cache) of dtype ",
                     dtype_name(cache_dtype),
                     "; a shared latent cache must be f32, f16 or bf16 (8-bit caches keep K and V "
                     "apart)");
  }
  const int64_t heads_k = (*check)[Dim::kHk];
  if (cache.k_descale != nullptr) {
    read_descale(fn, "cache->k_descale", cache.k_descale, batch, heads_k, appending, &attention->k_descale);
    args->k_descale = attention->k_descale.data();
    args->k_descale_batch_stride = heads_k;
    args->k_descale_head_stride = 1;
  }
  if (cache.v_descale != nullptr) {
    read_descale(fn, "cache->v_descale", cache.v_descale, batch, heads_k, appending, &attention->v_descale);
    args->v_descale = attention->v_descale.data();
    args->v_descale_batch_stride = heads_k;
    args->v_descale_head_stride = 1;
  }
  if ((cache.k_token_scale == nullptr) != (cache.v_token_scale == nullptr)) {
    fail_invalid(fn, ": cache->k_token_scale and cache->v_token_scale must be given together");
  }
  if (cache.k_token_scale == nullptr) return;
  const anyattn_tensor* const token_scales[] = {cache.k_token_scale, cache.v_token_scale};
  check->check(paged ? tables::kPagedTokenScales : tables::kTokenScales, token_scales);
  for (const char* scale : {"cache->k_token_scale", "cache->v_token_scale"}) {
    for (const char* other : {"k_cache", "v_cache"}) check->require_disjoint(scale, other);
    if (appending) {
      check->require_disjoint(scale, "cache->k_new");
      check->require_disjoint(scale, "cache->v_new");
    }
  }
  check->require_disjoint("cache->k_token_scale", "cache->v_token_scale");
  const auto strides = [](const anyattn_tensor* t, int64_t* batch_stride, int64_t* row_stride,
                          int64_t* head_stride) {
    *batch_stride = t->strides[0];
    *row_stride = t->strides[1];
    *head_stride = t->strides[2];
  };
  args->k_token_scale = static_cast<float*>(cache.k_token_scale->data);
  strides(cache.k_token_scale, &args->k_scale_batch_stride, &args->k_scale_row_stride,
          &args->k_scale_head_stride);
  args->v_token_scale = static_cast<float*>(cache.v_token_scale->data);
  strides(cache.v_token_scale, &args->v_scale_batch_stride, &args->v_scale_row_stride,
          &args->v_scale_head_stride);
}

}  // namespace anyattn::api
