// Shared machinery of the libFuzzer harnesses (fuzz/README.md): tensors over small real buffers
// whose every addressed element lies inside the allocation (so AddressSanitizer sees any access
// the library makes outside the caller's view), random strides (permuted, padded, zero, negative),
// sentinel-filled outputs, and the checks each harness applies after a call:
//   - an error status leaves every output byte untouched and sets a non-empty message;
//   - a success writes only the logical elements of the outputs and matches the f64 reference
//     within a loose bound of the dtype (fuzz_check_close).
// A failed check calls __builtin_trap() so that libFuzzer records the input as a crash.
#ifndef ANYATTN_FUZZ_FUZZ_COMMON_H_
#define ANYATTN_FUZZ_FUZZ_COMMON_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/half_convert.h"
#include "reference/reference.h"

namespace anyattn_fuzz {

[[noreturn]] inline void fail(const char* what, int64_t index, double got, double want) {
  std::fprintf(stderr, "anyattn fuzz check failed: %s at %lld: got %.9g want %.9g (%s)\n", what,
               static_cast<long long>(index), got, want, anyattn_last_error());
  __builtin_trap();
}

// Prints a descriptor (for the report of a failed check).
inline void print_tensor(const char* name, const anyattn_tensor* t) {
  if (t == nullptr) {
    std::fprintf(stderr, "  %s: NULL\n", name);
    return;
  }
  std::fprintf(stderr, "  %s: dtype %d shape (", name, t->dtype);
  for (int d = 0; d < t->ndim; ++d)
    std::fprintf(stderr, "%lld ", static_cast<long long>(t->shape[d]));
  std::fprintf(stderr, ") strides (");
  for (int d = 0; d < t->ndim; ++d) {
    std::fprintf(stderr, "%lld ", static_cast<long long>(t->strides[d]));
  }
  std::fprintf(stderr, ") data %p\n", t->data);
}

// How a tensor's strides are laid out.
enum class StrideKind {
  kContiguous,  // C-contiguous
  kPadded,      // every non-last stride padded by a few elements
  kPermuted,    // the non-last dimensions stored in another order
  kZero,        // one non-last dimension broadcast (stride 0); never valid for outputs
  kNegative,    // one non-last dimension reversed
};

// A tensor over its own buffer. The buffer covers exactly the element offsets the strides can
// address ([min_offset, max_offset]), so any access outside the view is outside the allocation.
struct FuzzTensor {
  anyattn_tensor t{};
  std::unique_ptr<unsigned char[]> storage;
  int64_t storage_bytes = 0;
  int64_t base_element = 0;  // element offset of t.data within storage

  // Element offsets (relative to t.data) of every logical element, in row-major index order.
  std::vector<int64_t> offsets() const {
    std::vector<int64_t> result;
    int64_t n = 1;
    for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
    result.reserve(static_cast<size_t>(n));
    int64_t index[ANYATTN_MAX_NDIM] = {0, 0, 0, 0};
    for (int64_t e = 0; e < n; ++e) {
      int64_t offset = 0;
      for (int d = 0; d < t.ndim; ++d) offset += index[d] * t.strides[d];
      result.push_back(offset);
      for (int d = t.ndim - 1; d >= 0; --d) {
        if (++index[d] < t.shape[d]) break;
        index[d] = 0;
      }
    }
    return result;
  }

