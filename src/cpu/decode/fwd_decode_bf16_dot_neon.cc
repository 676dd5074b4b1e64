// The direct decode loop's bf16 score pass on BFDOT (FEAT_BF16; fwd_decode_bf16_dot.h), the
// AArch64 counterpart of fwd_decode_bf16_dot.cc's VDPBF16PS kernel.
//
// Design. One pass: kDirectChunkKeys (16) keys of one kv head against up to 12 query rows, in
// tiles of up to 4 rows. Per group of 4 keys, R x 4 accumulators; each 16-byte load of a K row
// holds 8 bf16 values, which one BFDOT multiplies by 8 q values and adds in pairs into 4 f32
// lanes: no widening, and half the instructions of the f32 FMAs per K element. A row tail of
// fewer than 8 elements is copied into a zeroed 8-element buffer, so no byte past head_dim is
// read; q is zero there. The accumulators of 4 keys are reduced by lane_sums into one vector of 4
// scores per row, stored to S (in L1). The first row tile issues the pass's prefetches, for each
// 64 bytes of K it loads that line's two hints (PassPrefetcher::line), as the f32 path does.
//
// Exactness. The products of two bf16 values are exact in f32. Without FEAT_EBF16 (or with
// FPCR.EBF clear) BFDOT rounds the sum of each pair, and its addition to the accumulator, to odd
// rather than to nearest, and flushes subnormal inputs and results to zero: each of its two
// roundings errs by at most one unit in the last place where the FMA path's two err by half of
// one, and the flushes are kept harmless by the caller's per-kv-head test of q, as for VDPBF16PS.
//
// This file alone is compiled with FEAT_BF16 enabled (-march=armv8.2-a+bf16, src/CMakeLists.txt):
// neither GCC 12 nor clang 14 offers the BF16 intrinsics inside a function's target attribute. It
// defines nothing else, and its shared inline helpers use no BF16 instruction, so no copy of them
// that another file might link to needs the feature.
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu::neon_bf16 {

#include "cpu/simd/vec_neon.h"

namespace {

constexpr int kLanes = Vec::kLanes;
constexpr int kKeyGroup = kLanes;  // one lane_sums per group
constexpr int64_t kPairLanes = 8;  // bf16 values per BFDOT operand
static_assert(kDirectChunkKeys % kKeyGroup == 0, "key groups must tile a pass");

// partial[r * 4 + g] = lane-wise pair sums of q_r . k_g for R rows and G keys (first: the first
// key's number in the pass, for its prefetch line numbers).
template <int R, int G, bool kFarInMemoryOrder>
__attribute__((always_inline)) inline void key_group(const uint16_t* q, int64_t ldq,
                                                     const void* const* k_rows, int64_t head_dim,
                                                     Vec* partial, int64_t first,
                                                     const PassPrefetcher* prefetch) {
  float32x4_t acc[R][G];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) acc[r][g] = vdupq_n_f32(0.f);
  }
  const int64_t row_lines = (head_dim * 2 + 63) / 64;
  auto accumulate = [&](int64_t c, const bfloat16x8_t (&key)[G]) __attribute__((always_inline)) {
    for (int r = 0; r < R; ++r) {
      const bfloat16x8_t q_pairs = vreinterpretq_bf16_u16(vld1q_u16(q + r * ldq + c));
      for (int g = 0; g < G; ++g) acc[r][g] = vbfdotq_f32(acc[r][g], q_pairs, key[g]);
    }
  };
  // The hints of the line of each key's row that starts at column c, where one does.
  auto prefetch_lines = [&](int64_t c) __attribute__((always_inline)) {
    if (prefetch == nullptr || c * 2 % 64 != 0) return;
    for (int g = 0; g < G; ++g) {
      prefetch->line<kFarInMemoryOrder>(
          first + g, c * 2, PassPrefetcher::score_line_number(first, g, c * 2 / 64, G, row_lines));
    }
  };
  int64_t c = 0;
  for (; c + kPairLanes <= head_dim; c += kPairLanes) {
    prefetch_lines(c);
    bfloat16x8_t key[G];
    for (int g = 0; g < G; ++g) {
      key[g] = vreinterpretq_bf16_u16(vld1q_u16(static_cast<const uint16_t*>(k_rows[g]) + c));
    }
    accumulate(c, key);
  }
  if (c < head_dim) {
    prefetch_lines(c);
    bfloat16x8_t key[G];
    for (int g = 0; g < G; ++g) {
      uint16_t tail[kPairLanes] = {};
      const uint16_t* row = static_cast<const uint16_t*>(k_rows[g]);
      for (int64_t i = c; i < head_dim; ++i) tail[i - c] = row[i];
      key[g] = vreinterpretq_bf16_u16(vld1q_u16(tail));
    }
    accumulate(c, key);
  }
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) partial[r * kLanes + g].v = acc[r][g];
  }
}

template <int R, bool kFarInMemoryOrder>
void tile_scores(const uint16_t* q, int64_t ldq, const void* const* k_rows, int64_t keys,
                 int64_t head_dim, const PassPrefetcher* prefetch, float* s) {
  for (int64_t first = 0; first < kDirectChunkKeys; first += kKeyGroup) {
    Vec partial[R * kLanes];
    const int64_t present = std::clamp<int64_t>(keys - first, 0, kKeyGroup);
    if (present == kKeyGroup) {
      key_group<R, kKeyGroup, kFarInMemoryOrder>(q, ldq, k_rows + first, head_dim, partial, first,
                                                 prefetch);
    } else {
      for (int64_t g = 0; g < kKeyGroup; ++g) {
        if (g < present) {
          Vec one[R * kLanes];
          key_group<R, 1, kFarInMemoryOrder>(q, ldq, k_rows + first + g, head_dim, one, first + g,
                                             prefetch);
          for (int r = 0; r < R; ++r) partial[r * kLanes + g] = one[r * kLanes];
        } else {
          for (int r = 0; r < R; ++r) partial[r * kLanes + g] = Vec::zero();
        }
      }
    }
    for (int r = 0; r < R; ++r) lane_sums(partial + r * kLanes).store(s + r * kKeyBlock + first);
  }
}

}  // namespace

#include "cpu/decode/fwd_decode_bf16_dot_tiles-inl.h"

}  // namespace anyattn::cpu::neon_bf16
