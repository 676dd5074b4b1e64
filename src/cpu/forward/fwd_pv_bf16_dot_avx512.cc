// The packed forward's O += P V on VDPBF16PS for bf16 calls that allow bf16 probabilities
// (ANYATTN_PRECISION_FAST; fwd_narrow_scores.h).
//
// Design (the tiling: fwd_narrow_pv_tiles-inl.h). V is packed in key pairs: word c of pair row t
// holds column c of keys 2t (low half) and 2t + 1 (high half), dv_pad words per row, 32 rows per
// 64-key block (half the f32 panel's bytes). A tile of R = 4 query rows first rounds its rows'
// probabilities to bf16 (to nearest even, each times its key's V factor for an 8-bit cache; as
// 32-bit words they are the same key pairs), then keeps R x NV = 4 x 4 accumulators of O (64
// columns) in registers across the pair rows: per pair row it loads NV vectors of 16 columns'
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

constexpr int kPvColumnLanes = 16;
constexpr int kPvTileRows = 4;
constexpr int kPvTileVecs = 4;

inline void round_probability_pairs(const float* p_row, const float* factors, uint32_t* pairs) {
  for (int64_t c = 0; c < kKeyBlock; c += 2 * kPvColumnLanes) {
    __m512 low = _mm512_loadu_ps(p_row + c);
    __m512 high = _mm512_loadu_ps(p_row + c + kPvColumnLanes);
    if (factors != nullptr) {
      low = _mm512_mul_ps(low, _mm512_loadu_ps(factors + c));
      high = _mm512_mul_ps(high, _mm512_loadu_ps(factors + c + kPvColumnLanes));
    }
    _mm512_storeu_si512(pairs + c / 2, (__m512i)_mm512_cvtne2ps_pbh(high, low));
  }
}

template <int R, int NV>
void pv_tile(const uint32_t* p_pairs, const uint32_t* v_pairs, int64_t ldv, int64_t pair_rows,
             float* o, int64_t ldo) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_loadu_ps(o + r * ldo + n * kPvColumnLanes);
  }
  for (int64_t t = 0; t < pair_rows; ++t) {
    __m512bh values[NV];
    for (int n = 0; n < NV; ++n) {
      values[n] = (__m512bh)_mm512_loadu_si512(v_pairs + t * ldv + n * kPvColumnLanes);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh pair =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(p_pairs[r * kProbabilityPairWords + t]));
      for (int n = 0; n < NV; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], pair, values[n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) _mm512_storeu_ps(o + r * ldo + n * kPvColumnLanes, acc[r][n]);
  }
}

#include "cpu/forward/fwd_narrow_pv_tiles-inl.h"

}  // namespace

void block_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
              int64_t keys, const int64_t* row_keys, float* o, int64_t dv_pad, int64_t columns) {
  block_pv_of(p, rows, v_pairs, factors, keys, row_keys, o, dv_pad, columns);
}

void exact_pair_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
                   int64_t keys, float* o, int64_t dv_pad, int64_t columns) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t r = 0; r < rows; ++r) {
    const float* p_row = p + r * kKeyBlock;
    for (int64_t c = 0; c < columns; c += kPvColumnLanes) {
      float* o_columns = o + r * dv_pad + c;
      __m512 sum = _mm512_loadu_ps(o_columns);
      for (int64_t t = 0; 2 * t < keys; ++t) {
        const __m512i words = _mm512_loadu_si512(v_pairs + t * dv_pad + c);
        __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
        __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(words, high_half));
        if (factors != nullptr) {
          even = _mm512_mul_ps(even, _mm512_set1_ps(factors[2 * t]));
          odd = _mm512_mul_ps(odd, _mm512_set1_ps(factors[2 * t + 1]));
        }
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
