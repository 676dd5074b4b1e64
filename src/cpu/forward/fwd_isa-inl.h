// One ISA path's forward kernels: fwd_kernel-inl.h and the direct decode loop compiled against the
// path's vector interface, in namespace anyattn::cpu::<id> inside the path's target region.
//
// Included once per row of isa_table.inc that the target compiles, by the translation unit
// src/CMakeLists.txt generates for it (<build>/src/isa/fwd_<id>.cc), after
//   ANYATTN_PATH_ID     the row's id (the namespace)
//   simd/traits_<id>.h  what the path is compiled with:
//     ANYATTN_PATH_TARGET_BEGIN() / END()  its target region (simd/isa_target.h), empty at the
//                                          baseline
//     ANYATTN_PATH_VEC                     its vector interface, e.g. "cpu/simd/vec_avx2.h"
//     ANYATTN_PATH_SCORE_ROWS, _SCORE_VECS, _PV_ROWS, _PV_VECS
//                                          the register tiles of the two products (rows x vectors)
//     ANYATTN_PATH_DIRECT_KEY_GROUP        keys whose dot products the direct decode loop forms
//                                          together (R x G accumulators)
//   and, where the path has them:
//     ANYATTN_PATH_DIRECT_LOOP             a path whose direct decode loop this one runs instead
//                                          of compiling its own
//     ANYATTN_DIRECT_BF16_DOT              the direct loop's bf16 scores on pairwise dot
//                                          products (decode/fwd_decode_bf16_dot.h), run by
//                                          ANYATTN_DIRECT_BF16_DOT_SCORES
//     ANYATTN_DIRECT_KV8_WIDEN             with them, 8-bit rows widened to bf16 once per pass
//                                          for many rows per kv head (decode/kv8_widen.h)
//     ANYATTN_FWD_BF16_TILES               bf16 calls on AMX tiles (amx/fwd_tiles_amx-inl.h)
//     ANYATTN_FWD_NARROW_SCORES            the packed forward's bf16 scores on pairwise dot
//                                          products (forward/fwd_narrow_scores-inl.h), whose
//                                          kernels are in namespace
//                                          ANYATTN_NARROW_BF16_KERNELS
//     ANYATTN_NARROW_F16                   with them, f16 scores on FMLAL
//     ANYATTN_NARROW_BF16_PV               with them, P V on the same instructions for calls
//                                          that allow bf16 probabilities (block_pv)
// Defines pack_block, attend and attend_direct (registered by kernel_registry.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/fwd_args.h"
#include "common/head_dims.h"
#include "cpu/forward/finalize.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"
#include "cpu/shared/rotary.h"
#include "plan/fwd_layout.h"

#if defined(ANYATTN_FWD_NARROW_SCORES)
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/decode/kv8_widen.h"
#include "cpu/forward/fwd_narrow_scores.h"
#endif

#if defined(ANYATTN_PATH_DIRECT_LOOP)
namespace anyattn::cpu::ANYATTN_PATH_DIRECT_LOOP {
void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch);
}  // namespace anyattn::cpu::ANYATTN_PATH_DIRECT_LOOP
#else
// The direct decode loop's headers (decode/fwd_decode_kernel-inl.h).
#include <type_traits>

#include "cpu/decode/e4m3_read.h"
#include "cpu/decode/fwd_decode_rows.h"
#include "cpu/shared/float_env.h"
#include "cpu/decode/kv8_widen.h"
#if defined(ANYATTN_DIRECT_BF16_DOT)
#include "cpu/decode/fwd_decode_bf16_dot.h"
#endif
#endif

ANYATTN_PATH_TARGET_BEGIN()
namespace anyattn::cpu::ANYATTN_PATH_ID {

#include ANYATTN_PATH_VEC

// Written against the Vec type just above: keep it a block of its own.
#include "cpu/simd/vec_math-inl.h"

constexpr int kScoreRows = ANYATTN_PATH_SCORE_ROWS;
constexpr int kScoreVecs = ANYATTN_PATH_SCORE_VECS;
constexpr int kPvRows = ANYATTN_PATH_PV_ROWS;
constexpr int kPvVecs = ANYATTN_PATH_PV_VECS;
#if !defined(ANYATTN_PATH_DIRECT_LOOP)
constexpr int kDirectKeyGroup = ANYATTN_PATH_DIRECT_KEY_GROUP;
#endif

#include "cpu/forward/fwd_kernel-inl.h"

#if defined(ANYATTN_PATH_DIRECT_LOOP)
void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch) {
  ANYATTN_PATH_DIRECT_LOOP::attend_direct(args, layout, task, scratch);
}
#else
// The direct decode loop uses fwd_kernel-inl.h's helpers: keep it after that file.
#include "cpu/decode/fwd_decode_kernel-inl.h"
#endif

}  // namespace anyattn::cpu::ANYATTN_PATH_ID
ANYATTN_PATH_TARGET_END()
