// The backward kernels for the portable path: bwd_kernel-inl.h compiled against vec_portable.h.
// Registered in bwd_kernels.inc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/bwd_args.h"
#include "cpu/bwd_layout.h"
#include "cpu/half.h"
#include "cpu/bwd_philox.h"

namespace anyattn::cpu::bwd_portable {

#include "cpu/simd/vec_portable.h"

// After Vec: exp2 and tanh are written against it.
#include "cpu/simd/vec_math-inl.h"

constexpr int kGemmRows = 4;
constexpr int kGemmVecs = 2;

#include "cpu/bwd_kernel-inl.h"

}  // namespace anyattn::cpu::bwd_portable