  // True when two logical elements share one address (a stride of 0 over a dimension of more
  // than one element): what is stored there is the last write, not each element's own value.
  bool aliases_elements() const {
    for (int d = 0; d < t.ndim; ++d) {
      if (t.strides[d] == 0 && t.shape[d] > 1) return true;
    }
    return false;
  }
};

// Builds a tensor of `shape` (ndim dims) with strides of `kind`, over a buffer filled with
// `fill` bytes. Shapes are small (the harnesses bound them), so nothing overflows here.
inline FuzzTensor make_tensor(int32_t dtype, int ndim, const int64_t* shape, StrideKind kind,
                              int which_dim, int pad, unsigned char fill) {
  FuzzTensor f;
  f.t.dtype = dtype;
  f.t.ndim = ndim;
  int order[ANYATTN_MAX_NDIM] = {0, 1, 2, 3};
  if (kind == StrideKind::kPermuted && ndim > 2) {
    std::swap(order[which_dim % (ndim - 1)], order[(which_dim + 1) % (ndim - 1)]);
  }
  // Strides from the innermost stored dimension outwards.
  int64_t stride = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    const int d = order[k];
    f.t.shape[d] = shape[d];
    f.t.strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1) + (kind == StrideKind::kPadded && k > 0 ? pad : 0);
  }
  if (ndim > 1 && kind == StrideKind::kZero) f.t.strides[which_dim % (ndim - 1)] = 0;
  if (ndim > 1 && kind == StrideKind::kNegative) {
    f.t.strides[which_dim % (ndim - 1)] *= -1;
  }
  int64_t low = 0, high = 0;
  bool empty = false;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) empty = true;
    const int64_t span = (shape[d] - 1) * f.t.strides[d];
    if (span > 0) high += span;
    if (span < 0) low += span;
  }
  if (empty) low = high = 0;
  const int64_t elements = high - low + 1;
  f.storage_bytes = elements * anyattn_dtype_size(dtype);
  f.storage.reset(new unsigned char[static_cast<size_t>(f.storage_bytes)]);
  std::memset(f.storage.get(), fill, static_cast<size_t>(f.storage_bytes));
  f.base_element = -low;
  f.t.data = f.storage.get() + f.base_element * anyattn_dtype_size(dtype);
  return f;
}

// A tensor of `shape` whose stride kind and permuted or broadcast dimension are drawn from the
// input, with padding `pad`, or a padding of 1 to 3 drawn too when `pad` is 0.
inline FuzzTensor draw_tensor(FuzzedDataProvider& data, int32_t dtype, int ndim,
                              const int64_t* shape, unsigned char fill, int pad = 0) {
  const auto kind = static_cast<StrideKind>(data.ConsumeIntegralInRange<int>(0, 4));
  const int which = data.ConsumeIntegralInRange<int>(0, 3);
  if (pad == 0) pad = data.ConsumeIntegralInRange<int>(1, 3);
  return make_tensor(dtype, ndim, shape, kind, which, pad, fill);
}

// The size of a dense problem (fuzz_fwd, fuzz_bwd), drawn from the input: B, Sq, Sk 0..9, Hk 1..3,
// Hq a multiple (or, 1 time in 16, not), D and Dv from fast, odd, empty and too large sizes, the
// three dtypes and an invalid one, and whether the values are hostile.
struct DenseShape {
  int32_t dtype;
  int64_t B, Sq, Sk, Hk, Hq, D, Dv;
  bool hostile_values;

  explicit DenseShape(FuzzedDataProvider& data) {
    const int32_t dtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16,
                              ANYATTN_DTYPE_F32, ANYATTN_DTYPE_I32};
    dtype = dtypes[data.ConsumeIntegralInRange<int>(0, 4)];
    B = data.ConsumeIntegralInRange<int64_t>(0, 3);
    Sq = data.ConsumeIntegralInRange<int64_t>(0, 9);
    Sk = data.ConsumeIntegralInRange<int64_t>(0, 9);
    Hk = data.ConsumeIntegralInRange<int64_t>(1, 3);
    const int64_t ratio = data.ConsumeIntegralInRange<int64_t>(1, 3);
    const bool bad_heads = data.ConsumeIntegralInRange<int>(0, 15) == 0;
    Hq = Hk * ratio + (bad_heads ? 1 : 0);
    // 513: a valid D, a Dv one past its limit; 577: one past D's (anyattn.h's limits).
    const int64_t dims[] = {1, 2, 3, 8, 16, 17, 24, 0, ANYATTN_MAX_HEAD_DIM_V + 1,
                            ANYATTN_MAX_HEAD_DIM + 1};
    D = dims[data.ConsumeIntegralInRange<int>(0, 9)];
    Dv = dims[data.ConsumeIntegralInRange<int>(0, 9)];
    hostile_values = data.ConsumeBool();
  }
};

