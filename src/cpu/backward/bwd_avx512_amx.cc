// The backward kernels for the avx512_amx path: bwd_kernel-inl.h compiled against vec_avx512.h,
// with the five products of bf16 calls on AMX tiles (bwd_tiles_amx-inl.h). Registered by
// its row in isa_table.inc.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/backward/bwd_args.h"
#include "cpu/backward/bwd_layout.h"
#include "cpu/backward/bwd_philox.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"
#include "cpu/simd/isa_target.h"

// GCC 12 reports the deliberately undefined upper halves inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as uninitialised (GCC bug 105593); the warnings are false positives.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define ANYATTN_BWD_BF16_TILES 1

ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16,amx-tile,amx-bf16")
namespace anyattn::cpu::bwd_avx512_amx {

#include "cpu/simd/vec_avx512.h"
#include "cpu/simd/vec_math-inl.h"

// The FMA micro-kernel's register tile, as on avx512 (bwd_avx512.cc).
constexpr int kGemmRows = 6;
constexpr int kGemmVecs = 4;

#include "cpu/backward/bwd_philox_avx512-inl.h"

// The dropout factors of 64 keys, in AVX-512 integer code.
inline void dropout_row_factors(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                uint32_t threshold, float keep_scale, float* factor) {
  dropout_keep_factors64_avx512(key, b, h, i, j0, threshold, keep_scale, factor);
}

#include "cpu/amx/amx_tiles-inl.h"
#include "cpu/backward/bwd_kernel-inl.h"

}  // namespace anyattn::cpu::bwd_avx512_amx
ANYATTN_TARGET_END()
