// Scalar conversions between f32 and the 16-bit float formats f16 (IEEE binary16) and bf16
// (bfloat16): the one implementation that the kernels (cpu/shared/half.h) and the f64 reference
// (reference/half_convert.h) share. Integer operations only, so that the result never depends on
// the compiler, the CPU or the floating-point environment (flush-to-zero included).
//
// Narrowing (f32 -> 16 bit) rounds to nearest, ties to even, overflows to +-inf as IEEE does,
// and keeps NaN a NaN: the sign and the top payload bits are kept and the quiet bit is set (as
// F16C does), so a NaN never turns into an infinity. Widening (16 bit -> f32) is exact for every
// input, NaN payloads included. The SIMD paths convert with vector instructions and must agree
// with these bit for bit.
//
// The installed C++ header include/anyattn/anyattn.hpp keeps its own copy (Float16, BFloat16),
// because it must compile without anything from src/; tests/common/reference_test.cc checks that the two
// agree on every 16-bit pattern and on a spread of f32 patterns over every exponent.
#ifndef ANYATTN_COMMON_HALF_CONVERT_H_
#define ANYATTN_COMMON_HALF_CONVERT_H_

#include <cstdint>
#include <cstring>

namespace anyattn::convert {

// The bits of a float, and back.
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// f32 -> bf16: keep the top 16 bits, rounding the dropped 16 to nearest even.
inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate and force the quiet bit.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t lsb = (u >> 16) & 1u;                      // Ties go to the even neighbour.
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);  // A carry may reach inf: correct.
}

// bf16 -> f32: exact (bf16 is the top half of an f32).
inline float bf16_to_f32(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// f32 -> f16 (1 sign, 5 exponent, 10 mantissa bits; bias 15), round to nearest even.
inline uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: keep the top 10 payload bits, force the quiet bit.
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x03ffu));
  }
  if (abs >= 0x477ff000u) {  // >= 65520 (halfway past the largest f16, 65504): rounds to inf.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {  // >= 2^-14: a normal f16. Rebias the exponent from 127 to 15.
    const uint32_t rebased = abs - 0x38000000u;
    const uint32_t lsb = (rebased >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((rebased + 0x0fffu + lsb) >> 13));
  }
  if (abs <= 0x33000000u) {  // <= 2^-25 (half the smallest subnormal; the tie goes to 0).
    return sign;
  }
  // A subnormal f16: the value in units of 2^-24, rounded to nearest even. Here the f32 is
  // normal with biased exponent e in [102, 112], so value = m * 2^(e - 150) with the implicit bit
  // in m, and value / 2^-24 = m >> (126 - e) with shift in [14, 24].
  const uint32_t exponent = abs >> 23;
  const uint32_t mantissa = (abs & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126u - exponent;
  const uint32_t half = 1u << (shift - 1);
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  uint32_t result = mantissa >> shift;
  if (rest > half || (rest == half && (result & 1u))) ++result;  // May become 0x400: normal.
  return static_cast<uint16_t>(sign | result);
}

// f16 -> f32: exact for every input.
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in f32 (a normal f32, so flush-to-zero cannot
  // touch it).
  const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
  return sign ? -magnitude : magnitude;
}

}  // namespace anyattn::convert

#endif  // ANYATTN_COMMON_HALF_CONVERT_H_
