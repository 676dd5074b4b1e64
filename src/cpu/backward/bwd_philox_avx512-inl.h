// dropout_keep_factors64 (bwd_philox.h) in AVX-512 integer intrinsics: the same decisions, bit
// for bit (tests/backward/bwd_dropout_test.cc compares them), several times faster than what compilers
// make of the portable loop (they use the slow 64-bit vpmullq for the 32 x 32 -> 64 products).
//
// Included inside an AVX-512 target region (avx512f, avx512dq), inside an ISA-specific namespace,
// after <immintrin.h> and cpu/philox.h.
//
// Layout: lane l of the four counter registers c0..c3 is Philox call l (keys j0 + 4l .. j0 + 4l +
// 3). A round needs the full 64-bit products of c0 and c2 with the round multipliers: vpmuludq
// multiplies the even 32-bit lanes, so the odd lanes are shifted down and multiplied separately,
// and the high and low halves are blended back into 16-lane registers. At the end, word w of call
// l is key 4l + w: the four 16-lane results are interleaved by a 4 x 16 transpose.

// The 16 low and high halves of a * m for 32-bit lanes a and m.
inline void philox_mul_halves(__m512i a, __m512i m, __m512i* lo, __m512i* hi) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

inline void dropout_keep_factors64_avx512(PhiloxKey key, int64_t b, int64_t h, int64_t i,
                                          int64_t j0, uint32_t threshold, float keep_scale,
                                          float* factor) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(j0 >> 2)), lane);
  __m512i c1 = _mm512_set1_epi32(static_cast<int32_t>(i));
  __m512i c2 = _mm512_set1_epi32(static_cast<int32_t>(h));
  __m512i c3 = _mm512_set1_epi32(static_cast<int32_t>(b));
  const __m512i mul0 = _mm512_set1_epi32(static_cast<int32_t>(0xD2511F53u));
  const __m512i mul1 = _mm512_set1_epi32(static_cast<int32_t>(0xCD9E8D57u));
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    __m512i lo0, hi0, lo1, hi1;
    philox_mul_halves(c0, mul0, &lo0, &hi0);
    philox_mul_halves(c2, mul1, &lo1, &hi1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int32_t>(k0)));
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int32_t>(k1)));
    c1 = lo1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const __m512i limit = _mm512_set1_epi32(static_cast<int32_t>(threshold));
  const __m512 scale = _mm512_set1_ps(keep_scale);
  // f_w[l] = factor of key 4l + w.
  const __m512 f0 = _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(c0, limit), scale);
  const __m512 f1 = _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(c1, limit), scale);
  const __m512 f2 = _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(c2, limit), scale);
  const __m512 f3 = _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(c3, limit), scale);
  // Within each 128-bit lane L: u_k holds calls 4L + k, words 0..3.
  const __m512 t0 = _mm512_unpacklo_ps(f0, f1), t1 = _mm512_unpackhi_ps(f0, f1);
  const __m512 t2 = _mm512_unpacklo_ps(f2, f3), t3 = _mm512_unpackhi_ps(f2, f3);
  const __m512 u0 =
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
  const __m512 u1 =
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2)));
  const __m512 u2 =
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
  const __m512 u3 =
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)));
  // Output vector v = calls 4v .. 4v + 3 = 128-bit lane v of u0, u1, u2, u3.
  const __m512 x0 = _mm512_shuffle_f32x4(u0, u1, 0x44), x1 = _mm512_shuffle_f32x4(u0, u1, 0xEE);
  const __m512 y0 = _mm512_shuffle_f32x4(u2, u3, 0x44), y1 = _mm512_shuffle_f32x4(u2, u3, 0xEE);
  _mm512_storeu_ps(factor + 0, _mm512_shuffle_f32x4(x0, y0, 0x88));
  _mm512_storeu_ps(factor + 16, _mm512_shuffle_f32x4(x0, y0, 0xDD));
  _mm512_storeu_ps(factor + 32, _mm512_shuffle_f32x4(x1, y1, 0x88));
  _mm512_storeu_ps(factor + 48, _mm512_shuffle_f32x4(x1, y1, 0xDD));
}
