// 4 x f32 "vectors" in plain C++ for the portable path; compilers turn the lane loops into
// whatever SIMD the baseline target has (SSE2 on x86-64, NEON on AArch64). Same interface as
// vec_avx512.h. Include inside namespace anyattn::cpu::portable.
struct Vec {
  static constexpr int kLanes = 4;
  float v[kLanes];

  // load_in_register (vec_avx2.h): the same as load here.
  static Vec load_in_register(const float* p) { return load(p); }
  static Vec load(const float* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = p[i];
    return r;
  }
  static Vec broadcast(float x) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = x;
    return r;
  }
  static Vec zero() { return broadcast(0.f); }
  static Vec iota() {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = static_cast<float>(i);
    return r;
  }
  static Vec load_bf16(const uint16_t* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = bf16_to_f32(p[i]);
    return r;
  }
  static Vec load_f16(const uint16_t* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = f16_to_f32(p[i]);
    return r;
  }
  // 2 * kLanes bf16 values widened to f32: *even gets the even-indexed ones, *odd the others.
  static void load_bf16_pairs(const uint16_t* p, Vec* even, Vec* odd) {
    for (int i = 0; i < kLanes; ++i) {
      even->v[i] = bf16_to_f32(p[2 * i]);
      odd->v[i] = bf16_to_f32(p[2 * i + 1]);
    }
  }
  // kLanes stored 8-bit cache values as f32 (exact; scales are the caller's), through the shared
  // scalar conversions (common/kv8_convert.h); e4m3 as its value times 2^-8, as every path
  // (kFp8E4M3LoadScale).
  static Vec load_i8(const uint8_t* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = convert::i8_to_f32(p[i]);
    return r;
  }
  static Vec load_fp8_e5m2(const uint8_t* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = convert::fp8_e5m2_to_f32(p[i]);
    return r;
  }
  static Vec load_fp8_e4m3(const uint8_t* p) {
    Vec r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = convert::fp8_e4m3_to_f32(p[i]) * 0x1p-8f;
    return r;
  }
  // The other paths' load_fp8_e4m3_finite leaves the NaN pattern finite, to save instructions; a
  // scalar conversion saves nothing by it, so here it is the exact load.
  static Vec load_fp8_e4m3_finite(const uint8_t* p) { return load_fp8_e4m3(p); }
  // e4m3 for the direct decode loop: the value times 2^-kE4m3DirectExponent, as on the other
  // paths (the NaN pattern stays NaN here: load_fp8_e4m3_finite).
  static constexpr int kE4m3DirectExponent = 8;
  static Vec load_fp8_e4m3_direct(const uint8_t* p) { return load_fp8_e4m3(p); }
  void store(float* p) const {
    for (int i = 0; i < kLanes; ++i) p[i] = v[i];
  }
  void store_f16(uint16_t* p) const {
    for (int i = 0; i < kLanes; ++i) p[i] = f32_to_f16(v[i]);
  }
};

#define ANYATTN_PORTABLE_LANEWISE(expression)                  \
  Vec r;                                                       \
  for (int i = 0; i < Vec::kLanes; ++i) r.v[i] = (expression); \
  return r

