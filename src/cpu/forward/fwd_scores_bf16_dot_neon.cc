// The packed forward's bf16 scores on BFDOT (FEAT_BF16; fwd_narrow_scores.h).
//
// Design. K is packed in pairs: each 32-bit word holds two consecutive head-dim elements of one
// key, a row of the panel the same pair of elements for all 64 keys. BFDOT by element multiplies
// a vector of 4 keys' pairs by one pair of q (a lane of a q vector) and adds both products into
// the 4 keys' f32 sums. A tile of R = 8 rows x NV = 2 key vectors (8 keys) keeps 16 accumulators;
// per step of 8 head-dim elements it loads one q vector per row (8 bf16: 4 pairs) and, for each of
// the 4 pairs, NV key vectors, and issues 4 * R * NV = 64 BFDOTs for R + 4 * NV = 16 loads: 512
// multiply-adds, where the f32 path's step of 64 FMLAs does 256 for 12 to 18 loads; the packed
// K is half the f32 panel's bytes. Each step also prefetches two lines of the next block's panel
// into L2. The block's panel (16 KiB of K at D = 128) stays in L1 while the row tiles pass over
// it; S (64 x 64 f32) is written once.
//
// This file alone is compiled with -march=armv8.2-a+bf16 (src/CMakeLists.txt) and is called only
// where the CPU has FEAT_BF16. Its shared inline helpers use no BF16 instruction.
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/forward/fwd_narrow_scores.h"
#include "cpu/shared/prefetch.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu::neon_bf16 {
namespace {

constexpr int64_t kKeyGranule = 4;  // keys per vector of pairs

template <int R, int NV>
void score_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth,
                int64_t key0, PanelPrefetchWindow ahead, float* s) {
  const uint32_t* k_pairs = static_cast<const uint32_t*>(panel) + key0;
  float32x4_t acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = vdupq_n_f32(0.f);
  }
  // Pair rows w .. w + 3: head-dim elements 2w .. 2w + 7.
  for (int64_t w = 0; w < depth / 2; w += 4) {
    prefetch_line_l2(ahead.line);
    prefetch_line_l2(ahead.line + ahead.step);
    ahead.line += 2 * ahead.step;
    bfloat16x8_t q_pairs[R];
    for (int r = 0; r < R; ++r) q_pairs[r] = vreinterpretq_bf16_u16(vld1q_u16(q + r * ldq + 2 * w));
    auto pair = [&](auto lane) __attribute__((always_inline)) {
      bfloat16x8_t keys[NV];
      for (int n = 0; n < NV; ++n) {
        keys[n] = vreinterpretq_bf16_u32(vld1q_u32(k_pairs + (w + lane) * kKeyBlock + 4 * n));
      }
      for (int r = 0; r < R; ++r) {
        for (int n = 0; n < NV; ++n) {
          acc[r][n] = vbfdotq_laneq_f32(acc[r][n], keys[n], q_pairs[r], decltype(lane)::value);
        }
      }
    };
    pair(std::integral_constant<int, 0>{});
    pair(std::integral_constant<int, 1>{});
    pair(std::integral_constant<int, 2>{});
    pair(std::integral_constant<int, 3>{});
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) vst1q_f32(s + r * kKeyBlock + key0 + 4 * n, acc[r][n]);
  }
}

#include "cpu/forward/fwd_narrow_scores_tiles-inl.h"

}  // namespace

void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint32_t* k_pairs,
                  int64_t depth, int64_t keys, NextPanelLines next, float* s) {
  block_scores_of(q, ldq, rows, k_pairs, depth, keys, next, s);
}

}  // namespace anyattn::cpu::neon_bf16
