#include "api/tensor_checks.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "api/errors.h"
#include "cpu/shared/half.h"

namespace anyattn::api {

namespace {

// The dtypes of the C ABI, indexed by anyattn_dtype.
struct DtypeInfo {
  const char* name;
  int64_t size;  // bytes per element
};
constexpr DtypeInfo kDtypes[] = {{"f32", 4},      {"f16", 2},      {"bf16", 2}, {"i32", 4},
                                 {"fp8_e4m3", 1}, {"fp8_e5m2", 1}, {"i8", 1}};
static_assert(ANYATTN_DTYPE_F32 == 0 && ANYATTN_DTYPE_F16 == 1 && ANYATTN_DTYPE_BF16 == 2 &&
                  ANYATTN_DTYPE_I32 == 3 && ANYATTN_DTYPE_FP8_E4M3 == 4 &&
                  ANYATTN_DTYPE_FP8_E5M2 == 5 && ANYATTN_DTYPE_I8 == 6,
              "kDtypes follows anyattn_dtype");

const DtypeInfo* find_dtype(int32_t dtype) {
  constexpr int32_t count = sizeof(kDtypes) / sizeof(kDtypes[0]);
  return dtype >= 0 && dtype < count ? &kDtypes[dtype] : nullptr;
}

}  // namespace

int64_t dtype_size(int32_t dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  return info != nullptr ? info->size : 0;
}

const char* dtype_name(int32_t dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  return info != nullptr ? info->name : "unknown";
}

namespace {

std::string allowed_list(std::initializer_list<int32_t> allowed) {
  std::string text;
  for (int32_t dtype : allowed) {
    if (!text.empty()) text += ", ";
    text += dtype_name(dtype);
  }
  return text;
}

}  // namespace

void require_descriptor(const char* function, const char* name, const anyattn_tensor* t) {
  if (t == nullptr) fail_invalid(function, ": ", name, " is NULL; a tensor descriptor is required");
}

TensorExtent check_tensor(const char* function, const char* name, const anyattn_tensor* t,
                          int expected_ndim, const char* dims_doc,
                          std::initializer_list<int32_t> allowed_dtypes) {
  require_descriptor(function, name, t);
  if (t->ndim != expected_ndim) {
    fail_invalid(function, ": ", name, ".ndim is ", t->ndim, "; expected ", expected_ndim, " ",
                 dims_doc);
  }
  return check_layout(function, name, t, allowed_dtypes);
}

TensorExtent check_layout(const char* function, const char* name, const anyattn_tensor* t,
                          std::initializer_list<int32_t> allowed_dtypes, LastStride last_stride) {
  if (std::find(allowed_dtypes.begin(), allowed_dtypes.end(), t->dtype) == allowed_dtypes.end()) {
    fail_invalid(function, ": ", name, ".dtype is ", dtype_name(t->dtype), " (", t->dtype,
                 "); supported: ", allowed_list(allowed_dtypes));
  }
  TensorExtent extent;
  extent.num_elements = 1;
  int64_t low = 0;   // smallest element offset reached
  int64_t high = 0;  // largest element offset reached
  for (int d = 0; d < t->ndim; ++d) {
    const int64_t size = t->shape[d];
    if (size < 0) fail_invalid(function, ": ", name, ".shape[", d, "] is ", size, "; must be >= 0");
    if (__builtin_mul_overflow(extent.num_elements, size, &extent.num_elements)) {
      fail_invalid(function, ": ", name, " has more elements than int64 can count (shape[", d,
                   "] = ", size, ")");
    }
  }
  if (extent.num_elements == 0) return TensorExtent{};  // addresses nothing: any strides
  const int last = t->ndim - 1;
  if (last_stride == LastStride::kUnit && t->shape[last] > 1 && t->strides[last] != 1) {
    fail_invalid(function, ": ", name, ".strides[", last, "] is ", t->strides[last],
                 "; the last dimension must have unit stride");
  }
  for (int d = 0; d < t->ndim; ++d) {
    int64_t span = 0;
    if (__builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &span) ||
        __builtin_add_overflow(span > 0 ? high : low, span, span > 0 ? &high : &low)) {
      fail_invalid(function, ": ", name, " spans more memory than int64 can address (shape[", d,
                   "] = ", t->shape[d], ", strides[", d, "] = ", t->strides[d], ")");
    }
  }
  if (t->data == nullptr) {
    fail_invalid(function, ": ", name, ".data is NULL for a tensor of ", extent.num_elements,
                 " elements");
  }
  const int64_t element = dtype_size(t->dtype);
  int64_t low_bytes = 0, high_bytes = 0;
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data);
  if (__builtin_mul_overflow(low, element, &low_bytes) ||
      __builtin_mul_overflow(high, element, &high_bytes) ||
      __builtin_add_overflow(high_bytes, element, &high_bytes) ||
      (low_bytes < 0 && base < static_cast<uintptr_t>(-low_bytes)) ||
      base + static_cast<uintptr_t>(high_bytes) < base) {
    fail_invalid(function, ": ", name,
                 " spans memory outside the address space (strides too large"
                 " for its data pointer)");
  }
  extent.first_byte = base - static_cast<uintptr_t>(-low_bytes);
  extent.end_byte = base + static_cast<uintptr_t>(high_bytes);
  return extent;
}

