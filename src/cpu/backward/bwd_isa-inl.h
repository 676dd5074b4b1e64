// One ISA path's backward kernels: bwd_kernel-inl.h compiled against the path's vector interface,
// in namespace anyattn::cpu::bwd_<id> inside the path's target region.
//
// Included once per row of isa_table.inc that the target compiles, by the translation unit
// src/CMakeLists.txt generates for it (<build>/src/isa/bwd_<id>.cc), after
//   ANYATTN_PATH_ID             the row's id
//   simd/traits_<id>.h          what the path is compiled with:
//     ANYATTN_PATH_TARGET_BEGIN() / END(), ANYATTN_PATH_VEC   as for the forward (fwd_isa-inl.h)
//     ANYATTN_PATH_GEMM_ROWS, _GEMM_VECS  the register tile of the C += A B micro-kernel
//   and, where the path has them:
//     ANYATTN_PATH_DROPOUT_HEADER, ANYATTN_PATH_DROPOUT_FACTORS
//                                 a header of the path's own dropout factors and its function,
//                                 in place of bwd_philox.h's portable dropout_keep_factors64
//     ANYATTN_BWD_BF16_TILES      the products of bf16 calls on AMX tiles
//                                 (amx/bwd_tiles_amx-inl.h)
//     ANYATTN_BWD_NARROW_SCORES   S and dP of bf16 calls on pairwise dot products, and of f16
//                                 calls on FMLAL with ANYATTN_NARROW_F16, and with
//                                 ANYATTN_NARROW_BF16_PV dV, dK and dQ of bf16 calls that allow
//                                 bf16 probabilities (backward/bwd_narrow_scores-inl.h)
// Defines row_dots, bwd_task, reduce_dq, reduce_dkv and bwd_copies (registered by
// backward/bwd_driver.cc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/bwd_args.h"
#include "common/head_dims.h"
#include "cpu/backward/bwd_philox.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"
#include "plan/bwd_layout.h"

#if defined(ANYATTN_BWD_NARROW_SCORES)
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/forward/fwd_narrow_scores.h"
#endif

// The kernels' namespace, bwd_<id>.
#define ANYATTN_PATH_BWD_NAMESPACE_OF(id) ANYATTN_PATH_BWD_NAMESPACE_PASTE(id)
#define ANYATTN_PATH_BWD_NAMESPACE_PASTE(id) bwd_##id
#define ANYATTN_PATH_BWD_NAMESPACE ANYATTN_PATH_BWD_NAMESPACE_OF(ANYATTN_PATH_ID)

#if !defined(ANYATTN_PATH_DROPOUT_FACTORS)
#define ANYATTN_PATH_DROPOUT_FACTORS dropout_keep_factors64
#endif

ANYATTN_PATH_TARGET_BEGIN()
namespace anyattn::cpu::ANYATTN_PATH_BWD_NAMESPACE {

#include ANYATTN_PATH_VEC

// After Vec: exp2 and tanh are written against it.
#include "cpu/simd/vec_math-inl.h"

constexpr int kGemmRows = ANYATTN_PATH_GEMM_ROWS;
constexpr int kGemmVecs = ANYATTN_PATH_GEMM_VECS;

#if defined(ANYATTN_PATH_DROPOUT_HEADER)
#include ANYATTN_PATH_DROPOUT_HEADER
#endif

// The dropout factors of 64 keys of one row (bwd_kernel-inl.h). The portable loop is vectorised
// by the compiler in this region.
inline void dropout_row_factors(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                uint32_t threshold, float keep_scale, float* factor) {
  ANYATTN_PATH_DROPOUT_FACTORS(key, b, h, i, j0, threshold, keep_scale, factor);
}

#if defined(ANYATTN_BWD_BF16_TILES)
#include "cpu/amx/amx_tiles-inl.h"
#endif
#include "cpu/backward/bwd_kernel-inl.h"

// The operand copies this path packs for a call (BwdCopies): the driver sizes the scratch from
// them and bwd_task follows the layout.
BwdCopies bwd_copies(const FwdArgs& f) {
  BwdCopies copies;
#if defined(ANYATTN_BWD_BF16_TILES)
  copies.bf16_tiles = f.dtype == DType::kBF16;
#endif
#if defined(ANYATTN_BWD_NARROW_SCORES)
  const NarrowScores format = narrow_scores_of(f);
  copies.rows16 = format != NarrowScores::kNone;
  copies.bf16_pairs = takes_bf16_pairs(f, format);
#endif
  (void)f;
  return copies;
}

}  // namespace anyattn::cpu::ANYATTN_PATH_BWD_NAMESPACE
ANYATTN_PATH_TARGET_END()
