// What the avx512 path is compiled with (isa_table.inc's avx512 row). The settings every
// traits_<id>.h gives are listed in forward/fwd_isa-inl.h and backward/bwd_isa-inl.h, which read
// them.
#ifndef ANYATTN_CPU_SIMD_TRAITS_AVX512_H_
#define ANYATTN_CPU_SIMD_TRAITS_AVX512_H_

#include "cpu/simd/avx512_intrinsics.h"
#include "cpu/simd/isa_target.h"

#define ANYATTN_PATH_TARGET_BEGIN() \
  ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#define ANYATTN_PATH_TARGET_END() ANYATTN_TARGET_END()
#define ANYATTN_PATH_VEC "cpu/simd/vec_avx512.h"

// Register tiles, in rows x vectors of kLanes floats: 6 x 4 (24 of the 32 zmm registers
// accumulate) for both forward products and the backward's micro-kernel. Taller, narrower tiles
// (12 x 2), which halve the K or V panel bytes read per FMA, were slower (bench/MEASUREMENTS.md,
// "Design constants").
#define ANYATTN_PATH_SCORE_ROWS 6
#define ANYATTN_PATH_SCORE_VECS 4
#define ANYATTN_PATH_PV_ROWS 6
#define ANYATTN_PATH_PV_VECS 4
#define ANYATTN_PATH_DIRECT_KEY_GROUP 4
#define ANYATTN_PATH_GEMM_ROWS 6
#define ANYATTN_PATH_GEMM_VECS 4

// The direct decode loop's bf16 scores run on VDPBF16PS where the CPU has it and it outpaces the
// FMAs (decode/fwd_decode_bf16_dot.h).
#define ANYATTN_DIRECT_BF16_DOT 1
#define ANYATTN_DIRECT_BF16_DOT_SCORES avx512_bf16::chunk_scores
// and, for tasks of many query rows per kv head, widens 8-bit caches' rows to bf16 once per pass
// for them (decode/kv8_widen.h). Calls that allow bf16 probabilities take the P V of bf16 caches
// there too (chunk_pv_pairs), and of 8-bit caches from V rows widened straight into its pairs.
#define ANYATTN_DIRECT_KV8_WIDEN avx512_vbmi::widen_kv8_rows
#define ANYATTN_DIRECT_KV8_WIDEN_PAIRS avx512_vbmi::widen_kv8_value_pairs
#define ANYATTN_DIRECT_BF16_PV avx512_bf16::chunk_pv_pairs
#define ANYATTN_DIRECT_BF16_PAIRS_PV avx512_bf16::pairs_pv
// The packed forward's bf16 scores, and the backward's S and dP of bf16 calls, run on the same
// instruction there (forward/fwd_narrow_scores.h).
#define ANYATTN_FWD_NARROW_SCORES 1
#define ANYATTN_BWD_NARROW_SCORES 1
#define ANYATTN_NARROW_BF16_KERNELS avx512_bf16
// With them, the P V of bf16 calls that allow bf16 probabilities (ANYATTN_PRECISION_FAST), and
// the backward's dV, dK and dQ of such calls.
#define ANYATTN_NARROW_BF16_PV 1

// The backward's dropout factors in AVX-512 integer code.
#define ANYATTN_PATH_DROPOUT_HEADER "cpu/backward/bwd_philox_avx512-inl.h"
#define ANYATTN_PATH_DROPOUT_FACTORS dropout_keep_factors64_avx512

#endif  // ANYATTN_CPU_SIMD_TRAITS_AVX512_H_
