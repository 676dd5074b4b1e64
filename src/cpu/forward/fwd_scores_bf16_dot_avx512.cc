// The packed forward's bf16 scores on VDPBF16PS (AVX512_BF16; fwd_narrow_scores.h).
//
// Design. K is packed in pairs: each 32-bit word holds two consecutive head-dim elements of one
// key, a row of the panel the same pair of elements for all 64 keys. VDPBF16PS multiplies a
// vector of 16 keys' pairs by one pair of q broadcast to every lane and adds both products into
// the 16 keys' f32 sums. A tile of R = 4 rows x NV = 4 key vectors (the block's 64 keys) keeps 16
// accumulators; per pair row it loads the NV key vectors and broadcasts one q pair per row,
// R * NV = 16 VDPBF16PS for NV + R = 8 loads: 512 multiply-adds, twice what as many f32 FMAs do.
// The packed K is half the f32 panel's bytes. Each pair row prefetches one line of the next
// block's panel into L2 (prefetch_line_l2_in_tile, which leaves the accumulators in registers).
// The block's panel (16 KiB of K at D = 128) stays in L1 while the row tiles pass over it; S (64
// x 64 f32) is written once.
//
// Compiled for AVX512_BF16 in a target region of its own; called only where the CPU has it
// (call_takes_bf16_dot_scores).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/forward/fwd_narrow_scores.h"
#include "cpu/shared/prefetch.h"
#include "cpu/simd/avx512_intrinsics.h"
#include "cpu/simd/isa_target.h"
#include "plan/fwd_layout.h"

#if defined(__x86_64__) || defined(_M_X64)
ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")
namespace anyattn::cpu::avx512_bf16 {
namespace {

constexpr int kKeyVecLanes = 16;  // keys per vector of pairs
constexpr int kTileRows = 4;
constexpr int kTileVecs = static_cast<int>(kKeyBlock / kKeyVecLanes);

// Pair w of a bf16 row (elements 2w and 2w + 1), as one 32-bit word.
inline uint32_t pair_at(const uint16_t* row, int64_t w) {
  uint32_t pair;
  std::memcpy(&pair, row + 2 * w, sizeof(pair));
  return pair;
}

// s[r][0, NV * 16) = q_r . k_j for R rows and the NV key vectors from key 0 of `k_pairs`,
// prefetching one line of `ahead` per pair row.
template <int R, int NV>
void score_tile(const uint16_t* q, int64_t ldq, const uint32_t* k_pairs, int64_t pair_rows,
                PanelPrefetchWindow ahead, float* s) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_setzero_ps();
  }
  for (int64_t w = 0; w < pair_rows; ++w) {
    prefetch_line_l2_in_tile(ahead.line);
    ahead.line += ahead.step;
    __m512bh keys[NV];
    for (int n = 0; n < NV; ++n) {
      keys[n] = (__m512bh)_mm512_loadu_si512(k_pairs + w * kKeyBlock + n * kKeyVecLanes);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh q_pair =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(q + r * ldq, w)));
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], q_pair, keys[n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) {
      _mm512_storeu_ps(s + r * kKeyBlock + n * kKeyVecLanes, acc[r][n]);
    }
  }
}

// The key vectors [0, vectors) of R rows: the tile's width fixed at compile time.
template <int R, int NV = kTileVecs>
void score_rows(int64_t vectors, const uint16_t* q, int64_t ldq, const uint32_t* k_pairs,
                int64_t pair_rows, PanelPrefetchWindow ahead, float* s) {
  if constexpr (NV > 1) {
    if (vectors < NV) {
      score_rows<R, NV - 1>(vectors, q, ldq, k_pairs, pair_rows, ahead, s);
      return;
    }
  }
  score_tile<R, NV>(q, ldq, k_pairs, pair_rows, ahead, s);
}

// The rows of a tile that is not whole: R = rows, 1 <= rows < kTileRows.
template <int R = kTileRows - 1>
void score_row_remainder(int64_t rows, int64_t vectors, const uint16_t* q, int64_t ldq,
                         const uint32_t* k_pairs, int64_t pair_rows, PanelPrefetchWindow ahead,
                         float* s) {
  if constexpr (R >= 1) {
    if (rows == R) {
      score_rows<R>(vectors, q, ldq, k_pairs, pair_rows, ahead, s);
    } else {
      score_row_remainder<R - 1>(rows, vectors, q, ldq, k_pairs, pair_rows, ahead, s);
    }
  }
}

}  // namespace

void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint32_t* k_pairs,
                  int64_t depth, int64_t keys, NextPanelLines next, float* s) {
  NextPanelWindows ahead(next, k_pairs);
  const int64_t pair_rows = depth / 2;
  // A window's step is two lines; a tile prefetches one line per pair row.
  const int64_t steps = pair_rows / 2;
  const int64_t vectors = (keys + kKeyVecLanes - 1) / kKeyVecLanes;
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    score_rows<kTileRows>(vectors, q + r * ldq, ldq, k_pairs, pair_rows, ahead.window(steps),
                          s + r * kKeyBlock);
  }
  if (r < rows) {
    score_row_remainder(rows - r, vectors, q + r * ldq, ldq, k_pairs, pair_rows,
                        ahead.window(steps), s + r * kKeyBlock);
  }
}

void exact_pair_scores(const uint16_t* q_row, const uint32_t* k_pairs, int64_t pair_rows,
                       int64_t keys, float* s_row) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t c = 0; c < keys; c += kKeyVecLanes) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t w = 0; w < pair_rows; ++w) {
      const __m512i words = _mm512_loadu_si512(k_pairs + w * kKeyBlock + c);
      const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
      const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(words, high_half));
      const uint32_t pair = pair_at(q_row, w);
      const __m512 q_even = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(pair << 16)));
      const __m512 q_odd =
          _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(pair & 0xFFFF0000u)));
      sum = _mm512_fmadd_ps(q_even, even, sum);
      sum = _mm512_fmadd_ps(q_odd, odd, sum);
    }
    _mm512_storeu_ps(s_row + c, sum);
  }
}

}  // namespace anyattn::cpu::avx512_bf16
ANYATTN_TARGET_END()
#endif  // x86-64
