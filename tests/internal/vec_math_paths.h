// The vector exp2, tanh, 1 - tanh^2, f16 narrowing and e4m3 read of every instruction-set path
// (src/cpu/simd/), compiled for the tests only (vec_math_paths.cc): the library's kernel table carries no test hooks.
#ifndef ANYATTN_TESTS_VEC_MATH_PATHS_H_
#define ANYATTN_TESTS_VEC_MATH_PATHS_H_

#include <cstdint>

#include "anyattn/anyattn.h"

namespace anyattn::cpu::vec_math_test {

// y[i] = f(x[i]) for i < n, with one path's vector function f.
using ElementwiseFn = void (*)(const float* x, int64_t n, float* y);
// y[i] = the f16 bits of x[i] for i < n, with one path's Vec::store_f16.
using NarrowFn = void (*)(const float* x, int64_t n, uint16_t* y);
// y[i] = byte x[i] read by one path's Vec::load_fp8_e4m3_direct, for i < n (a multiple of 16).
using ByteReadFn = void (*)(const uint8_t* x, int64_t n, float* y);

struct VecMathPath {
  anyattn_isa isa;
  ElementwiseFn exp2_array;   // exp2 (simd/vec_math-inl.h)
  ElementwiseFn tanh_array;   // tanh (simd/vec_math-inl.h)
  ElementwiseFn sech2_array;  // the backward's 1 - tanh^2 (tanh_and_sech2)
  NarrowFn f16_array;         // Vec::store_f16 (the forward's f16 output rows)
  ByteReadFn e4m3_direct_array;  // Vec::load_fp8_e4m3_direct (the decode loop's e4m3 read)
  int e4m3_direct_exponent;      // Vec::kE4m3DirectExponent
};

// The vector math compiled for `isa` with that path's target features, or nullptr if this build
// has none for it.
const VecMathPath* find_vec_math_path(anyattn_isa isa);

}  // namespace anyattn::cpu::vec_math_test

#endif  // ANYATTN_TESTS_VEC_MATH_PATHS_H_