// Stores `value` rounded to the tensor's dtype at element offset `offset`.
inline void store_value(const FuzzTensor& f, int64_t offset, double value) {
  unsigned char* p =
      static_cast<unsigned char*>(f.t.data) + offset * anyattn_dtype_size(f.t.dtype);
  if (f.t.dtype == ANYATTN_DTYPE_F16) {
    const uint16_t h = anyattn::reference::f32_to_f16(static_cast<float>(value));
    std::memcpy(p, &h, 2);
  } else if (f.t.dtype == ANYATTN_DTYPE_BF16) {
    const uint16_t h = anyattn::reference::f32_to_bf16(static_cast<float>(value));
    std::memcpy(p, &h, 2);
  } else if (f.t.dtype == ANYATTN_DTYPE_I32) {
    const int32_t i = static_cast<int32_t>(value);
    std::memcpy(p, &i, 4);
  } else {
    const float x = static_cast<float>(value);
    std::memcpy(p, &x, 4);
  }
}

// Fills every logical element with a value in [-2, 2] from the fuzz input (0 once it runs out);
// with `hostile`, some elements become NaN or a subnormal. Infinities are left to
// tests/reliability/reliability_numerics_test.cc: where every score of a row is -inf (an infinite q or k) the
// f64 reference gives NaN (0/0) and the kernels give the fully-masked answer (0, lse -inf), like
// flash-attn; docs/reliability.md records the divergence. Harnesses poison at most one of q, k, v
// per input.
inline void fill_values(FuzzedDataProvider& data, const FuzzTensor& f, bool hostile) {
  for (int64_t offset : f.offsets()) {
    double value = (static_cast<double>(data.ConsumeIntegral<uint8_t>()) - 127.5) / 64.0;
    if (hostile) {
      switch (data.ConsumeIntegralInRange<int>(0, 30)) {
        case 0:
          value = std::numeric_limits<double>::quiet_NaN();
          break;
        case 1:
          value = 1e-40;
          break;
        case 2:
          value = -1e-41;
          break;
        default:
          break;
      }
    }
    store_value(f, offset, value);
  }
}

