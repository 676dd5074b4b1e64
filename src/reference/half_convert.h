// The exact f32 <-> f16/bf16 conversions (common/half_convert.h, shared with the kernels) under
// anyattn::reference, and the round trips the reference and the tests use to model a 16-bit
// store. Used by the f64 reference, the tests and the fuzzers.
#ifndef ANYATTN_REFERENCE_HALF_CONVERT_H_
#define ANYATTN_REFERENCE_HALF_CONVERT_H_

#include <cstdint>

#include "common/half_convert.h"

namespace anyattn {
namespace reference {

using convert::bf16_to_f32;
using convert::bits_float;
using convert::f16_to_f32;
using convert::f32_to_bf16;
using convert::f32_to_f16;
using convert::float_bits;

// Rounds an f32 to the nearest f16 / bf16 value and widens it back.
inline float round_to_f16(float f) {
  return f16_to_f32(f32_to_f16(f));
}
inline float round_to_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

}  // namespace reference
}  // namespace anyattn

#endif  // ANYATTN_REFERENCE_HALF_CONVERT_H_
