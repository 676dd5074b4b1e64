// What the avx2 path is compiled with (isa_table.inc's avx2 row). The settings every
// traits_<id>.h gives are listed in forward/fwd_isa-inl.h and backward/bwd_isa-inl.h, which read
// them.
#ifndef ANYATTN_CPU_SIMD_TRAITS_AVX2_H_
#define ANYATTN_CPU_SIMD_TRAITS_AVX2_H_

#include <immintrin.h>

#include "cpu/simd/isa_target.h"

#define ANYATTN_PATH_TARGET_BEGIN() ANYATTN_TARGET_BEGIN("avx2,fma,f16c")
#define ANYATTN_PATH_TARGET_END() ANYATTN_TARGET_END()
#define ANYATTN_PATH_VEC "cpu/simd/vec_avx2.h"

// Register tiles, in rows x vectors of kLanes floats (16 ymm registers).
#define ANYATTN_PATH_SCORE_ROWS 6
#define ANYATTN_PATH_SCORE_VECS 2
#define ANYATTN_PATH_PV_ROWS 6
#define ANYATTN_PATH_PV_VECS 2
#define ANYATTN_PATH_DIRECT_KEY_GROUP 2
#define ANYATTN_PATH_GEMM_ROWS 6
#define ANYATTN_PATH_GEMM_VECS 2

#endif  // ANYATTN_CPU_SIMD_TRAITS_AVX2_H_
