// The forward kernels for the portable path: fwd_kernel-inl.h compiled against vec_portable.h.
// Registered by its row in isa_table.inc.
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

namespace anyattn::cpu::portable {

#include "cpu/simd/vec_portable.h"

// Written against the Vec type just above: keep it a block of its own.
#include "cpu/simd/vec_math-inl.h"

constexpr int kScoreRows = 4;
constexpr int kScoreVecs = 2;
constexpr int kPvRows = 4;
constexpr int kPvVecs = 2;
// Keys whose dot products the direct decode loop forms together (R x G accumulators).
constexpr int kDirectKeyGroup = 2;

#include "cpu/forward/fwd_kernel-inl.h"
// The direct decode loop uses fwd_kernel-inl.h's helpers: keep it after that file.
#include "cpu/decode/fwd_decode_kernel-inl.h"

}  // namespace anyattn::cpu::portable
