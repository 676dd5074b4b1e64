// The forward kernels for the neon path: fwd_kernel-inl.h compiled against vec_neon.h.
// Registered by its row in isa_table.inc.
//
// Register tiles, for AArch64's 32 vector registers of 4 floats. A tile of R rows x NV vectors keeps
// R * NV accumulators; each depth step loads NV B vectors (K^T or V rows, two per LDP) and one
// A value per row, which the compiler keeps in registers for the whole step: R * NV + NV + R
// registers must fit in 32, or accumulators spill to the stack inside the loop.
//   S = Q K^T  5 rows x 4 vectors (5 x 16 keys): 20 + 4 + 5 = 29 registers; 20 FMAs for 2 LDP and
//              5 scalar loads per head-dim index. The 16 keys divide the 64-key block (kScoreVecs
//              of 1, 2, 4 or 8 only); 6 x 4 needs 34 registers and spills accumulators inside the loop,
//              and 2 x 8 does 16 FMAs for 6 loads.
//   O += P V   5 rows x 4 vectors (5 x 16 output columns), the same count, with the V row of one
//              key and one probability per row.
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

constexpr int kScoreRows = 5;
constexpr int kScoreVecs = 4;
constexpr int kPvRows = 5;
constexpr int kPvVecs = 4;
// Keys whose dot products the direct decode loop forms together (R x G accumulators).
constexpr int kDirectKeyGroup = 4;

#include "cpu/forward/fwd_kernel-inl.h"
// The direct decode loop uses fwd_kernel-inl.h's helpers: keep it after that file.
#include "cpu/decode/fwd_decode_kernel-inl.h"

}  // namespace anyattn::cpu::neon
