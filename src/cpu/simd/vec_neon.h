// 4 x f32 vectors on AArch64 Advanced SIMD (NEON). Include after <arm_neon.h>, inside namespace
// anyattn::cpu::neon (or a test's namespace). Same interface as vec_portable.h and vec_avx2.h.
//
// Advanced SIMD, with FMA, FRINTN and the f16 <-> f32 conversions (FCVTL), is part of every
// AArch64 CPU: nothing here needs a target region or a run-time check. bf16 is widened with an
// integer shift (a bf16 value is the top half of an f32), so no FEAT_BF16 either.
struct Vec {
  static constexpr int kLanes = 4;
  float32x4_t v;

  // load_in_register (vec_avx2.h): FMLA takes no memory operand to fold a load into.
  static Vec load_in_register(const float* p) { return load(p); }
  static Vec load(const float* p) { return {vld1q_f32(p)}; }
  static Vec broadcast(float x) { return {vdupq_n_f32(x)}; }
  static Vec zero() { return {vdupq_n_f32(0.f)}; }
  static Vec iota() {
    static constexpr float kIota[kLanes] = {0.f, 1.f, 2.f, 3.f};
    return {vld1q_f32(kIota)};
  }
  static Vec load_bf16(const uint16_t* p) {
    return {vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))};
  }
  static Vec load_f16(const uint16_t* p) {
    return {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))};
  }
  // 8 bf16 values widened to f32 as two vectors: *even gets elements 0, 2, 4, 6 and *odd elements
  // 1, 3, 5, 7 (exact): each 32-bit lane holds an (even, odd) pair, even in its low half.
  static void load_bf16_pairs(const uint16_t* p, Vec* even, Vec* odd) {
    const uint32x4_t pairs = vreinterpretq_u32_u16(vld1q_u16(p));
    even->v = vreinterpretq_f32_u32(vshlq_n_u32(pairs, 16));
    odd->v = vreinterpretq_f32_u32(vandq_u32(pairs, vdupq_n_u32(0xFFFF0000u)));
  }
  // 4 stored 8-bit cache values as f32 (exact; scales are the caller's), as in vec_avx2.h: int8
  // sign-extended, e5m2 as the top byte of an f16, e4m3 as its value times 2^-8
  // (kFp8E4M3LoadScale) through f16 bits, its NaN pattern S.1111.111 made a NaN (a finite value
  // from load_fp8_e4m3_finite). Reads exactly 4 bytes.
  static uint8x8_t load_4_bytes(const uint8_t* p) {
    uint32_t word;
    std::memcpy(&word, p, sizeof(word));
    return vreinterpret_u8_u32(vdup_n_u32(word));
  }
  static Vec load_i8(const uint8_t* p) {
    const int16x8_t w = vmovl_s8(vreinterpret_s8_u8(load_4_bytes(p)));
    return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)))};
  }
  static Vec load_fp8_e5m2(const uint8_t* p) {
    const uint16x8_t h = vshll_n_u8(load_4_bytes(p), 8);
    return {vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)))};
  }
  static Vec load_fp8_e4m3(const uint8_t* p) {
    const uint16x4_t h = fp8_e4m3_f16_bits(p);
    // The NaN pattern (bits 13..7 all set) gets the f16 exponent's top bit: an f16 NaN.
    const uint16x4_t nan = vceq_u16(vand_u16(h, vdup_n_u16(0x3F80)), vdup_n_u16(0x3F80));
    return {vcvt_f32_f16(vreinterpret_f16_u16(vorr_u16(h, vand_u16(nan, vdup_n_u16(0x4000)))))};
  }
  // e4m3 for the direct decode loop: load_fp8_e4m3_finite (the value times 2^-8). The f32-bits
  // form of the x86 paths would give subnormals, which FPCR.FZ would flush.
  static constexpr int kE4m3DirectExponent = 8;
  static Vec load_fp8_e4m3_direct(const uint8_t* p) { return load_fp8_e4m3_finite(p); }
  static Vec load_fp8_e4m3_finite(const uint8_t* p) {
    return {vcvt_f32_f16(vreinterpret_f16_u16(fp8_e4m3_f16_bits(p)))};
  }
  // Sign-extended and shifted by 7, bit 14 cleared: sign to bit 15, exponent and mantissa to
  // bits 13..7.
  static uint16x4_t fp8_e4m3_f16_bits(const uint8_t* p) {
    const int16x4_t w = vget_low_s16(vmovl_s8(vreinterpret_s8_u8(load_4_bytes(p))));
    return vand_u16(vreinterpret_u16_s16(vshl_n_s16(w, 7)), vdup_n_u16(0xBF80));
  }
  void store(float* p) const { vst1q_f32(p, v); }
  // The lanes narrowed to f16 bits (FCVTN, round to nearest even under the default FPCR), as
  // convert::f32_to_f16 gives them.
  void store_f16(uint16_t* p) const { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }
};

