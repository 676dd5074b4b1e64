// 16 x f32 vectors on AVX-512 (F, BW, VL, DQ). Include only inside an ANYATTN_TARGET_BEGIN region
// for "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c", inside namespace anyattn::cpu::avx512.
//
// The same interface is implemented by vec_avx2.h and vec_portable.h; fwd_kernel-inl.h is written
// against it. Every operation that receives a NaN returns a NaN, except where noted.
struct Vec {
  static constexpr int kLanes = 16;
  __m512 v;

  // load_in_register (vec_avx2.h): with 32 registers the compiler keeps such vectors in one.
  static Vec load_in_register(const float* p) { return load(p); }
  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  static Vec broadcast(float x) { return {_mm512_set1_ps(x)}; }
  static Vec zero() { return {_mm512_setzero_ps()}; }
  // 0, 1, ..., 15 as floats.
  static Vec iota() {
    return {_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)};
  }
  // 16 bf16 / f16 values widened to f32 (exact).
  static Vec load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
  }
  static Vec load_f16(const uint16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
  }
  // 32 bf16 values widened to f32 as two vectors: *even gets elements 0, 2, .., 30 and *odd
  // elements 1, 3, .., 31 (exact). Two single-uop steps for 32 values, where load_bf16 takes four.
  static void load_bf16_pairs(const uint16_t* p, Vec* even, Vec* odd) {
    const __m512i pairs = _mm512_loadu_si512(p);
    even->v = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
    odd->v = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(~0xFFFF)));
  }
  // 16 stored 8-bit cache values as f32 (exact; the cache's scales are applied by the caller),
  // as in vec_avx2.h: int8 sign-extended, e5m2 as the top byte of an f16, e4m3 as its value
  // times 2^-8 (kFp8E4M3LoadScale) through f16 bits, its NaN pattern S.1111.111 made a NaN (a
  // finite value from load_fp8_e4m3_finite).
  static Vec load_i8(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b))};
  }
  static Vec load_fp8_e5m2(const uint8_t* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return {_mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8))};
  }
  static Vec load_fp8_e4m3(const uint8_t* p) {
    const __m256i h = fp8_e4m3_f16_bits(p);
    // (bits 13..7) + 1 carries into bit 14 (0 in h) exactly for the NaN pattern, and no further.
    const __m256i carry = _mm256_add_epi16(h, _mm256_set1_epi16(0x0080));
    const __m256i nan_bit = _mm256_and_si256(carry, _mm256_set1_epi16(0x4000));
    return {_mm512_cvtph_ps(_mm256_or_si256(h, nan_bit))};
  }
  static Vec load_fp8_e4m3_finite(const uint8_t* p) {
    return {_mm512_cvtph_ps(fp8_e4m3_f16_bits(p))};
  }
  // e4m3 for the direct decode loop, as in vec_avx2.h: the bits straight into an f32's, the value
  // times 2^-120 (subnormals as f32 subnormals), the NaN code finite.
  static constexpr int kE4m3DirectExponent = 120;
  static Vec load_fp8_e4m3_direct(const uint8_t* p) {
    const __m512i d = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i kept = _mm512_set1_epi32(static_cast<int>(0x87F00000u));
    return {_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(d, 20), kept))};
  }
  static __m256i fp8_e4m3_f16_bits(const uint8_t* p) {
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(-16512));  // 0xBF80
  }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  // The lanes narrowed to f16 bits, rounded to nearest even, as in vec_avx2.h.
  void store_f16(uint16_t* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

inline Vec operator+(Vec a, Vec b) {
  return {_mm512_add_ps(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {_mm512_sub_ps(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {_mm512_mul_ps(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {_mm512_div_ps(a.v, b.v)};
}
// a * b + c, fused.
inline Vec fma(Vec a, Vec b, Vec c) {
  return {_mm512_fmadd_ps(a.v, b.v, c.v)};
}
// max(a, b); if either is NaN the result is b (NaN-preserving only in b).
inline Vec max_keep_b_nan(Vec a, Vec b) {
  return {_mm512_max_ps(a.v, b.v)};
}
inline Vec min_keep_b_nan(Vec a, Vec b) {
  return {_mm512_min_ps(a.v, b.v)};
}
inline Vec abs(Vec a) {
  return {_mm512_abs_ps(a.v)};
}
// Largest lane; NaN lanes may be ignored.
inline float reduce_max(Vec a) {
  return _mm512_reduce_max_ps(a.v);
}
inline float reduce_add(Vec a) {
  return _mm512_reduce_add_ps(a.v);
}
// Lanes where lo <= position < hi keep `value`, the others become `fill`.
inline Vec select_in_range(Vec value, Vec position, float lo, float hi, Vec fill) {
  const __mmask16 inside = _mm512_cmp_ps_mask(position.v, _mm512_set1_ps(lo), _CMP_GE_OQ) &
                           _mm512_cmp_ps_mask(position.v, _mm512_set1_ps(hi), _CMP_LT_OQ);
  return {_mm512_mask_blend_ps(inside, fill.v, value.v)};
}
// True when some lane of a is greater than bound (NaN lanes are not).
inline bool any_above(Vec a, float bound) {
  return _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(bound), _CMP_GT_OQ) != 0;
}
// Lanes where |a| < bound take `small`, else `large` (NaN takes `large`).
inline Vec select_abs_less(Vec a, float bound, Vec small, Vec large) {
  const __mmask16 mask = _mm512_cmp_ps_mask(_mm512_abs_ps(a.v), _mm512_set1_ps(bound), _CMP_LT_OQ);
  return {_mm512_mask_blend_ps(mask, large.v, small.v)};
}
// Sign of `sign` applied to |magnitude|.
inline Vec copy_sign(Vec magnitude, Vec sign) {
  const __m512 mask = _mm512_set1_ps(-0.0f);
  return {_mm512_or_ps(_mm512_andnot_ps(mask, magnitude.v), _mm512_and_ps(mask, sign.v))};
}
// 2^n * p for integral-valued n in [-150, 128] and p in [0.7, 1.5]; n <= -126 gives exactly 0, so
// that no result is subnormal. A subnormal (or underflowing) result of vscalefps costs a microcode
// assist of well over a hundred cycles: the masked keys of every diagonal block of a causal call
// (exp2(-inf) -> scalef(1, -150)) would make that block cost several times a full one. The lanes
// the mask zeroes are not computed, so they cost no assist (an input half -inf runs as fast).
inline Vec scale_by_pow2(Vec p, Vec n) {
  const __mmask16 normal = _mm512_cmp_ps_mask(n.v, _mm512_set1_ps(-126.f), _CMP_NLE_UQ);
  return {_mm512_maskz_scalef_ps(normal, p.v, n.v)};
}
// *n = x rounded to the nearest integer (ties to even), *f = x - *n, for |x| <= 2^22: vreduceps
// gives the fraction in one instruction, where vrndscaleps takes two micro-ops and a subtraction.
inline void split_nearest(Vec x, Vec* n, Vec* f) {
  f->v = _mm512_reduce_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  n->v = _mm512_sub_ps(x.v, f->v);
}

// split_nearest for exp2's argument, any x <= 128 or NaN: vreduceps gives a fraction of 0 for
// -inf and for every |x| >= 2^23, so n = x exactly and scale_by_pow2 turns every n <= -126,
// -inf included, into 0. No clamp from below is needed (one instruction less per exp2).
inline void split_for_exp2(Vec x, Vec* n, Vec* f) {
  split_nearest(x, n, f);
}

// Lane k of the result is the sum of the lanes of in[k], k < 16: sixteen horizontal sums in four
// shuffle-and-add stages (45 instructions) instead of sixteen separate reductions.
// Always inlined: GCC 12 called it out of line from the decode score loop, a call per 16 keys.
__attribute__((always_inline)) inline Vec lane_sums(const Vec* in) {
  __m512 pairs[8], quads[4], halves[2];
  // Each 128-bit lane of pairs[i] holds (in[2i], in[2i+1], in[2i], in[2i+1]) partials.
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(in[2 * i].v, in[2 * i + 1].v),
                             _mm512_unpackhi_ps(in[2 * i].v, in[2 * i + 1].v));
  }
  // Each 128-bit lane of quads[i] holds that lane's partials of in[4i .. 4i+3].
  for (int i = 0; i < 4; ++i) {
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  }
  // 128-bit lanes of halves[i]: quads[2i] lanes 0+1, 2+3, then quads[2i+1] lanes 0+1, 2+3.
  for (int i = 0; i < 2; ++i) {
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88),
                              _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xDD));
  }
  return {_mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], 0x88),
                        _mm512_shuffle_f32x4(halves[0], halves[1], 0xDD))};
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for a 16 x 16 tile: three shuffle stages
// (unpack ps, unpack pd, two 128-bit lane shuffles) instead of 256 scalar moves.
inline void transpose_tile(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m512 a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]);
  }
  // After this stage, 128-bit lane L of a[4i + k] holds column 4L + k of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    const __m512d lo0 = _mm512_castps_pd(b[4 * i]), lo1 = _mm512_castps_pd(b[4 * i + 2]);
    const __m512d hi0 = _mm512_castps_pd(b[4 * i + 1]), hi1 = _mm512_castps_pd(b[4 * i + 3]);
    a[4 * i + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    a[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    a[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    a[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 x0 = _mm512_shuffle_f32x4(a[k], a[4 + k], 0x44);
    const __m512 x1 = _mm512_shuffle_f32x4(a[k], a[4 + k], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(a[8 + k], a[12 + k], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(a[8 + k], a[12 + k], 0xEE);
    _mm512_storeu_ps(dst + (0 + k) * dst_stride, _mm512_shuffle_f32x4(x0, y0, 0x88));
    _mm512_storeu_ps(dst + (4 + k) * dst_stride, _mm512_shuffle_f32x4(x0, y0, 0xDD));
    _mm512_storeu_ps(dst + (8 + k) * dst_stride, _mm512_shuffle_f32x4(x1, y1, 0x88));
    _mm512_storeu_ps(dst + (12 + k) * dst_stride, _mm512_shuffle_f32x4(x1, y1, 0xDD));
  }
}
