// The packed forward's f16 scores on FMLAL/FMLAL2 (FEAT_FHM; fwd_narrow_scores.h).
//
// Design. K is packed as f16 rows of 64 keys per head-dim element, as the f32 path's panel holds
// f32. FMLAL by element multiplies the low 4 f16 of a key vector (8 keys) by one q element (a lane
// of a q vector) into 4 f32 sums, FMLAL2 the high 4. A tile of R = 8 rows x NV = 1 key vector (8
// keys) keeps 16 accumulators; per step of 8 head-dim elements it loads one q vector per row (8
// f16) and one key vector per element, and issues 8 * R * 2 = 128 FMLAL(2)s for R + 8 = 16 loads,
// where the f32 path needs 128 FMLAs and 24 to 36 loads for the same products; the packed K is
// half the f32 panel's bytes and is not widened while packing. Each product is added as the f32
// path adds it (same order, one rounding each), so the scores are its bits. Each step also
// prefetches two lines of the next block's panel into L2.
//
// This file alone is compiled with -march=armv8.2-a+fp16fml (src/CMakeLists.txt) and is called
// only where the CPU has FEAT_FHM. Its shared inline helpers use no FHM instruction.
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>

#include "cpu/forward/fwd_narrow_scores.h"
#include "cpu/shared/prefetch.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu::neon_f16 {
namespace {

constexpr int64_t kKeyGranule = 8;  // keys per f16 vector

// acc + a[i] * b[L] for i < 4 (FMLAL by element) and acc + a[4 + i] * b[L] (FMLAL2). Written in
// asm: the by-element form of the 16-bit instructions encodes its element register in 4 bits, so
// it must be one of v0-v15 (the "x" constraint); clang 14 does not keep the intrinsics' operand
// there and silently emits the register number modulo 16, another register.
template <int L>
__attribute__((always_inline)) inline float32x4_t fmlal_low(float32x4_t acc, float16x8_t a,
                                                            float16x8_t b) {
  asm("fmlal %0.4s, %1.4h, %2.h[%c3]" : "+w"(acc) : "w"(a), "x"(b), "i"(L));
  return acc;
}
template <int L>
__attribute__((always_inline)) inline float32x4_t fmlal_high(float32x4_t acc, float16x8_t a,
                                                             float16x8_t b) {
  asm("fmlal2 %0.4s, %1.4h, %2.h[%c3]" : "+w"(acc) : "w"(a), "x"(b), "i"(L));
  return acc;
}

// Head-dim elements d0 + L .. d0 + 7 of score_tile, with q[r][d0 .. d0 + 8) in q_elements[r]: per
// element, its NV key vectors times lane L of each row, low and high halves.
template <int R, int NV, int L>
__attribute__((always_inline)) inline void score_elements(const float16x8_t (&q_elements)[R],
                                                          const uint16_t* kt_d0,
                                                          float32x4_t (&low)[R][NV],
                                                          float32x4_t (&high)[R][NV]) {
  if constexpr (L < 8) {
    float16x8_t keys[NV];
    for (int n = 0; n < NV; ++n) {
      keys[n] = vreinterpretq_f16_u16(vld1q_u16(kt_d0 + L * kKeyBlock + 8 * n));
    }
    for (int r = 0; r < R; ++r) {
      for (int n = 0; n < NV; ++n) {
        low[r][n] = fmlal_low<L>(low[r][n], keys[n], q_elements[r]);
        high[r][n] = fmlal_high<L>(high[r][n], keys[n], q_elements[r]);
      }
    }
    score_elements<R, NV, L + 1>(q_elements, kt_d0, low, high);
  }
}

template <int R, int NV>
void score_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth, int64_t key0,
                PanelPrefetchWindow ahead, float* s) {
  const uint16_t* kt = static_cast<const uint16_t*>(panel) + key0;
  // low[r][n] holds keys 8n .. 8n + 3 of the tile, high[r][n] keys 8n + 4 .. 8n + 7.
  float32x4_t low[R][NV], high[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) low[r][n] = high[r][n] = vdupq_n_f32(0.f);
  }
  for (int64_t d = 0; d < depth; d += 8) {
    prefetch_line_l2(ahead.line);
    prefetch_line_l2(ahead.line + ahead.step);
    ahead.line += 2 * ahead.step;
    float16x8_t q_elements[R];
    for (int r = 0; r < R; ++r) q_elements[r] = vreinterpretq_f16_u16(vld1q_u16(q + r * ldq + d));
    score_elements<R, NV, 0>(q_elements, kt + d * kKeyBlock, low, high);
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) {
      vst1q_f32(s + r * kKeyBlock + key0 + 8 * n, low[r][n]);
      vst1q_f32(s + r * kKeyBlock + key0 + 8 * n + 4, high[r][n]);
    }
  }
}

#include "cpu/forward/fwd_narrow_scores_tiles-inl.h"

}  // namespace

void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint16_t* kt,
                  int64_t depth, int64_t keys, NextPanelLines next, float* s) {
  block_scores_of(q, ldq, rows, kt, depth, keys, next, s);
}

}  // namespace anyattn::cpu::neon_f16