// Scale, softcap and mask parameters drawn from the input: moderate values (scale 0 = the
// default, 0.5 or 1; softcap off, 5 or 50), which keep a numeric check meaningful, and hostile
// ones (NaN, inf, negative, 1e30 and 1e-30 scales; negative, NaN, inf and 1e30 softcaps; windows
// of -2 and the int32 extremes), which must be rejected or computed without a crash. Returns
// whether scale and softcap are moderate.
inline bool draw_score_params(FuzzedDataProvider& data, anyattn_fwd_params* params) {
  const float scales[] = {0.f, 0.5f, 1.f, NAN, INFINITY, -1.f, 1e30f, 1e-30f};
  const float softcaps[] = {0.f, 5.f, 50.f, -1.f, NAN, INFINITY, 1e30f};
  const int32_t windows[] = {
      -1, 0, 1, 3, -2, std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  const int scale_pick = data.ConsumeIntegralInRange<int>(0, 7);
  const int softcap_pick = data.ConsumeIntegralInRange<int>(0, 6);
  params->softmax_scale = scales[scale_pick];
  params->softcap = softcaps[softcap_pick];
  params->causal = data.ConsumeBool() ? 1 : 0;
  const int wl_pick = data.ConsumeIntegralInRange<int>(0, 6);
  const int wr_pick = data.ConsumeIntegralInRange<int>(0, 6);
  params->window_left = data.ConsumeIntegralInRange<int>(0, 3) == 0 ? windows[wl_pick] : -1;
  params->window_right = data.ConsumeIntegralInRange<int>(0, 3) == 0 ? windows[wr_pick] : -1;
  return scale_pick <= 2 && softcap_pick <= 2;
}

// ALiBi slopes ((Hq), (B, Hq) or none) and sinks ((Hq) or none) drawn from the input, over real
// buffers: slopes in [0, 1], sinks in [-3, 3]. attach() points params at the ones drawn.
struct SideInputs {
  FuzzTensor alibi, sinks;
  bool use_alibi = false, use_sinks = false;

  SideInputs(FuzzedDataProvider& data, int64_t batch, int64_t heads_q) {
    const int alibi_pick = data.ConsumeIntegralInRange<int>(0, 3);
    const int64_t alibi_shape[2] = {alibi_pick == 2 ? batch : 1, heads_q};
    alibi = make_tensor(ANYATTN_DTYPE_F32, alibi_pick == 2 ? 2 : 1,
                        alibi_pick == 2 ? alibi_shape : alibi_shape + 1, StrideKind::kContiguous, 0,
                        1, 0);
    for (int64_t offset : alibi.offsets()) {
      store_value(alibi, offset, data.ConsumeIntegralInRange<int>(0, 8) / 8.0);
    }
    use_alibi = alibi_pick == 1 || alibi_pick == 2;
    sinks = make_tensor(ANYATTN_DTYPE_F32, 1, alibi_shape + 1, StrideKind::kContiguous, 0, 1, 0);
    for (int64_t offset : sinks.offsets()) {
      store_value(sinks, offset, data.ConsumeIntegralInRange<int>(-12, 12) / 4.0);
    }
    use_sinks = data.ConsumeBool();
  }
  void attach(anyattn_fwd_params* params) const {
    if (use_alibi) params->alibi_slopes = &alibi.t;
    if (use_sinks) params->sinks = &sinks.t;
  }
};

// A snapshot of an output's bytes, to check what a call wrote.
struct Snapshot {
  const FuzzTensor* f = nullptr;
  std::vector<unsigned char> bytes;
  explicit Snapshot(const FuzzTensor* tensor) : f(tensor) {
    if (f != nullptr) bytes.assign(f->storage.get(), f->storage.get() + f->storage_bytes);
  }
  bool unchanged() const {
    return f == nullptr || std::memcmp(bytes.data(), f->storage.get(), bytes.size()) == 0;
  }
  // Writes the snapshot's bytes back.
  void restore() const {
    if (f != nullptr) std::memcpy(f->storage.get(), bytes.data(), bytes.size());
  }
  // Traps if a byte outside the logical elements changed.
  void check_padding(const char* what) const {
    if (f == nullptr) return;
    std::vector<char> logical(static_cast<size_t>(f->storage_bytes), 0);
    const int64_t size = anyattn_dtype_size(f->t.dtype);
    for (int64_t offset : f->offsets()) {
      for (int64_t b = 0; b < size; ++b) {
        logical[static_cast<size_t>((f->base_element + offset) * size + b)] = 1;
      }
    }
    for (int64_t b = 0; b < f->storage_bytes; ++b) {
      if (!logical[b] && bytes[b] != f->storage[b]) fail(what, b, f->storage[b], bytes[b]);
    }
  }
};

// The checks right after a call: the tensors it only reads (`inputs`) are unchanged either way; a
// rejected call has a non-empty message and left every tensor it may write (`written`)
// unchanged. Returns whether the call was accepted.
inline bool check_status(anyattn_status status, std::initializer_list<const Snapshot*> written,
                         std::initializer_list<const Snapshot*> inputs) {
  for (const Snapshot* s : inputs) {
    if (!s->unchanged()) fail("an input was written", status, 0, 0);
  }
  if (status == ANYATTN_OK) return true;
  if (std::strlen(anyattn_last_error()) == 0) fail("empty message", status, 0, 0);
  for (const Snapshot* s : written) {
    if (!s->unchanged()) fail("a rejected call wrote", status, 0, 0);
  }
  return false;
}

// The determinism guarantee (docs/reliability.md): an accepted call, repeated with another thread
// count, writes the same bytes. `outputs` hold the snapshots taken before the first call, which
// has just returned (of every tensor it writes, in-place inputs included; a snapshot of no tensor
// is skipped); they are restored, the thread count becomes `threads` and `rerun()` repeats the
// call. Traps if it fails or writes any other byte.
template <class Rerun>
void check_same_bytes_with_threads(int threads, std::initializer_list<const Snapshot*> outputs,
                                   const Rerun& rerun) {
  std::vector<std::vector<unsigned char>> first;
  for (const Snapshot* s : outputs) {
    if (s->f == nullptr) continue;
    first.emplace_back(s->f->storage.get(), s->f->storage.get() + s->f->storage_bytes);
    s->restore();
  }
  anyattn_set_num_threads(threads);
  const anyattn_status status = rerun();
  if (status != ANYATTN_OK) fail("the call failed with another thread count", threads, status, 0);
  size_t i = 0;
  for (const Snapshot* s : outputs) {
    if (s->f == nullptr) continue;
    if (std::memcmp(first[i].data(), s->f->storage.get(), first[i].size()) != 0) {
      fail("another thread count changed the result", threads, static_cast<double>(i), 0);
    }
    ++i;
  }
}

// The loose bound of a successful call, relative to the value's scale: f32 outputs must agree
// with the f64 reference to 5e-5, f16 to 4e-3 and bf16 to 3e-2 (a few units in the last place of
// the output dtype, plus accumulation error, for inputs in [-2, 2] and moderate scales).
inline double tolerance(int32_t dtype) {
  return dtype == ANYATTN_DTYPE_F32 ? 5e-5 : dtype == ANYATTN_DTYPE_F16 ? 4e-3 : 3e-2;
}

// Compares got (gathered from a tensor) with the reference, element by element:
// NaN must be NaN, an infinity the same infinity, a finite value within tol * (scale + |want|).
inline void check_close(const char* what, const std::vector<double>& got,
                        const std::vector<double>& want, double tol, double scale) {
  if (got.size() != want.size()) fail(what, -1, static_cast<double>(got.size()), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w)) {
      if (!std::isnan(g)) fail(what, static_cast<int64_t>(i), g, w);
    } else if (std::isinf(w)) {
      if (g != w) fail(what, static_cast<int64_t>(i), g, w);
    } else if (!(std::fabs(g - w) <= tol * (scale + std::fabs(w)))) {
      fail(what, static_cast<int64_t>(i), g, w);
    }
  }
}

