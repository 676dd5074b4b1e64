// Checks of one anyattn_tensor descriptor: rank, dtype, unit last stride, and the memory extent a
// strided view spans, computed without int64 overflow; and the reading of small int32 and float
// side tensors. The checks of a whole call against its table build on these (call_check.h).
#ifndef ANYATTN_API_TENSOR_CHECKS_H_
#define ANYATTN_API_TENSOR_CHECKS_H_

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "anyattn/anyattn.h"
#include "common/head_dims.h"

namespace anyattn::api {

// The head-dim limits every entry point checks (common/head_dims.h).
using anyattn::kMaxHeadDim;
using anyattn::kMaxHeadDimV;
// Sequence lengths, batch and head counts are limited to int32, so that every index product the
// kernels form stays far from int64 overflow and the dropout counters stay exact.
constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;

// The floating-point dtypes of attention tensors: every q, k, v, out and gradient is one of them.
inline constexpr std::initializer_list<int32_t> kFloatDtypes = {
    ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};

// The element types of a KV cache: the float dtypes (then q's) or an 8-bit one (k_cache and
// v_cache share it).
inline constexpr std::initializer_list<int32_t> kCacheDtypes = {
    ANYATTN_DTYPE_F32,      ANYATTN_DTYPE_F16,      ANYATTN_DTYPE_BF16,
    ANYATTN_DTYPE_FP8_E4M3, ANYATTN_DTYPE_FP8_E5M2, ANYATTN_DTYPE_I8};
inline bool is_8bit_dtype(int32_t dtype) {
  return dtype == ANYATTN_DTYPE_FP8_E4M3 || dtype == ANYATTN_DTYPE_FP8_E5M2 ||
         dtype == ANYATTN_DTYPE_I8;
}

// Bytes per element of a dtype; 0 for an unknown dtype.
int64_t dtype_size(int32_t dtype);
const char* dtype_name(int32_t dtype);

// What a validated tensor spans in memory. `first_byte`/`end_byte` bound every element address
// (as integers) for overlap checks; both are 0 for an empty tensor.
struct TensorExtent {
  int64_t num_elements = 0;
  uintptr_t first_byte = 0;
  uintptr_t end_byte = 0;
  bool empty() const { return num_elements == 0; }
};

// Validates `t` as the parameter `name` of `function`: non-null descriptor, ndim == expected_ndim
// (dims_doc names the dimensions, e.g. "(B, Sq, Hq, D)"), a dtype in `allowed`, non-negative
// shape, unit stride in the last dimension (any stride when that dimension has size <= 1),
// non-null data, and an extent that fits in the address space. An empty tensor (an extent of 0)
// addresses nothing: its data pointer and strides are not checked. Throws ApiError.
TensorExtent check_tensor(const char* function, const char* name, const anyattn_tensor* t,
                          int expected_ndim, const char* dims_doc,
                          std::initializer_list<int32_t> allowed_dtypes);

// The steps of check_tensor, for callers that report the rank themselves (call_check.cc).
// require_descriptor throws unless `t` is non-null; check_layout checks everything after the
// rank. The last dimension must have unit stride unless `last_stride` is kAny (tensors the
// library copies entry by entry, such as descales, which callers pass as broadcast views).
enum class LastStride { kUnit, kAny };
void require_descriptor(const char* function, const char* name, const anyattn_tensor* t);
TensorExtent check_layout(const char* function, const char* name, const anyattn_tensor* t,
                          std::initializer_list<int32_t> allowed_dtypes,
                          LastStride last_stride = LastStride::kUnit);

// Throws unless no two distinct index tuples of `t` address the same element (a tensor that is
// written must not overlap itself). Uses a sufficient condition: sorted by |stride|, each stride
// exceeds the span of the smaller dimensions.
void check_no_self_overlap(const char* function, const char* name, const anyattn_tensor* t);

// Throws if the written tensor `out_name` shares any byte range with `in_name`.
void check_disjoint(const char* function, const char* out_name, const TensorExtent& out,
                    const char* in_name, const TensorExtent& in);

// True when `prefix` is a column prefix view of `whole`: the same data pointer, dtype and rank,
// the same shape and strides in every dimension but the last, and no more columns. Both must
// have passed check_layout. (The shared latent cache of absorbed MLA passes v_cache as such a
// view of k_cache: docs/semantics.md, "Shared latent cache".)
bool is_column_prefix(const anyattn_tensor* prefix, const anyattn_tensor* whole);

// Validates `t` as a 1-D int32 tensor of `length` elements and returns a copy of its values.
std::vector<int32_t> read_int32_vector(const char* function, const char* name,
                                       const anyattn_tensor* t, int64_t length);

// Validates `t` as a 2-D int32 tensor with `rows` rows and returns (columns, row-major copy).
std::pair<int64_t, std::vector<int32_t>> read_int32_matrix(const char* function, const char* name,
                                                           const anyattn_tensor* t, int64_t rows);

// Validates `t` as a 2-D float tensor (f32, f16 or bf16) and returns its rows [0, rows) as f32,
// row-major, `columns` (its second dimension) per row.
std::vector<float> read_float_rows(const char* function, const char* name, const anyattn_tensor* t,
                                   int64_t rows);

}  // namespace anyattn::api

#endif  // ANYATTN_API_TENSOR_CHECKS_H_
