// 8 x f32 vectors on AVX2 + FMA + F16C. Include only inside an ANYATTN_TARGET_BEGIN region for
// "avx2,fma,f16c", inside namespace anyattn::cpu::avx2. Same interface as vec_avx512.h.
struct Vec {
  static constexpr int kLanes = 8;
  __m256 v;

  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  // load for a vector that several FMAs read: the empty asm makes it a register operand, so the
  // compiler cannot fold a load of it into each FMA (which GCC does under register pressure,
  // reading the vector from memory once per use).
  static Vec load_in_register(const float* p) {
    __m256 v = _mm256_loadu_ps(p);
    asm("" : "+x"(v));
    return {v};
  }
  static Vec broadcast(float x) { return {_mm256_set1_ps(x)}; }
  static Vec zero() { return {_mm256_setzero_ps()}; }
  static Vec iota() { return {_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7)}; }
  static Vec load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
  }
  static Vec load_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  // 16 bf16 values widened to f32 as two vectors: *even gets elements 0, 2, .., 14 and *odd
  // elements 1, 3, .., 15 (exact).
  static void load_bf16_pairs(const uint16_t* p, Vec* even, Vec* odd) {
    const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even->v = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
    odd->v = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(~0xFFFF)));
  }
  // 8 stored 8-bit cache values as f32 (exact; the cache's scales are applied by the caller):
  // int8 sign-extended and converted; e5m2 is the top byte of an f16. e4m3 comes back as its
  // value times 2^-8 (kFp8E4M3LoadScale: callers fold 2^8 into their scale factor): its bits
  // placed into f16 bits (sign-extended and shifted by 7, bit 14 cleared: sign to bit 15,
  // exponent and mantissa to bits 13..7) are exactly that f16, which F16C widens; S.1111.111,
  // its NaN, has bits 13..7 all set, and gets the f16 exponent's top bit too (a NaN).
  // load_fp8_e4m3_finite skips that last step: the same values for every other code, a finite
  // one for the NaN pattern, in four instructions instead of seven, for loops that restore the
  // NaN results themselves.
  static Vec load_i8(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))};
  }
  static Vec load_fp8_e5m2(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return {_mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), b))};
  }
  static Vec load_fp8_e4m3(const uint8_t* p) {
    const __m128i h = fp8_e4m3_f16_bits(p);
    // (bits 13..7) + 1 carries into bit 14 (0 in h) exactly for the NaN pattern, and no further.
    const __m128i carry = _mm_add_epi16(h, _mm_set1_epi16(0x0080));
    return {_mm256_cvtph_ps(_mm_or_si128(h, _mm_and_si128(carry, _mm_set1_epi16(0x4000))))};
  }
  static Vec load_fp8_e4m3_finite(const uint8_t* p) {
    return {_mm256_cvtph_ps(fp8_e4m3_f16_bits(p))};
  }
  // e4m3 for the direct decode loop: the value times 2^-kE4m3DirectExponent, the NaN code finite.
  // Here the bits go straight into an f32's (sign-extended, shifted by 20, bits 30..27 cleared:
  // sign to bit 31, exponent and mantissa to bits 26..20), three integer instructions and no
  // F16C: exactly the value times 2^-120, its subnormals f32 subnormals (which MXCSR.DAZ would
  // read as 0: the loop clears it, float_env.h).
  static constexpr int kE4m3DirectExponent = 120;
  static Vec load_fp8_e4m3_direct(const uint8_t* p) {
    const __m256i d = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i kept = _mm256_set1_epi32(static_cast<int>(0x87F00000u));
    return {_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(d, 20), kept))};
  }
  static __m128i fp8_e4m3_f16_bits(const uint8_t* p) {
    const __m128i w = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    return _mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(-16512));  // 0xBF80
  }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  // The lanes narrowed to f16 bits, rounded to nearest even: convert::f32_to_f16's bits (NaN
  // quieted with its payload's top bits, overflow to inf, subnormals rounded), as F16C rounds
  // with its own rounding mode, not MXCSR's.
  void store_f16(uint16_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

inline Vec operator+(Vec a, Vec b) {
  return {_mm256_add_ps(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {_mm256_sub_ps(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {_mm256_mul_ps(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {_mm256_div_ps(a.v, b.v)};
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return {_mm256_fmadd_ps(a.v, b.v, c.v)};
}
inline Vec max_keep_b_nan(Vec a, Vec b) {
  return {_mm256_max_ps(a.v, b.v)};
}
inline Vec min_keep_b_nan(Vec a, Vec b) {
  return {_mm256_min_ps(a.v, b.v)};
}
inline Vec abs(Vec a) {
  return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)};
}
inline float reduce_max(Vec a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float reduce_add(Vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline Vec select_in_range(Vec value, Vec position, float lo, float hi, Vec fill) {
  const __m256 inside = _mm256_and_ps(_mm256_cmp_ps(position.v, _mm256_set1_ps(lo), _CMP_GE_OQ),
                                      _mm256_cmp_ps(position.v, _mm256_set1_ps(hi), _CMP_LT_OQ));
  return {_mm256_blendv_ps(fill.v, value.v, inside)};
}
// True when some lane of a is greater than bound (NaN lanes are not).
inline bool any_above(Vec a, float bound) {
  return _mm256_movemask_ps(_mm256_cmp_ps(a.v, _mm256_set1_ps(bound), _CMP_GT_OQ)) != 0;
}
inline Vec select_abs_less(Vec a, float bound, Vec small, Vec large) {
  const __m256 mask = _mm256_cmp_ps(abs(a).v, _mm256_set1_ps(bound), _CMP_LT_OQ);
  return {_mm256_blendv_ps(large.v, small.v, mask)};
}
inline Vec copy_sign(Vec magnitude, Vec sign) {
  const __m256 mask = _mm256_set1_ps(-0.0f);
  return {_mm256_or_ps(_mm256_andnot_ps(mask, magnitude.v), _mm256_and_ps(mask, sign.v))};
}
// 2^n * p for integral-valued n in [-150, 128] and p in [0.7, 1.5]; n <= -126 gives exactly 0, so
// that no result is subnormal (a subnormal product costs a microcode assist; flushing changes the
// sum of a row by less than 2^-125 of its largest term).
inline Vec scale_by_pow2(Vec p, Vec n) {
  const __m256 clamped = _mm256_max_ps(n.v, _mm256_set1_ps(-127.f));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(clamped), _mm256_set1_epi32(127));
  const __m256 normal = _mm256_cmp_ps(n.v, _mm256_set1_ps(-126.f), _CMP_NLE_UQ);
  const __m256 scale = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)), normal);
  return {_mm256_mul_ps(p.v, scale)};
}
// *n = x rounded to the nearest integer (ties to even), *f = x - *n, for |x| <= 2^22.
inline void split_nearest(Vec x, Vec* n, Vec* f) {
  n->v = _mm256_round_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  f->v = _mm256_sub_ps(x.v, n->v);
}
// split_nearest for exp2's argument, any x <= 128 or NaN: x is first clamped to -150 or above, so
// that -inf and huge negative x reach split_nearest's range (2^-150 rounds to 0 all the same).
inline void split_for_exp2(Vec x, Vec* n, Vec* f) {
  split_nearest(max_keep_b_nan(Vec::broadcast(-150.f), x), n, f);
}

// Lane k of the result is the sum of the lanes of in[k], k < 8: eight horizontal sums in three
// shuffle-and-add stages.
inline Vec lane_sums(const Vec* in) {
  __m256 pairs[4], quads[2];
  // Each 128-bit lane of pairs[i] holds (in[2i], in[2i+1], in[2i], in[2i+1]) partials.
  for (int i = 0; i < 4; ++i) {
    pairs[i] = _mm256_add_ps(_mm256_unpacklo_ps(in[2 * i].v, in[2 * i + 1].v),
                             _mm256_unpackhi_ps(in[2 * i].v, in[2 * i + 1].v));
  }
  // Each 128-bit lane of quads[i] holds that lane's partials of in[4i .. 4i+3].
  for (int i = 0; i < 2; ++i) {
    quads[i] = _mm256_add_ps(_mm256_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  }
  return {_mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                        _mm256_permute2f128_ps(quads[0], quads[1], 0x31))};
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for an 8 x 8 tile.
inline void transpose_tile(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m256 r[8], t[8], s[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // s[4h + k] holds column k (low half) and k + 4 (high half) of rows 4h .. 4h + 3.
  for (int h = 0; h < 2; ++h) {
    s[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    s[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(dst + k * dst_stride, _mm256_permute2f128_ps(s[k], s[4 + k], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * dst_stride, _mm256_permute2f128_ps(s[k], s[4 + k], 0x31));
  }
}
