// Each path's vector math compiled as the library compiles it (the same simd/ headers inside the
// same target features as src/cpu/fwd_<isa>.cc), in namespaces of the tests' own.
#include "internal/vec_math_paths.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#include <arm_neon.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/shared/half.h"
#include "cpu/simd/isa_target.h"

namespace anyattn::cpu::vec_math_test::portable {
#include "cpu/simd/vec_portable.h"
#include "cpu/simd/vec_math-inl.h"
#include "internal/vec_math_arrays-inl.h"
}  // namespace anyattn::cpu::vec_math_test::portable

#if defined(__x86_64__) || defined(_M_X64)
// GCC 12 reports the deliberately undefined upper halves inside its own AVX-512 intrinsics as
// uninitialised (GCC bug 105593), as in src/cpu/fwd_avx512.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

ANYATTN_TARGET_BEGIN("avx2,fma,f16c")
namespace anyattn::cpu::vec_math_test::avx2 {
#include "cpu/simd/vec_avx2.h"
#include "cpu/simd/vec_math-inl.h"
#include "internal/vec_math_arrays-inl.h"
}  // namespace anyattn::cpu::vec_math_test::avx2
ANYATTN_TARGET_END()

ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace anyattn::cpu::vec_math_test::avx512 {
#include "cpu/simd/vec_avx512.h"
#include "cpu/simd/vec_math-inl.h"
#include "internal/vec_math_arrays-inl.h"
}  // namespace anyattn::cpu::vec_math_test::avx512
ANYATTN_TARGET_END()

ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16,amx-tile,amx-bf16")
namespace anyattn::cpu::vec_math_test::avx512_amx {
#include "cpu/simd/vec_avx512.h"
#include "cpu/simd/vec_math-inl.h"
#include "internal/vec_math_arrays-inl.h"
}  // namespace anyattn::cpu::vec_math_test::avx512_amx
ANYATTN_TARGET_END()
#endif

#if defined(__aarch64__) || defined(_M_ARM64)
// Advanced SIMD is the AArch64 baseline, as in src/cpu/forward/fwd_neon.cc: no target region.
namespace anyattn::cpu::vec_math_test::neon {
#include "cpu/simd/vec_neon.h"
#include "cpu/simd/vec_math-inl.h"
#include "internal/vec_math_arrays-inl.h"
}  // namespace anyattn::cpu::vec_math_test::neon
#endif

namespace anyattn::cpu::vec_math_test {
namespace {

#define ANYATTN_VEC_MATH_PATH(ns, isa) \
  VecMathPath { isa, &ns::exp2_array, &ns::tanh_array, &ns::sech2_array }
const VecMathPath kPaths[] = {
    ANYATTN_VEC_MATH_PATH(portable, ANYATTN_ISA_PORTABLE),
#if defined(__x86_64__) || defined(_M_X64)
    ANYATTN_VEC_MATH_PATH(avx2, ANYATTN_ISA_AVX2),
    ANYATTN_VEC_MATH_PATH(avx512, ANYATTN_ISA_AVX512),
    ANYATTN_VEC_MATH_PATH(avx512_amx, ANYATTN_ISA_AVX512_AMX),
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
    ANYATTN_VEC_MATH_PATH(neon, ANYATTN_ISA_NEON),
#endif
};
#undef ANYATTN_VEC_MATH_PATH

}  // namespace

const VecMathPath* find_vec_math_path(anyattn_isa isa) {
  for (const VecMathPath& path : kPaths) {
    if (path.isa == isa) return &path;
  }
  return nullptr;
}

}  // namespace anyattn::cpu::vec_math_test
