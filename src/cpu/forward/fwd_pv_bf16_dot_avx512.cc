// The packed forward's O += P V on VDPBF16PS for bf16 calls that allow bf16 probabilities
// (ANYATTN_PRECISION_FAST; fwd_narrow_scores.h).
//
// Design. V is packed in key pairs: word c of pair row t holds column c of keys 2t (low half) and
// 2t + 1 (high half), dv_pad words per row, 32 rows per 64-key block (half the f32 panel's
// bytes). A tile of R = 4 query rows first rounds its rows' probabilities to bf16 (to nearest
// even; as 32-bit words they are the same key pairs), then keeps R x NV = 4 x 4 accumulators of O
// (64 columns) in registers across the pair rows: per pair row it loads NV vectors of 16 columns'
// pairs and broadcasts one probability pair per row, R * NV = 16 VDPBF16PS for NV + R = 8 loads,
// 512 multiply-adds, twice what as many f32 FMAs do. O is loaded and stored once per tile and
// block; the block's packed V (16 KiB at Dv = 128) stays in L1 while the row tiles pass over it.
// Each tile stops at the pair holding the last key its rows see (row_keys): on a causal diagonal
// block that skips about half of the products.
//
// Compiled for AVX512_BF16 in a target region of its own; called only where the CPU has it (the
// calls that take the pairs format, narrow_scores_of).
#include <algorithm>
#include <cstdint>

#include "cpu/forward/fwd_narrow_scores.h"
#include "cpu/simd/avx512_intrinsics.h"
#include "cpu/simd/isa_target.h"
#include "plan/fwd_layout.h"

#if defined(__x86_64__) || defined(_M_X64)
ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")
namespace anyattn::cpu::avx512_bf16 {
namespace {

constexpr int kColumnLanes = 16;  // columns of O per vector
constexpr int kTileRows = 4;
constexpr int kTileVecs = 4;
constexpr int64_t kPairWords = kKeyBlock / 2;  // probability pairs of one row of a block

// The 64 probabilities of a block row rounded to bf16 as 32 key pairs (word t: keys 2t, 2t + 1).
inline void round_probability_pairs(const float* p_row, uint32_t* pairs) {
  for (int64_t c = 0; c < kKeyBlock; c += 2 * kColumnLanes) {
    const __m512bh rounded = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p_row + c + kColumnLanes),
                                                 _mm512_loadu_ps(p_row + c));
    _mm512_storeu_si512(pairs + c / 2, (__m512i)rounded);
  }
}

// o[r][0, NV * 16) += sum over pair rows t < pair_rows of p_pairs[r][t] . v_pairs[t][...] for R
// rows (p_pairs: R rows of kPairWords words; o: rows ldo floats apart; v_pairs: rows ldv words
// apart).
template <int R, int NV>
void pv_tile(const uint32_t* p_pairs, const uint32_t* v_pairs, int64_t ldv, int64_t pair_rows,
             float* o, int64_t ldo) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_loadu_ps(o + r * ldo + n * kColumnLanes);
  }
  for (int64_t t = 0; t < pair_rows; ++t) {
    __m512bh values[NV];
    for (int n = 0; n < NV; ++n) {
      values[n] = (__m512bh)_mm512_loadu_si512(v_pairs + t * ldv + n * kColumnLanes);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh pair =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(p_pairs[r * kPairWords + t]));
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], pair, values[n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) _mm512_storeu_ps(o + r * ldo + n * kColumnLanes, acc[r][n]);
  }
}

// The column vectors [0, vectors) of R rows: whole tiles of kTileVecs, then the rest at a width
// fixed at compile time.
template <int R, int NV = kTileVecs - 1>
void pv_column_remainder(int64_t vectors, const uint32_t* p_pairs, const uint32_t* v_pairs,
                         int64_t ldv, int64_t pair_rows, float* o, int64_t ldo) {
  if constexpr (NV >= 1) {
    if (vectors == NV) {
      pv_tile<R, NV>(p_pairs, v_pairs, ldv, pair_rows, o, ldo);
    } else {
      pv_column_remainder<R, NV - 1>(vectors, p_pairs, v_pairs, ldv, pair_rows, o, ldo);
    }
  }
}