inline Vec operator+(Vec a, Vec b) {
  ANYATTN_PORTABLE_LANEWISE(a.v[i] + b.v[i]);
}
inline Vec operator-(Vec a, Vec b) {
  ANYATTN_PORTABLE_LANEWISE(a.v[i] - b.v[i]);
}
inline Vec operator*(Vec a, Vec b) {
  ANYATTN_PORTABLE_LANEWISE(a.v[i] * b.v[i]);
}
inline Vec operator/(Vec a, Vec b) {
  ANYATTN_PORTABLE_LANEWISE(a.v[i] / b.v[i]);
}
// a * b + c: fused where the target has a fast fused multiply-add (__FP_FAST_FMAF: AArch64,
// POWER, RISC-V with F, x86-64 built with -mfma), as on the vector paths; elsewhere (baseline
// x86-64) std::fma would be a slow library routine, so the product is rounded first.
inline Vec fma(Vec a, Vec b, Vec c) {
#if defined(__FP_FAST_FMAF)
  ANYATTN_PORTABLE_LANEWISE(std::fma(a.v[i], b.v[i], c.v[i]));
#else
  ANYATTN_PORTABLE_LANEWISE(a.v[i] * b.v[i] + c.v[i]);
#endif
}
inline Vec max_keep_b_nan(Vec a, Vec b) {
  ANYATTN_PORTABLE_LANEWISE(a.v[i] > b.v[i] ? a.v[i] : b.v[i]);
}
inline Vec min_keep_b_nan(Vec a, Vec b) {
  ANYATTN_PORTABLE_LANEWISE(a.v[i] < b.v[i] ? a.v[i] : b.v[i]);
}
inline Vec abs(Vec a) {
  ANYATTN_PORTABLE_LANEWISE(std::fabs(a.v[i]));
}
inline Vec select_in_range(Vec value, Vec position, float lo, float hi, Vec fill) {
  ANYATTN_PORTABLE_LANEWISE(position.v[i] >= lo && position.v[i] < hi ? value.v[i] : fill.v[i]);
}
// True when some lane of a is greater than bound (NaN lanes are not).
inline bool any_above(Vec a, float bound) {
  bool above = false;
  for (int i = 0; i < Vec::kLanes; ++i) above = above || a.v[i] > bound;
  return above;
}
inline Vec select_abs_less(Vec a, float bound, Vec small, Vec large) {
  ANYATTN_PORTABLE_LANEWISE(std::fabs(a.v[i]) < bound ? small.v[i] : large.v[i]);
}
inline Vec copy_sign(Vec magnitude, Vec sign) {
  ANYATTN_PORTABLE_LANEWISE(std::copysign(magnitude.v[i], sign.v[i]));
}
// *n = x rounded to the nearest integer (ties to even), *f = x - *n, for |x| <= 2^22.
inline void split_nearest(Vec x, Vec* n, Vec* f) {
  for (int i = 0; i < Vec::kLanes; ++i) n->v[i] = std::nearbyint(x.v[i]);
  *f = x - *n;
}
// split_nearest for exp2's argument, any x <= 128 or NaN: x is first clamped to -150 or above, so
// that -inf and huge negative x reach split_nearest's range (2^-150 rounds to 0 all the same).
inline void split_for_exp2(Vec x, Vec* n, Vec* f) {
  split_nearest(max_keep_b_nan(Vec::broadcast(-150.f), x), n, f);
}
// 2^n * p for integral-valued n; n <= -126 (or NaN) scales by exactly 0, like the other paths:
// no result is subnormal.
inline Vec scale_by_pow2(Vec p, Vec n) {
  ANYATTN_PORTABLE_LANEWISE(
      p.v[i] *
      bits_to_f32(
          static_cast<uint32_t>((n.v[i] > -126.f ? static_cast<int32_t>(n.v[i]) : -127) + 127)
          << 23));
}
#undef ANYATTN_PORTABLE_LANEWISE

inline float reduce_max(Vec a) {
  float m = a.v[0];
  for (int i = 1; i < Vec::kLanes; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}
inline float reduce_add(Vec a) {
  float s = 0.f;
  for (int i = 0; i < Vec::kLanes; ++i) s += a.v[i];
  return s;
}

// Lane k of the result is the sum of the lanes of in[k], k < kLanes.
inline Vec lane_sums(const Vec* in) {
  Vec r;
  for (int k = 0; k < Vec::kLanes; ++k) r.v[k] = reduce_add(in[k]);
  return r;
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for a 4 x 4 tile.
inline void transpose_tile(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  for (int r = 0; r < Vec::kLanes; ++r) {
    for (int c = 0; c < Vec::kLanes; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
  }
}
