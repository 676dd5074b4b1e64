// Scalar conversions between f32 and the 16-bit float formats (IEEE binary16 and bfloat16).
// Round-to-nearest-even, NaN stays NaN (quieted), infinities and subnormals are exact where the
// format allows. Used for Q rows, outputs and the portable packing path; the SIMD paths convert
// with vector instructions but must agree bit for bit with these.
#ifndef ANYATTN_CPU_HALF_H_
#define ANYATTN_CPU_HALF_H_

#include <cstdint>
#include <cstring>

#include "cpu/fwd_args.h"

namespace anyattn::cpu {

inline float bits_to_f32(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint32_t f32_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float value) {
  const uint32_t bits = f32_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_to_f32(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in f32.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

inline uint16_t f32_to_f16(float value) {
  const uint32_t bits = f32_to_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((bits >> 13) & 0x3ffu);
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (magnitude < 0x38800000u) {
    // Result is subnormal or zero: round magnitude / 2^-24 to an integer, ties to even.
    const float scaled = bits_to_f32(magnitude) * 16777216.0f;  // exact: a power of two
    const uint32_t whole = static_cast<uint32_t>(scaled);
    const float fraction = scaled - static_cast<float>(whole);
    uint32_t rounded = whole;
    if (fraction > 0.5f || (fraction == 0.5f && (whole & 1u))) ++rounded;
    return sign | static_cast<uint16_t>(rounded);
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits, ties to even.
  const uint32_t rebased = magnitude - (112u << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return sign | static_cast<uint16_t>((rebased + rounding) >> 13);
}

// Element i of a row of `dtype` values, as f32.
inline float load_element(const void* row, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(row)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(row)[i]);
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

inline int64_t element_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// Address of element `offset` (in elements) of a tensor of `dtype` starting at `base`.
inline const void* element_address(const void* base, DType dtype, int64_t offset) {
  return static_cast<const char*>(base) + offset * element_size(dtype);
}
inline void* element_address(void* base, DType dtype, int64_t offset) {
  return static_cast<char*>(base) + offset * element_size(dtype);
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_HALF_H_
