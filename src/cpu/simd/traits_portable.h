// What the portable path is compiled with (isa_table.inc's portable row): the baseline
// instruction set, no target region. The settings every traits_<id>.h gives are listed in
// forward/fwd_isa-inl.h and backward/bwd_isa-inl.h, which read them.
#ifndef ANYATTN_CPU_SIMD_TRAITS_PORTABLE_H_
#define ANYATTN_CPU_SIMD_TRAITS_PORTABLE_H_

#define ANYATTN_PATH_TARGET_BEGIN()
#define ANYATTN_PATH_TARGET_END()
#define ANYATTN_PATH_VEC "cpu/simd/vec_portable.h"

// Register tiles, in rows x vectors of kLanes floats.
#define ANYATTN_PATH_SCORE_ROWS 4
#define ANYATTN_PATH_SCORE_VECS 2
#define ANYATTN_PATH_PV_ROWS 4
#define ANYATTN_PATH_PV_VECS 2
#define ANYATTN_PATH_DIRECT_KEY_GROUP 2
#define ANYATTN_PATH_GEMM_ROWS 4
#define ANYATTN_PATH_GEMM_VECS 2

#endif  // ANYATTN_CPU_SIMD_TRAITS_PORTABLE_H_
