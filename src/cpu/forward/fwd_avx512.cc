// The forward kernels for the avx512 path: fwd_kernel-inl.h compiled against vec_avx512.h.
// Registered by its row in isa_table.inc.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/forward/finalize.h"
#include "cpu/forward/fwd_args.h"
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/decode/fwd_decode_rows.h"
#include "cpu/forward/fwd_layout.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"
#include "cpu/shared/rotary.h"
#include "cpu/simd/isa_target.h"

// GCC 12 reports the deliberately undefined upper halves inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as uninitialised (GCC bug 105593); the warnings are false positives.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
namespace anyattn::cpu::avx512 {

#include "cpu/simd/vec_avx512.h"
#include "cpu/simd/vec_math-inl.h"

// Register tiles: 6 rows x 4 vectors (24 accumulators) for both products. Taller, narrower tiles
// (12 x 2), which halve the K or V panel bytes read per FMA, were slower (measured:
// bench/MEASUREMENTS.md, "Design constants").
constexpr int kScoreRows = 6;
constexpr int kScoreVecs = 4;
constexpr int kPvRows = 6;
constexpr int kPvVecs = 4;
// Keys whose dot products the direct decode loop forms together (R x G accumulators).
constexpr int kDirectKeyGroup = 4;

#include "cpu/forward/fwd_kernel-inl.h"
// The direct decode loop uses fwd_kernel-inl.h's helpers: keep it after that file. Its bf16
// scores run on VDPBF16PS where the CPU has it (fwd_decode_bf16_dot.h).
#define ANYATTN_DIRECT_BF16_DOT 1
#include "cpu/decode/fwd_decode_kernel-inl.h"
#undef ANYATTN_DIRECT_BF16_DOT

}  // namespace anyattn::cpu::avx512
ANYATTN_TARGET_END()
