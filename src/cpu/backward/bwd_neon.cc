// The backward kernels for the neon path: bwd_kernel-inl.h compiled against vec_neon.h.
// Registered by its row in isa_table.inc.
//
// Register tile of C += A B, for AArch64's 32 vector registers of 4 floats: 5 rows x 4 vectors
// (5 x 16 columns): 20 accumulators, the 4 B vectors of one k and the 5 A values of that k (the
// compiler loads them all before the FMAs) take 29 registers; each k step does 20 FMAs for
// 2 LDP and 5 scalar loads. 6 x 4 would need 34 and spill accumulators inside the loop.
#include <arm_neon.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/backward/bwd_args.h"
#include "cpu/backward/bwd_layout.h"
#include "cpu/backward/bwd_philox.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"

// Advanced SIMD is AArch64's baseline: the path needs no target region.
namespace anyattn::cpu::bwd_neon {

#include "cpu/simd/vec_neon.h"
#include "cpu/simd/vec_math-inl.h"

constexpr int kGemmRows = 5;
constexpr int kGemmVecs = 4;

// The dropout factors of 64 keys: the portable loop, vectorised by the compiler.
inline void dropout_row_factors(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                uint32_t threshold, float keep_scale, float* factor) {
  dropout_keep_factors64(key, b, h, i, j0, threshold, keep_scale, factor);
}

#include "cpu/backward/bwd_kernel-inl.h"

}  // namespace anyattn::cpu::bwd_neon
