// The backward kernels for the portable path: bwd_kernel-inl.h compiled against vec_portable.h.
// Registered by its row in isa_table.inc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/backward/bwd_args.h"
#include "cpu/backward/bwd_layout.h"
#include "cpu/backward/bwd_philox.h"
#include "cpu/shared/half.h"
#include "cpu/shared/prefetch.h"

namespace anyattn::cpu::bwd_portable {

#include "cpu/simd/vec_portable.h"

// After Vec: exp2 and tanh are written against it.
#include "cpu/simd/vec_math-inl.h"

constexpr int kGemmRows = 4;
constexpr int kGemmVecs = 2;

// The dropout factors of 64 keys: the portable loop, vectorised by the compiler in this region.
inline void dropout_row_factors(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                uint32_t threshold, float keep_scale, float* factor) {
  dropout_keep_factors64(key, b, h, i, j0, threshold, keep_scale, factor);
}

#include "cpu/backward/bwd_kernel-inl.h"

}  // namespace anyattn::cpu::bwd_portable