void check_no_self_overlap(const char* function, const char* name, const anyattn_tensor* t) {
  struct Dim {
    int64_t size;
    int64_t stride;
  };
  Dim dims[ANYATTN_MAX_NDIM];
  int count = 0;
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return;  // empty: nothing is written
    if (t->shape[d] > 1) dims[count++] = Dim{t->shape[d], std::llabs(t->strides[d])};
  }
  for (int i = 1; i < count; ++i) {  // insertion sort by stride: at most 4 dimensions
    for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j)
      std::swap(dims[j], dims[j - 1]);
  }
  int64_t span = 0;  // largest offset reachable by the dimensions checked so far
  for (int d = 0; d < count; ++d) {
    if (dims[d].stride <= span) {
      fail_invalid(function, ": ", name, " has overlapping elements (a stride of ", dims[d].stride,
                   " for a dimension of size ", dims[d].size,
                   "); an output must address each element once");
    }
    span += dims[d].stride * (dims[d].size - 1);
  }
}

bool is_column_prefix(const anyattn_tensor* prefix, const anyattn_tensor* whole) {
  if (prefix->data != whole->data || prefix->dtype != whole->dtype || prefix->ndim != whole->ndim ||
      prefix->ndim < 1) {
    return false;
  }
  const int last = prefix->ndim - 1;
  for (int d = 0; d < last; ++d) {
    if (prefix->shape[d] != whole->shape[d]) return false;
    if (prefix->shape[d] > 1 && prefix->strides[d] != whole->strides[d]) return false;
  }
  return prefix->shape[last] <= whole->shape[last];
}

void check_disjoint(const char* function, const char* out_name, const TensorExtent& out,
                    const char* in_name, const TensorExtent& in) {
  if (out.empty() || in.empty()) return;
  if (out.first_byte < in.end_byte && in.first_byte < out.end_byte) {
    fail_invalid(function, ": ", out_name, " overlaps ", in_name,
                 " in memory; outputs must not alias inputs or each other");
  }
}

std::vector<int32_t> read_int32_vector(const char* function, const char* name,
                                       const anyattn_tensor* t, int64_t length) {
  check_tensor(function, name, t, 1, "(n)", {ANYATTN_DTYPE_I32});
  if (t->shape[0] != length) {
    fail_invalid(function, ": ", name, ".shape[0] is ", t->shape[0], "; expected ", length);
  }
  std::vector<int32_t> values(static_cast<size_t>(length));
  const int32_t* data = static_cast<const int32_t*>(t->data);
  for (int64_t i = 0; i < length; ++i) values[i] = data[i * t->strides[0]];
  return values;
}

std::pair<int64_t, std::vector<int32_t>> read_int32_matrix(const char* function, const char* name,
                                                           const anyattn_tensor* t, int64_t rows) {
  check_tensor(function, name, t, 2, "(rows, columns)", {ANYATTN_DTYPE_I32});
  if (t->shape[0] != rows) {
    fail_invalid(function, ": ", name, ".shape[0] is ", t->shape[0], "; expected ", rows);
  }
  const int64_t columns = t->shape[1];
  std::vector<int32_t> values(static_cast<size_t>(rows * columns));
  const int32_t* data = static_cast<const int32_t*>(t->data);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      values[r * columns + c] = data[r * t->strides[0] + c * t->strides[1]];
    }
  }
  return {columns, std::move(values)};
}

std::vector<float> read_float_rows(const char* function, const char* name, const anyattn_tensor* t,
                                   int64_t rows) {
  check_tensor(function, name, t, 2, "(positions, rotary_dim / 2)", kFloatDtypes);
  const int64_t columns = t->shape[1];
  std::vector<float> values(static_cast<size_t>(rows * columns));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < columns; ++c) {
      const int64_t offset = r * t->strides[0] + c * t->strides[1];
      values[r * columns + c] =
          cpu::load_element(t->data, static_cast<cpu::DType>(t->dtype), offset);
    }
  }
  return values;
}

}  // namespace anyattn::api
