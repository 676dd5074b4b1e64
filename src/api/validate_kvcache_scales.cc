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

// Reads descale `name` (shape (1), (Hk) or (B, Hk), any strides: FA3's callers pass one scale
// expanded to (B, Hk), strides 0) into `expanded`, (B, Hk) row-major, checking every entry.
void read_descale(const char* fn, const char* name, const anyattn_tensor* t, int64_t batch,
                  int64_t heads_k, bool appending, std::vector<float>* expanded) {
  require_descriptor(fn, name, t);
  if (t->ndim != 1 && t->ndim != 2) {
    fail_invalid(fn, ": ", name, ".ndim is ", t->ndim,
                 "; expected (1) per tensor, (Hk) per kv head or (B, Hk) per sequence and kv head");
  }
  check_layout(fn, name, t, {ANYATTN_DTYPE_F32}, LastStride::kAny);
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

constexpr const char* kLatentTakesKeyScales =
    "v_cache is a column prefix of k_cache (a shared latent cache), so its values are those of "
    "the K rows and take K's scales";

// Whether a and b are the same view: one data pointer, shape and strides (read before the
// descriptors are checked, so a rank out of range is no view).
bool same_view(const anyattn_tensor& a, const anyattn_tensor& b) {
  if (&a == &b) return true;
  if (a.ndim < 0 || a.ndim > ANYATTN_MAX_NDIM) return false;
  if (a.data != b.data || a.ndim != b.ndim || a.dtype != b.dtype) return false;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] != b.shape[d] || a.strides[d] != b.strides[d]) return false;
  }
  return true;
}

// A shared latent cache's V descale: v_descale, when given, must repeat k_descale entry by entry
// (an absent k_descale is 1); then V's expanded descale is a copy of K's (or absent with it).
void latent_takes_key_descales(const char* fn, const anyattn_kvcache_params& cache,
                               int64_t batch, int64_t heads_k, ValidatedFwd* attention) {
  cpu::FwdArgs* args = &attention->args;
  if (cache.v_descale != nullptr) {
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads_k; ++h) {
        const float k = args->k_descale_of(b, h), v = args->v_descale_of(b, h);
        if (k != v) {
          fail_invalid(fn, ": cache->v_descale is ", v, " but cache->k_descale is ", k,
                       " for sequence ", b, ", kv head ", h, "; ", kLatentTakesKeyScales,
                       ": pass v_descale = NULL or the same values as k_descale");
        }
      }
    }
  }
  attention->v_descale = attention->k_descale;
  args->v_descale = attention->v_descale.empty() ? nullptr : attention->v_descale.data();
  args->v_descale_batch_stride = args->k_descale_batch_stride;
  args->v_descale_head_stride = args->k_descale_head_stride;
}

// A shared latent cache's V token scales: v_token_scale, when given, must be k_token_scale itself
// (the kernels then read K's for V whether it is given or not).
void latent_takes_key_token_scales(const char* fn, const anyattn_kvcache_params& cache) {
  if (cache.v_token_scale == nullptr) return;
  if (cache.k_token_scale == nullptr) {
    fail_invalid(fn, ": cache->v_token_scale is given without cache->k_token_scale; ",
                 kLatentTakesKeyScales);
  }
  if (!same_view(*cache.v_token_scale, *cache.k_token_scale)) {
    fail_invalid(fn, ": cache->v_token_scale is not cache->k_token_scale (another tensor or ",
                 "view); ", kLatentTakesKeyScales, ": pass NULL or k_token_scale itself");
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
  const bool latent = args->v_is_k_prefix();
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
  if (latent) {
    latent_takes_key_descales(fn, cache, batch, heads_k, attention);
    latent_takes_key_token_scales(fn, cache);
  } else if ((cache.k_token_scale == nullptr) != (cache.v_token_scale == nullptr)) {
    fail_invalid(fn, ": cache->k_token_scale and cache->v_token_scale must be given together");
  }
  if (cache.k_token_scale == nullptr) return;
  // A shared latent cache's V rows take K's token scales: the table binds them twice.
  const anyattn_tensor* const token_scales[] = {
      cache.k_token_scale, latent ? cache.k_token_scale : cache.v_token_scale};
  check->check(paged ? tables::kPagedTokenScales : tables::kTokenScales, token_scales);
  for (const char* scale : {"cache->k_token_scale", "cache->v_token_scale"}) {
    for (const char* other : {"k_cache", "v_cache"}) check->require_disjoint(scale, other);
    if (appending) {
      check->require_disjoint(scale, "cache->k_new");
      check->require_disjoint(scale, "cache->v_new");
    }
  }
  if (!latent) check->require_disjoint("cache->k_token_scale", "cache->v_token_scale");
  const auto strides = [](const anyattn_tensor* t, int64_t* batch_stride, int64_t* row_stride,
                          int64_t* head_stride) {
    *batch_stride = t->strides[0];
    *row_stride = t->strides[1];
    *head_stride = t->strides[2];
  };
  args->k_token_scale = static_cast<float*>(cache.k_token_scale->data);
  strides(cache.k_token_scale, &args->k_scale_batch_stride, &args->k_scale_row_stride,
          &args->k_scale_head_stride);
  const anyattn_tensor* v_token_scale = token_scales[1];
  args->v_token_scale = static_cast<float*>(v_token_scale->data);
  strides(v_token_scale, &args->v_scale_batch_stride, &args->v_scale_row_stride,
          &args->v_scale_head_stride);
}

}  // namespace anyattn::api
