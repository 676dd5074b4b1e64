// bf16 decode scores on pairwise bf16 dot products: the direct decode loop's score pass
// (fwd_decode_kernel-inl.h) for bf16 K/V on CPUs that have the instruction, each compiled in its
// own translation unit for that target: VDPBF16PS (AVX512_BF16) for the avx512 path, BFDOT
// (FEAT_BF16) for the neon path (fwd_decode_bf16_dot_neon.cc). Both kernels split a pass into
// row tiles the same way (fwd_decode_bf16_dot_tiles-inl.h).
//
// Exactness. The products of two bf16 values are exact in f32. VDPBF16PS adds each pair of them
// to the f32 accumulator with round-to-nearest, as the f32 FMA path rounds its sums; BFDOT rounds
// those additions to odd (one unit in the last place at most, where nearest errs by half). Both
// treat subnormal inputs and results as zero, so the caller uses them only for kv heads whose
// queries hold no subnormal, with |q| < 2^64 and softmax_scale <= 2^16: what they then flush (a
// subnormal key element, or a product below 2^-126) moves a score by less than 576 * 2^64 *
// 2^-126 * 2^16 < 2^-36 in softmax units (D <= 576), far below the f32 rounding of any score that
// reaches the softmax.
#ifndef ANYATTN_CPU_DECODE_FWD_DECODE_BF16_DOT_H_
#define ANYATTN_CPU_DECODE_FWD_DECODE_BF16_DOT_H_

#include <cstdint>

#include "common/fwd_args.h"
#include "cpu/decode/fwd_decode_rows.h"

namespace anyattn::cpu {

// True when bf16 scores run on the dot products: this CPU has them (the avx512 path plus
// AVX512_BF16 on x86-64, where they are taken only on CPUs whose VDPBF16PS outpaces the FMAs,
// runtime::CpuFeatures::bf16_dot_outpaces_fma; FEAT_BF16 on AArch64, where this build compiled
// the BFDOT kernel), unless the tests chose otherwise (set_bf16_dot_scores_for_tests).
bool bf16_dot_scores_available();

// The largest softmax_scale the dot-product scores take (the exactness bound above).
constexpr float kDotMaxSoftmaxScale = 65536.f;

// True when a bf16 call may score on the dot products (the direct decode loop, and the neon
// path's packed forward and backward, forward/fwd_narrow_scores.h): a CPU with the instruction, no
// rotary (a rotated q is not bf16) and softmax_scale <= kDotMaxSoftmaxScale. Which query rows
// then keep their dot-product scores is bf16_query_unfit_for_dot's test.
inline bool call_takes_bf16_dot_scores(const FwdArgs& args) {
  return args.rotary_cos == nullptr && args.softmax_scale <= kDotMaxSoftmaxScale &&
         bf16_dot_scores_available();
}

// For tests: where bf16 scores (the direct loop's, and the neon path's packed forward's and
// backward's) run: kCpuDefault as bf16_dot_scores_available says, kWhereAvailable on the dot
// products wherever the CPU has them, kOff on the f32 FMAs. Set it between calls: a call running
// while it changes may score some kv heads each way.
enum class Bf16DotScores { kCpuDefault, kWhereAvailable, kOff };
void set_bf16_dot_scores_for_tests(Bf16DotScores choice);

// True when a bf16 value (its bits) is subnormal, which the dot products flush: on the magnitude
// bits m (sign cleared) the unsigned range test 1 <= m <= 0x7F, with no branch, so that a loop
// over a row vectorises.
constexpr bool bf16_is_subnormal(uint16_t bits) {
  return static_cast<uint16_t>((bits & 0x7FFFu) - 1u) < 0x7Fu;
}

// True when a bf16 query element (its bits) keeps its kv head (in the direct decode loop) or its
// row (in the neon path's packed forward and backward) off the dot products: subnormal, or finite
// with |q| >= 2^64 (exponent field 191 to 254), the range test 0x5F80 <= m < 0x7F80.
constexpr bool bf16_query_unfit_for_dot(uint16_t bits) {
  constexpr uint16_t kLargeFirst = (127 + 64) << 7;
  constexpr uint16_t kInfBits = 0x7F80;
  const uint16_t magnitude = bits & 0x7FFFu;
  const bool large = static_cast<uint16_t>(magnitude - kLargeFirst) < kInfBits - kLargeFirst;
  return bf16_is_subnormal(bits) | large;
}

namespace avx512_bf16 {

// s[r * 64 + j] = q_r . k_j (raw, unscaled) for `rows` query rows (at most the direct loop's 20)
// and the kDirectChunkKeys keys of one pass; keys j >= `keys` score 0. q: bf16 rows of ldq elements (a multiple of 32),
// zero from head_dim to ldq; k_rows[j] for j < keys: bf16 rows of head_dim elements, read no
// further. The first tile of rows issues the pass's prefetches (PassPrefetcher::line) next to its
// loads of the same lines (none when prefetch is null).
void chunk_scores(const uint16_t* q, int64_t ldq, int64_t rows, const void* const* k_rows,
                  int64_t keys, int64_t head_dim, const PassPrefetcher* prefetch, float* s);

// O += P V of one pass on VDPBF16PS for `rows` query rows (at most kMaxQBlockRows) and the pass's
// `keys` (at most kDirectChunkKeys) bf16 V rows of head_dim_v elements, a multiple of 32: p holds
// the probabilities (row stride 64), each rounded once to bf16 here; O rows (stride ldo) hold
// their columns in the bf16 loop's paired order (fwd_decode_kernel-inl.h, split_pairs). Issues
// the pass's prefetch hints (none when prefetch is null). Returns false, with O untouched, when a
// V value is subnormal: the dot products would flush it (fwd_decode_pv_bf16_dot_avx512.cc).
bool chunk_pv_pairs(const float* p, int64_t rows, const void* const* v_rows, int64_t keys,
                    int64_t head_dim_v, const PassPrefetcher* prefetch, float* o, int64_t ldo);

// The same from V already in the value pairs' layout (`pairs`: (keys + 1) / 2 pair rows of
// head_dim_v words, as kv8_widen.h's widen_kv8_value_pairs writes them, no subnormal value).
void pairs_pv(const float* p, int64_t rows, const uint32_t* pairs, int64_t keys,
              int64_t head_dim_v, float* o, int64_t ldo);

}  // namespace avx512_bf16

// The same on BFDOT: k_rows read to head_dim exactly (a row tail goes through a zeroed buffer); q
// rows of ldq elements, a multiple of 8, zero from head_dim on.
namespace neon_bf16 {
void chunk_scores(const uint16_t* q, int64_t ldq, int64_t rows, const void* const* k_rows,
                  int64_t keys, int64_t head_dim, const PassPrefetcher* prefetch, float* s);
}  // namespace neon_bf16
}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_DECODE_FWD_DECODE_BF16_DOT_H_
