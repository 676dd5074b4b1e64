// The backward kernels for the avx2 path: bwd_kernel-inl.h compiled against vec_avx2.h.
// Registered by its row in isa_table.inc.
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

ANYATTN_TARGET_BEGIN("avx2,fma,f16c")
namespace anyattn::cpu::bwd_avx2 {

#include "cpu/simd/vec_avx2.h"
#include "cpu/simd/vec_math-inl.h"

constexpr int kGemmRows = 6;
constexpr int kGemmVecs = 2;

// The dropout factors of 64 keys: the portable loop, vectorised by the compiler in this region.
inline void dropout_row_factors(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                uint32_t threshold, float keep_scale, float* factor) {
  dropout_keep_factors64(key, b, h, i, j0, threshold, keep_scale, factor);
}

#include "cpu/backward/bwd_kernel-inl.h"

}  // namespace anyattn::cpu::bwd_avx2
ANYATTN_TARGET_END()
