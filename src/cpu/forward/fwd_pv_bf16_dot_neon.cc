// The packed forward's O += P V on BFDOT for bf16 calls that allow bf16 probabilities
// (ANYATTN_PRECISION_FAST; fwd_narrow_scores.h).
//
// Design (the tiling: fwd_narrow_pv_tiles-inl.h). V is packed in key pairs (the avx512 kernel's
// format): a vector of 4 words holds 4 columns' pairs. A tile of R = 4 query rows rounds its
// rows' probabilities to bf16 (BFCVTN, to nearest even; each times its key's V factor for an
// 8-bit cache), then keeps R x NV = 4 x 4 accumulators of O (16 columns) in registers: per step
// of 4 pair rows it loads one vector of 4 probability pairs per row and, for each pair, NV
// vectors of V; BFDOT by element multiplies a V vector by one pair (a lane of the row's vector)
// and adds both products into the 4 columns' sums: 4 * R * NV = 64 BFDOTs, 512 multiply-adds, for
// R + 4 * NV = 20 loads, where as many f32 FMLAs do 256. The block's packed V (16 KiB at
// Dv = 128) stays in L1 while the row tiles pass over it; O is loaded and stored once per tile
// and block.
//
// This file alone is compiled with -march=armv8.2-a+bf16 (src/CMakeLists.txt) and is called only
// where the CPU has FEAT_BF16.
#include <arm_neon.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu/forward/fwd_narrow_scores.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu::neon_bf16 {
namespace {

constexpr int kPvColumnLanes = 4;
constexpr int kPvTileRows = 4;
constexpr int kPvTileVecs = 4;
constexpr int64_t kPairsPerVector = 4;

inline void round_probability_pairs(const float* p_row, const float* factors, uint32_t* pairs) {
  for (int64_t c = 0; c < kKeyBlock; c += 8) {
    float32x4_t low = vld1q_f32(p_row + c);
    float32x4_t high = vld1q_f32(p_row + c + 4);
    if (factors != nullptr) {
      low = vmulq_f32(low, vld1q_f32(factors + c));
      high = vmulq_f32(high, vld1q_f32(factors + c + 4));
    }
    const bfloat16x8_t rounded = vcvtq_high_bf16_f32(vcvtq_low_bf16_f32(low), high);
    vst1q_u32(pairs + c / 2, vreinterpretq_u32_bf16(rounded));
  }
}

template <int R, int NV>
void pv_tile(const uint32_t* p_pairs, const uint32_t* v_pairs, int64_t ldv, int64_t pair_rows,
             float* o, int64_t ldo) {
  float32x4_t acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = vld1q_f32(o + r * ldo + n * kPvColumnLanes);
  }
  bfloat16x8_t p[R];
  // Pair row t + lane, its probability pairs in lane `lane` of p.
  auto pair_row = [&](int64_t t, auto lane) __attribute__((always_inline)) {
    bfloat16x8_t values[NV];
    for (int n = 0; n < NV; ++n) {
      values[n] = vreinterpretq_bf16_u32(
          vld1q_u32(v_pairs + (t + decltype(lane)::value) * ldv + n * kPvColumnLanes));
    }
    for (int r = 0; r < R; ++r) {
      for (int n = 0; n < NV; ++n) {
        acc[r][n] = vbfdotq_laneq_f32(acc[r][n], values[n], p[r], decltype(lane)::value);
      }
    }
  };
  // The pair rows in steps of 4; a last step of 1 to 3 reads the rest of the 4 words of each
  // row's pairs (inside the row: pair_rows <= kProbabilityPairWords) and multiplies only its own.
  for (int64_t t = 0; t < pair_rows; t += kPairsPerVector) {
    for (int r = 0; r < R; ++r) {
      p[r] = vreinterpretq_bf16_u32(vld1q_u32(p_pairs + r * kProbabilityPairWords + t));
    }
    pair_row(t, std::integral_constant<int, 0>{});
    if (t + 1 < pair_rows) pair_row(t, std::integral_constant<int, 1>{});
    if (t + 2 < pair_rows) pair_row(t, std::integral_constant<int, 2>{});
    if (t + 3 < pair_rows) pair_row(t, std::integral_constant<int, 3>{});
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) vst1q_f32(o + r * ldo + n * kPvColumnLanes, acc[r][n]);
  }
}

#include "cpu/forward/fwd_narrow_pv_tiles-inl.h"

}  // namespace

void block_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
              int64_t keys, const int64_t* row_keys, float* o, int64_t dv_pad, int64_t columns) {
  block_pv_of(p, rows, v_pairs, factors, keys, row_keys, o, dv_pad, columns);
}

}  // namespace anyattn::cpu::neon_bf16
