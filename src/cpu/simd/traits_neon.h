// What the neon path is compiled with (isa_table.inc's neon row): Advanced SIMD, AArch64's
// baseline, so no target region. The settings every traits_<id>.h gives are listed in
// forward/fwd_isa-inl.h and backward/bwd_isa-inl.h, which read them.
//
// Register tiles, for AArch64's 32 vector registers of 4 floats.
// - Forward, both micro-kernels with ANYATTN_FWD_LANE_PRODUCTS: per step of 4 depth indices
//   (head-dim indices for S, keys for P V) a tile of R rows x NV vectors loads one vector of 4 A
//   values per row (q or P: R registers) and the 4 x NV B vectors of those indices (K^T or V
//   rows), and does 4 * R * NV FMLAs by element into R * NV accumulators. With R = NV = 4:
//   16 accumulators + 4 A vectors + up to 16 B vectors (compilers load them a few indices ahead);
//   64 FMLAs for 12 to 18 loads. 5 x 4 spills accumulators; 6 x 2 does 48 FMLAs for about the
//   same loads. S's 16 keys divide the 64-key block.
// - Direct decode: 4 keys per group, so that R x 4 accumulators (at most 16) reduce with one
//   lane_sums per row.
// - Backward C += A B: 5 rows x 4 vectors: 20 accumulators, the 4 B vectors of one k and the
//   5 A values of that k take 29 registers; each k step does 20 FMAs for 2 LDP and 5 scalar
//   loads. 6 x 4 would need 34 and spill accumulators inside the loop.
#ifndef ANYATTN_CPU_SIMD_TRAITS_NEON_H_
#define ANYATTN_CPU_SIMD_TRAITS_NEON_H_

#include <arm_neon.h>

#define ANYATTN_PATH_TARGET_BEGIN()
#define ANYATTN_PATH_TARGET_END()
#define ANYATTN_PATH_VEC "cpu/simd/vec_neon.h"

// The forward's micro-kernels load q and P kLanes values at a time and multiply by lane
// (vec_neon.h's fma_lane).
#define ANYATTN_FWD_LANE_PRODUCTS 1

#define ANYATTN_PATH_SCORE_ROWS 4
#define ANYATTN_PATH_SCORE_VECS 4
#define ANYATTN_PATH_PV_ROWS 4
#define ANYATTN_PATH_PV_VECS 4
#define ANYATTN_PATH_DIRECT_KEY_GROUP 4
#define ANYATTN_PATH_GEMM_ROWS 5
#define ANYATTN_PATH_GEMM_VECS 4

// The direct decode loop's bf16 scores run on BFDOT where the CPU has FEAT_BF16 and the build
// compiled its kernel (decode/fwd_decode_bf16_dot.h).
#if defined(ANYATTN_NEON_BF16_DOT)
#define ANYATTN_DIRECT_BF16_DOT 1
#define ANYATTN_DIRECT_BF16_DOT_SCORES neon_bf16::chunk_scores
#endif

// The packed forward's bf16 and f16 scores, and the backward's S and dP, on BFDOT and FMLAL where
// the CPU has them and the build compiled their kernels (forward/fwd_narrow_scores.h).
#if defined(ANYATTN_NEON_BF16_DOT) && defined(ANYATTN_NEON_F16_FML)
#define ANYATTN_FWD_NARROW_SCORES 1
#define ANYATTN_NARROW_BF16_KERNELS neon_bf16
#define ANYATTN_NARROW_F16 1
#define ANYATTN_BWD_NARROW_SCORES 1
// With them, the P V of bf16 calls that allow bf16 probabilities (ANYATTN_PRECISION_FAST), and
// the backward's dV, dK and dQ of such calls.
#define ANYATTN_NARROW_BF16_PV 1
#endif

#endif  // ANYATTN_CPU_SIMD_TRAITS_NEON_H_
