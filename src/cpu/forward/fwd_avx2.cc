// The forward kernels for the avx2 path: fwd_kernel-inl.h compiled against vec_avx2.h.
// Registered by its row in isa_table.inc.
#include <immintrin.h>
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
#include "cpu/simd/isa_target.h"

ANYATTN_TARGET_BEGIN("avx2,fma,f16c")
namespace anyattn::cpu::avx2 {

#include "cpu/simd/vec_avx2.h"
#include "cpu/simd/vec_math-inl.h"

constexpr int kScoreRows = 6;
constexpr int kScoreVecs = 2;
constexpr int kPvRows = 6;
constexpr int kPvVecs = 2;
// Keys whose dot products the direct decode loop forms together (R x G accumulators).
constexpr int kDirectKeyGroup = 2;

#include "cpu/forward/fwd_kernel-inl.h"
// The direct decode loop uses fwd_kernel-inl.h's helpers: keep it after that file.
#include "cpu/decode/fwd_decode_kernel-inl.h"

}  // namespace anyattn::cpu::avx2
ANYATTN_TARGET_END()
