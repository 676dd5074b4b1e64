// The forward kernels for the avx512_amx path: fwd_kernel-inl.h compiled against vec_avx512.h with
// the bf16 tile products of fwd_tiles_amx-inl.h. Registered by its row in isa_table.inc.
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/forward/finalize.h"
#include "cpu/forward/fwd_args.h"
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

namespace anyattn::cpu::avx512 {
void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch);
}  // namespace anyattn::cpu::avx512

#define ANYATTN_FWD_BF16_TILES 1

ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16,amx-tile,amx-bf16")
namespace anyattn::cpu::avx512_amx {

#include "cpu/simd/vec_avx512.h"
#include "cpu/simd/vec_math-inl.h"

// The vector products' register tiles, as on avx512 (fwd_avx512.cc).
constexpr int kScoreRows = 6;
constexpr int kScoreVecs = 4;
constexpr int kPvRows = 6;
constexpr int kPvVecs = 4;

#include "cpu/forward/fwd_kernel-inl.h"

// Streaming tasks of at most kDirectMaxRows rows per kv head read K and V where they lie, with
// the vector arithmetic: the avx512 path's loop (memory-bound; tiles would not help).
void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch) {
  avx512::attend_direct(args, layout, task, scratch);
}

}  // namespace anyattn::cpu::avx512_amx
ANYATTN_TARGET_END()