// Stores contiguous row-major values into a strided tensor of the same logical shape.
inline void store_all(const FuzzTensor& f, const std::vector<double>& values) {
  const std::vector<int64_t> offsets = f.offsets();
  for (size_t i = 0; i < offsets.size() && i < values.size(); ++i) {
    store_value(f, offsets[i], values[i]);
  }
}

// The check of the backward harnesses: got (stored as `dtype`) against the reference's gradient
// `want`, each element within tolerance(dtype) times the sum of the absolute values of the terms
// it is summed from (`terms`, from the reference) plus |want|: where terms cancel, the rounding
// error is relative to the terms, not to the small result. Plus an absolute floor for tiny
// results: one subnormal step of the output dtype (rounding is absolute there), and 2^-110 for
// the probabilities below 2^-125.5 that the kernels make exactly 0 (docs/reliability.md): with the
// harnesses' inputs (|x| <= 2, D and Dv <= 24, at most 9 rows, scale <= 1, dropout <= 0.75) the
// terms they drop sum to less than 2^-125.5 * 2^14. A NaN the reference finds must be NaN. With
// `nan_inputs`, a NaN where the reference is finite is accepted: a NaN input row reaches the
// gradients of its masked pairs too, through 0 * NaN (docs/backward.md, "NaN inputs").
inline void check_gradient(const char* what, const std::vector<double>& got,
                           const std::vector<double>& want, const std::vector<double>& terms,
                           int32_t dtype, bool nan_inputs) {
  if (got.size() != want.size() || terms.size() != want.size()) {
    fail(what, -1, static_cast<double>(got.size()), static_cast<double>(want.size()));
  }
  const double tol = tolerance(dtype);
  const double output_step = dtype == ANYATTN_DTYPE_F16    ? 0x1p-24
                             : dtype == ANYATTN_DTYPE_BF16 ? 0x1p-133
                                                           : 0x1p-149;
  const double floor = output_step + 0x1p-110;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || (nan_inputs && std::isnan(g))) {
      if (!std::isnan(g)) fail(what, static_cast<int64_t>(i), g, w);
    } else if (!(std::fabs(g - w) <= tol * (terms[i] + std::fabs(w)) + floor)) {
      fail(what, static_cast<int64_t>(i), g, w);
    }
  }
}

}  // namespace anyattn_fuzz

#endif  // ANYATTN_FUZZ_FUZZ_COMMON_H_
