// Shared by the KV-cache harnesses (fuzz_kvcache, fuzz_kvcache8): i32 metadata tensors and the
// repeat of a read-only call through anyattn_fwd_kvcache_varlen.
#ifndef ANYATTN_FUZZ_FUZZ_KVCACHE_COMMON_H_
#define ANYATTN_FUZZ_FUZZ_KVCACHE_COMMON_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "reference/reference_cache.h"

namespace anyattn_fuzz {

// A tensor of `shape` whose stride kind (padding 2) and permuted or broadcast dimension are drawn
// from the input; one the call writes (`input` false: caches, outputs) gets no broadcast (zero)
// stride.
inline FuzzTensor draw_call_tensor(FuzzedDataProvider& data, int32_t dtype, int rank,
                                   const int64_t* shape, unsigned char fill, bool input) {
  auto kind = static_cast<StrideKind>(data.ConsumeIntegralInRange<int>(0, 4));
  if (!input && kind == StrideKind::kZero) kind = StrideKind::kContiguous;
  const int which = data.ConsumeIntegralInRange<int>(0, 3);
  return make_tensor(dtype, rank, shape, kind, which, 2, fill);
}

// A C-contiguous i32 tensor holding `values`.
inline FuzzTensor int_tensor(const std::vector<int32_t>& values, int ndim, const int64_t* shape) {
  FuzzTensor t = make_tensor(ANYATTN_DTYPE_I32, ndim, shape, StrideKind::kContiguous, 0, 1, 0);
  if (!values.empty()) std::memcpy(t.t.data, values.data(), values.size() * 4);
  return t;
}

// A call that only reads the cache, repeated through anyattn_fwd_kvcache_varlen with the same
// queries packed (B * Sq, Hq, D) and every sequence Sq long: it must be accepted and match the
// same reference (out within tol * (out_scale + |want|), as check_close).
inline void check_packed_queries(const anyattn_tensor& q, const anyattn_tensor& kc,
                                 const anyattn_tensor& vc, const anyattn_kvcache_params& cache,
                                 const anyattn_fwd_params& params,
                                 const anyattn::reference::KvcacheOutputs& ref, double tol,
                                 double out_scale) {
  const int64_t B = q.shape[0], Sq = q.shape[1], Hq = q.shape[2], D = q.shape[3];
  const int64_t Dv = vc.shape[3], total = B * Sq;
  const int64_t q_shape[3] = {total, Hq, D}, out_shape[3] = {total, Hq, Dv};
  const int64_t lse_shape[2] = {Hq, total}, cu_shape[1] = {B + 1};
  FuzzTensor packed_q = make_tensor(q.dtype, 3, q_shape, StrideKind::kContiguous, 0, 1, 0);
  store_all(packed_q, anyattn::reference::to_contiguous_f64(q));
  FuzzTensor out = make_tensor(q.dtype, 3, out_shape, StrideKind::kContiguous, 0, 1, 0);
  FuzzTensor lse = make_tensor(ANYATTN_DTYPE_F32, 2, lse_shape, StrideKind::kContiguous, 0, 1, 0);
  std::vector<int32_t> cu(B + 1);
  for (int64_t b = 0; b <= B; ++b) cu[b] = static_cast<int32_t>(b * Sq);
  FuzzTensor t_cu = int_tensor(cu, 1, cu_shape);
  const anyattn_status status = anyattn_fwd_kvcache_varlen(&packed_q.t, &kc, &vc, &out.t, &lse.t,
                                                           &t_cu.t, Sq, &cache, &params);
  if (status != ANYATTN_OK) fail("packed queries rejected", status, 0, 0);
  check_close("packed out", anyattn::reference::to_contiguous_f64(out.t), ref.out, tol,
              out_scale);
  std::vector<double> want_lse(Hq * total);  // ref.lse is (B, Hq, Sq)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      for (int64_t i = 0; i < Sq; ++i)
        want_lse[h * total + b * Sq + i] = ref.lse[(b * Hq + h) * Sq + i];
    }
  }
  check_close("packed lse", anyattn::reference::to_contiguous_f64(lse.t), want_lse, 1e-4, 1.0);
}

}  // namespace anyattn_fuzz

#endif  // ANYATTN_FUZZ_FUZZ_KVCACHE_COMMON_H_
