// The packed forward's f16 scores on FMLAL/FMLAL2 (FEAT_FHM; fwd_narrow_scores.h).
//
// Design. K is packed as f16 rows of 64 keys per head-dim element, as the f32 path's panel holds
// f32. FMLAL by element multiplies the low 4 f16 of a key vector (8 keys) by one q element (a lane
// of a q vector) into 4 f32 sums, FMLAL2 the high 4. A tile of R = 4 rows x NV = 2 key vectors
// (16 keys) keeps 16 accumulators; per step of 8 head-dim elements it loads one q vector per row (8
// f16) and, for each element, NV key vectors, and issues 8 * R * 2 * NV = 128 FMLAL(2)s for
// R + 8 * NV = 20 loads, where the f32 path needs 128 FMLAs for 4 + 32 = 36 (8 elements x 16 keys
// x 4 rows); the packed K is half the f32 panel's bytes and is not widened while packing. Each
// product is added as the f32 path adds it (same order, one rounding each), so the scores are its
// bits. Each step also prefetches two lines of the next block's panel into L2.
//
// This file alone is compiled with -march=armv8.2-a+fp16fml (src/CMakeLists.txt) and is called
// only where the CPU has FEAT_FHM. Its shared inline helpers use no FHM instruction.
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/forward/fwd_narrow_scores.h"
#include "cpu/shared/prefetch.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu::neon_f16 {
namespace {

constexpr int64_t kKeyGranule = 8;  // keys per f16 vector

template <int R, int NV>
void score_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth_rows,
                int64_t key0, PanelLineFeed* feed, float* s) {
  const uint16_t* kt = static_cast<const uint16_t*>(panel) + key0;
  // acc[r][2n] holds keys 8n .. 8n + 3 of the tile, acc[r][2n + 1] keys 8n + 4 .. 8n + 7.
  float32x4_t acc[R][2 * NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < 2 * NV; ++n) acc[r][n] = vdupq_n_f32(0.f);
  }
  for (int64_t d = 0; d < depth_rows; d += 8) {
    feed->step();
    float16x8_t q_elements[R];
    for (int r = 0; r < R; ++r) q_elements[r] = vreinterpretq_f16_u16(vld1q_u16(q + r * ldq + d));
    auto element = [&](auto lane) __attribute__((always_inline)) {
      constexpr int kLane = decltype(lane)::value;
      float16x8_t keys[NV];
      for (int n = 0; n < NV; ++n) {
        keys[n] = vreinterpretq_f16_u16(vld1q_u16(kt + (d + kLane) * kKeyBlock + 8 * n));
      }
      for (int r = 0; r < R; ++r) {
        for (int n = 0; n < NV; ++n) {
          acc[r][2 * n] = vfmlalq_laneq_low_f16(acc[r][2 * n], keys[n], q_elements[r], kLane);
          acc[r][2 * n + 1] =
              vfmlalq_laneq_high_f16(acc[r][2 * n + 1], keys[n], q_elements[r], kLane);
        }
      }
    };
    element(std::integral_constant<int, 0>{});
    element(std::integral_constant<int, 1>{});
    element(std::integral_constant<int, 2>{});
    element(std::integral_constant<int, 3>{});
    element(std::integral_constant<int, 4>{});
    element(std::integral_constant<int, 5>{});
    element(std::integral_constant<int, 6>{});
    element(std::integral_constant<int, 7>{});
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < 2 * NV; ++n) vst1q_f32(s + r * kKeyBlock + key0 + 4 * n, acc[r][n]);
  }
}

#include "cpu/forward/fwd_narrow_scores_tiles-inl.h"

}  // namespace

void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint16_t* kt,
                  int64_t d_rows, int64_t keys, NextPanelLines next, float* s) {
  block_scores_of(q, ldq, rows, kt, d_rows, keys, next, s);
}

}  // namespace anyattn::cpu::neon_f16
