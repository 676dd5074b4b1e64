// What the avx512_amx path is compiled with (isa_table.inc's avx512_amx row): the avx512 path's
// vector code (traits_avx512.h) in a region that adds AVX512_BF16, AMX-TILE and AMX-BF16, with the
// products of bf16 calls on AMX tiles. The settings every traits_<id>.h gives are listed in
// forward/fwd_isa-inl.h and backward/bwd_isa-inl.h, which read them.
#ifndef ANYATTN_CPU_SIMD_TRAITS_AVX512_AMX_H_
#define ANYATTN_CPU_SIMD_TRAITS_AVX512_AMX_H_

// The vector interface, register tiles, dropout factors and GCC warning settings of avx512.
#include "cpu/simd/traits_avx512.h"

#undef ANYATTN_PATH_TARGET_BEGIN
#define ANYATTN_PATH_TARGET_BEGIN() \
  ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16,amx-tile,amx-bf16")

// Forward: bf16 calls pack and attend with the tile products of amx/fwd_tiles_amx-inl.h; streaming
// tasks of at most direct_rows rows per kv head (isa_table.inc) run the avx512 path's direct loop
// (memory-bound: tiles would not help), so this path compiles none of its own.
#define ANYATTN_FWD_BF16_TILES 1
#define ANYATTN_PATH_DIRECT_LOOP avx512
#undef ANYATTN_PATH_DIRECT_KEY_GROUP
#undef ANYATTN_DIRECT_BF16_DOT
#undef ANYATTN_DIRECT_BF16_DOT_SCORES
#undef ANYATTN_DIRECT_KV8_WIDEN
#undef ANYATTN_FWD_NARROW_SCORES
#undef ANYATTN_BWD_NARROW_SCORES
#undef ANYATTN_NARROW_BF16_KERNELS
#undef ANYATTN_NARROW_BF16_PV

// Backward: the five products of bf16 calls on AMX tiles (amx/bwd_tiles_amx-inl.h; the unit
// tells the driver through bwd_avx512_amx::bwd_copies).
#define ANYATTN_BWD_BF16_TILES 1

#endif  // ANYATTN_CPU_SIMD_TRAITS_AVX512_AMX_H_