template <int R>
void pv_rows(const float* p, const uint32_t* v_pairs, int64_t dv_pad, int64_t columns,
             int64_t pair_rows, float* o) {
  alignas(64) uint32_t p_pairs[R * kPairWords];
  for (int r = 0; r < R; ++r) round_probability_pairs(p + r * kKeyBlock, p_pairs + r * kPairWords);
  const int64_t vectors = columns / kColumnLanes;
  int64_t n = 0;
  for (; n + kTileVecs <= vectors; n += kTileVecs) {
    pv_tile<R, kTileVecs>(p_pairs, v_pairs + n * kColumnLanes, dv_pad, pair_rows,
                          o + n * kColumnLanes, dv_pad);
  }
  pv_column_remainder<R>(vectors - n, p_pairs, v_pairs + n * kColumnLanes, dv_pad, pair_rows,
                         o + n * kColumnLanes, dv_pad);
}

// The rows of a tile that is not whole: R = rows, 1 <= rows < kTileRows.
template <int R = kTileRows - 1>
void pv_row_remainder(int64_t rows, const float* p, const uint32_t* v_pairs, int64_t dv_pad,
                      int64_t columns, int64_t pair_rows, float* o) {
  if constexpr (R >= 1) {
    if (rows == R) {
      pv_rows<R>(p, v_pairs, dv_pad, columns, pair_rows, o);
    } else {
      pv_row_remainder<R - 1>(rows, p, v_pairs, dv_pad, columns, pair_rows, o);
    }
  }
}

// Pair rows a tile of rows [r0, r0 + count) must accumulate: those holding its rows' keys (all
// `keys`, or the largest of row_keys over the tile).
inline int64_t tile_pair_rows(const int64_t* row_keys, int64_t r0, int64_t count, int64_t keys) {
  int64_t last = keys;
  if (row_keys != nullptr) {
    last = 0;
    for (int64_t r = r0; r < r0 + count; ++r) last = std::max(last, row_keys[r]);
    last = std::min(last, keys);
  }
  return (last + 1) / 2;
}

}  // namespace

void block_pv(const float* p, int64_t rows, const uint32_t* v_pairs, int64_t keys,
              const int64_t* row_keys, float* o, int64_t dv_pad, int64_t columns) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    pv_rows<kTileRows>(p + r * kKeyBlock, v_pairs, dv_pad, columns,
                       tile_pair_rows(row_keys, r, kTileRows, keys), o + r * dv_pad);
  }
  if (r < rows) {
    pv_row_remainder(rows - r, p + r * kKeyBlock, v_pairs, dv_pad, columns,
                     tile_pair_rows(row_keys, r, rows - r, keys), o + r * dv_pad);
  }
}

void exact_pair_pv(const float* p, int64_t rows, const uint32_t* v_pairs, int64_t keys, float* o,
                   int64_t dv_pad, int64_t columns) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t r = 0; r < rows; ++r) {
    const float* p_row = p + r * kKeyBlock;
    for (int64_t c = 0; c < columns; c += kColumnLanes) {
      float* o_columns = o + r * dv_pad + c;
      __m512 sum = _mm512_loadu_ps(o_columns);
      for (int64_t t = 0; 2 * t < keys; ++t) {
        const __m512i words = _mm512_loadu_si512(v_pairs + t * dv_pad + c);
        const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
        const __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(words, high_half));
        sum = _mm512_fmadd_ps(_mm512_set1_ps(p_row[2 * t]), even, sum);
        sum = _mm512_fmadd_ps(_mm512_set1_ps(p_row[2 * t + 1]), odd, sum);
      }
      _mm512_storeu_ps(o_columns, sum);
    }
  }
}

}  // namespace anyattn::cpu::avx512_bf16
ANYATTN_TARGET_END()
#endif  // x86-64
