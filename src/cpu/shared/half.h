// Element access for the kernels in the call's dtype (f32, f16 or bf16): scalar loads and stores
// through the shared f16/bf16 conversions (common/half_convert.h: round-to-nearest-even, NaN stays
// NaN), used for Q rows, outputs and the portable packing path; the SIMD paths convert with
// vector instructions but must agree bit for bit with these.
#ifndef ANYATTN_CPU_SHARED_HALF_H_
#define ANYATTN_CPU_SHARED_HALF_H_

#include <cstdint>

#include "common/fwd_args.h"
#include "common/half_convert.h"
#include "common/kv8_convert.h"

namespace anyattn::cpu {

// The scalar conversions (common/half_convert.h), under the names the kernels use.
inline float bits_to_f32(uint32_t bits) { return convert::bits_float(bits); }
using convert::bf16_to_f32;
using convert::f16_to_f32;
using convert::f32_to_bf16;
using convert::f32_to_f16;

// Element i of a row of `dtype` values, as f32 (an 8-bit cache element: its stored value).
inline float load_element(const void* row, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
    case DType::kI8:  // the stored value, before its scales
      return convert::kv8_to_f32(static_cast<convert::Kv8>(dtype),
                                 static_cast<const uint8_t*>(row)[i]);
    case DType::kF32:
    default:
      return static_cast<const float*>(row)[i];
  }
}

// Stores f32 `value` as element i of a row of `dtype` values, rounding to nearest even.
inline void store_element(void* row, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF16:
      static_cast<uint16_t*>(row)[i] = f32_to_f16(value);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(row)[i] = f32_to_bf16(value);
      break;
    case DType::kF32:
    default:
      static_cast<float*>(row)[i] = value;
      break;
  }
}

// The per-ISA vector loads of an 8-bit cache (Vec::load_fp8_e4m3) give e4m3 values times 2^-8 (the
// f16 they map to exactly); the packed path multiplies each key's scale factor by this instead of
// every element. 1 for the other dtypes. (The direct decode loop's reads carry their own scales:
// fwd_decode_kernel-inl.h, E4m3Read.)
inline float kv_load_scale(DType dtype) { return dtype == DType::kFp8E4M3 ? 256.f : 1.f; }

inline int64_t element_size(DType dtype) {
  return dtype == DType::kF32 ? 4 : is_kv8(dtype) ? 1 : 2;
}

// Address of element `offset` (in elements) of a tensor of `dtype` starting at `base`.
inline const void* element_address(const void* base, DType dtype, int64_t offset) {
  return static_cast<const char*>(base) + offset * element_size(dtype);
}
inline void* element_address(void* base, DType dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * element_size(dtype);
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_SHARED_HALF_H_
