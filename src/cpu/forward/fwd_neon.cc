// The forward kernels for the neon path: fwd_kernel-inl.h compiled against vec_neon.h.
// Registered by its row in isa_table.inc.
//
// Register tiles, for AArch64's 32 vector registers of 4 floats. Both micro-kernels run with
// ANYATTN_FWD_LANE_PRODUCTS: per step of 4 depth indices (head-dim indices for S, keys for P V) a
// tile of R rows x NV vectors loads one vector of 4 A values per row (q or P: R registers), the
// 4 x NV B vectors of those indices (K^T or V rows), and does 4 * R * NV FMLAs by element into
// R * NV accumulators. With R = NV = 4: 16 accumulators + 4 A vectors + 16 B vectors = 36 if the
// compiler loads every B vector of the step first, which it may only partly do (GCC and clang load
// them a few indices ahead); 64 FMLAs for 12 to 18 loads. 5 x 4 adds 5 registers and the loop
// spills accumulators; 6 x 2 has 48 FMLAs for about the same loads. S's 16 keys divide the 64-key
// block (kScoreVecs of 1, 2, 4 or 8 only).
//   S = Q K^T  4 rows x 4 vectors (4 x 16 keys).
//   O += P V   4 rows x 4 vectors (4 x 16 output columns).
//   Direct decode: 4 keys per group, so that R x 4 accumulators (at most 16) reduce with one
//              lane_sums per row; the same group as on AVX-512, where a group is a quarter of a
//              vector of scores, here a whole one.
#include <arm_neon.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/forward/finalize.h"
#include "cpu/forward/fwd_args.h"
#include "cpu/decode/fwd_decode_rows.h"
#include "cpu/forward/fwd_layout.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"
#include "cpu/shared/rotary.h"

// Advanced SIMD is AArch64's baseline: the path needs no target region.
namespace anyattn::cpu::neon {

#include "cpu/simd/vec_neon.h"
#include "cpu/simd/vec_math-inl.h"

// Both micro-kernels load q and P kLanes values at a time and multiply by lane (fma_lane).
#define ANYATTN_FWD_LANE_PRODUCTS 1

constexpr int kScoreRows = 4;
constexpr int kScoreVecs = 4;
constexpr int kPvRows = 4;
constexpr int kPvVecs = 4;
// Keys whose dot products the direct decode loop forms together (R x G accumulators).
constexpr int kDirectKeyGroup = 4;

#include "cpu/forward/fwd_kernel-inl.h"
// The direct decode loop uses fwd_kernel-inl.h's helpers: keep it after that file.
#include "cpu/decode/fwd_decode_kernel-inl.h"

}  // namespace anyattn::cpu::neon
