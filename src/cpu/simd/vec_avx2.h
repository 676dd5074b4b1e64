// 8 x f32 vectors on AVX2 + FMA + F16C. Include only inside an ANYATTN_TARGET_BEGIN region for
// "avx2,fma,f16c", inside namespace anyattn::cpu::avx2. Same interface as vec_avx512.h.
struct Vec {
  static constexpr int kLanes = 8;
  __m256 v;

  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
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
  void store(float* p) const { _mm256_storeu_ps(p, v); }
};

inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec max_keep_b_nan(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
inline Vec min_keep_b_nan(Vec a, Vec b) { return {_mm256_min_ps(a.v, b.v)}; }
inline Vec abs(Vec a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
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
inline Vec select_abs_less(Vec a, float bound, Vec small, Vec large) {
  const __m256 mask = _mm256_cmp_ps(abs(a).v, _mm256_set1_ps(bound), _CMP_LT_OQ);
  return {_mm256_blendv_ps(large.v, small.v, mask)};
}
inline Vec copy_sign(Vec magnitude, Vec sign) {
  const __m256 mask = _mm256_set1_ps(-0.0f);
  return {_mm256_or_ps(_mm256_andnot_ps(mask, magnitude.v), _mm256_and_ps(mask, sign.v))};
}
// 2^n * p for integral-valued n in [-150, 128]; n <= -127 gives exactly 0 (the subnormal range of
// 2^n is flushed, a relative change below 2^-126 of the row's largest term).
inline Vec scale_by_pow2(Vec p, Vec n) {
  const __m256 clamped = _mm256_max_ps(n.v, _mm256_set1_ps(-127.f));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(clamped), _mm256_set1_epi32(127));
  return {_mm256_mul_ps(p.v, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)))};
}
inline Vec round_nearest(Vec a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