inline Vec operator+(Vec a, Vec b) {
  return {vaddq_f32(a.v, b.v)};
}
inline Vec operator-(Vec a, Vec b) {
  return {vsubq_f32(a.v, b.v)};
}
inline Vec operator*(Vec a, Vec b) {
  return {vmulq_f32(a.v, b.v)};
}
inline Vec operator/(Vec a, Vec b) {
  return {vdivq_f32(a.v, b.v)};
}
// a * b + c, fused (FMLA). With a a broadcast of a scalar in a register, compilers emit the
// by-element form (FMLA v.4s, v.4s, v.s[0]) and no DUP.
inline Vec fma(Vec a, Vec b, Vec c) {
  return {vfmaq_f32(c.v, a.v, b.v)};
}
// c + a[kLane] * b: FMLA by element, for kernels that load kLanes A-operand values with one vector
// load and use each lane in turn (ANYATTN_FWD_LANE_PRODUCTS in fwd_kernel-inl.h).
template <int kLane>
inline Vec fma_lane(Vec a, Vec b, Vec c) {
  return {vfmaq_laneq_f32(c.v, b.v, a.v, kLane)};
}
// a > b ? a : b lane by lane, so b whenever either is NaN, as x86's MAXPS. (FMAX returns the NaN,
// FMAXNM the number: neither keeps b.)
inline Vec max_keep_b_nan(Vec a, Vec b) {
  return {vbslq_f32(vcgtq_f32(a.v, b.v), a.v, b.v)};
}
// a < b ? a : b lane by lane, so b whenever either is NaN, as x86's MINPS.
inline Vec min_keep_b_nan(Vec a, Vec b) {
  return {vbslq_f32(vcltq_f32(a.v, b.v), a.v, b.v)};
}
inline Vec abs(Vec a) {
  return {vabsq_f32(a.v)};
}
// NaN if some lane is NaN, else the largest lane.
inline float reduce_max(Vec a) {
  return vmaxvq_f32(a.v);
}
inline float reduce_add(Vec a) {
  return vaddvq_f32(a.v);
}
inline Vec select_in_range(Vec value, Vec position, float lo, float hi, Vec fill) {
  const uint32x4_t inside =
      vandq_u32(vcgeq_f32(position.v, vdupq_n_f32(lo)), vcltq_f32(position.v, vdupq_n_f32(hi)));
  return {vbslq_f32(inside, value.v, fill.v)};
}
// True when some lane of a is greater than bound (NaN lanes are not).
inline bool any_above(Vec a, float bound) {
  return vmaxvq_u32(vcgtq_f32(a.v, vdupq_n_f32(bound))) != 0;
}
// |a| < bound ? small : large lane by lane (large for NaN); bound >= 0.
inline Vec select_abs_less(Vec a, float bound, Vec small, Vec large) {
  return {vbslq_f32(vcaltq_f32(a.v, vdupq_n_f32(bound)), small.v, large.v)};
}
inline Vec copy_sign(Vec magnitude, Vec sign) {
  return {vbslq_f32(vdupq_n_u32(0x80000000u), sign.v, magnitude.v)};
}
// 2^n * p for integral-valued n in [-150, 128] (or NaN) and p in [0.7, 1.5]; n <= -126 (or NaN)
// scales by exactly 0, like the other paths: no result is subnormal. n is integral, so the
// truncating conversion is exact; a NaN converts to 0 and is then masked.
inline Vec scale_by_pow2(Vec p, Vec n) {
  const int32x4_t biased = vaddq_s32(vcvtq_s32_f32(n.v), vdupq_n_s32(127));
  const uint32x4_t normal = vcgtq_f32(n.v, vdupq_n_f32(-126.f));
  const uint32x4_t scale = vandq_u32(vreinterpretq_u32_s32(vshlq_n_s32(biased, 23)), normal);
  return {vmulq_f32(p.v, vreinterpretq_f32_u32(scale))};
}
// *n = x rounded to the nearest integer (ties to even, FRINTN), *f = x - *n, for |x| <= 2^22.
inline void split_nearest(Vec x, Vec* n, Vec* f) {
  n->v = vrndnq_f32(x.v);
  f->v = vsubq_f32(x.v, n->v);
}
// split_nearest for exp2's argument, any x <= 128 or NaN: x is first clamped to -150 or above, so
// that -inf and huge negative x reach split_nearest's range (2^-150 rounds to 0 all the same).
inline void split_for_exp2(Vec x, Vec* n, Vec* f) {
  split_nearest(max_keep_b_nan(Vec::broadcast(-150.f), x), n, f);
}

// Lane k of the result is the sum of the lanes of in[k], k < 4: two pairwise-add stages.
inline Vec lane_sums(const Vec* in) {
  const float32x4_t low = vpaddq_f32(in[0].v, in[1].v);   // in[0] and in[1] in pairs
  const float32x4_t high = vpaddq_f32(in[2].v, in[3].v);  // in[2] and in[3] in pairs
  return {vpaddq_f32(low, high)};
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for a 4 x 4 tile: 32-bit transposes of row
// pairs, then 64-bit transposes of the 2 x 2 blocks.
inline void transpose_tile(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  const float32x4_t r0 = vld1q_f32(src);
  const float32x4_t r1 = vld1q_f32(src + src_stride);
  const float32x4_t r2 = vld1q_f32(src + 2 * src_stride);
  const float32x4_t r3 = vld1q_f32(src + 3 * src_stride);
  // t01_even = (r0[0], r1[0], r0[2], r1[2]), t01_odd = (r0[1], r1[1], r0[3], r1[3]); t23 alike.
  const float64x2_t t01_even = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
  const float64x2_t t01_odd = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
  const float64x2_t t23_even = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
  const float64x2_t t23_odd = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
  vst1q_f32(dst, vreinterpretq_f32_f64(vtrn1q_f64(t01_even, t23_even)));
  vst1q_f32(dst + dst_stride, vreinterpretq_f32_f64(vtrn1q_f64(t01_odd, t23_odd)));
  vst1q_f32(dst + 2 * dst_stride, vreinterpretq_f32_f64(vtrn2q_f64(t01_even, t23_even)));
  vst1q_f32(dst + 3 * dst_stride, vreinterpretq_f32_f64(vtrn2q_f64(t01_odd, t23_odd)));
}
