// Scalar conversions of the 8-bit KV-cache formats, and the one quantization routine of the
// in-place append: the one implementation that the kernels (through cpu/shared/half.h and the
// per-ISA vector loads, which must agree with it bit for bit), the append
// (cpu/ops/kvcache_append.cc), the f64 reference and the tests share.
//
//   float8 e4m3 ("fn", torch.float8_e4m3fn): S.EEEE.MMM, bias 7, no infinities, S.1111.111 is
//     NaN, largest finite 448, subnormals m * 2^-9.
//   float8 e5m2 (torch.float8_e5m2): S.EEEEE.MM, the top byte of an IEEE binary16: bias 15, +-inf,
//     NaNs, largest finite 57344.
//   int8: two's complement, read as its integer value.
//
// Narrowing (encode_*) rounds to nearest, ties to even, and saturates to the largest finite value
// (infinities included); NaN stays NaN in fp8 and becomes 0 in int8; int8 saturates to
// [-127, 127]. Integer operations only where the result could depend on the floating-point
// environment (flush-to-zero), as in half_convert.h.
#ifndef ANYATTN_COMMON_KV8_CONVERT_H_
#define ANYATTN_COMMON_KV8_CONVERT_H_

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/half_convert.h"

namespace anyattn::convert {

// The 8-bit cache element types, numbered as anyattn_dtype.
enum class Kv8 : int32_t { kFp8E4M3 = 4, kFp8E5M2 = 5, kI8 = 6 };

// The largest finite magnitude each format stores: the quantizer's qmax.
constexpr float kv8_max(Kv8 format) {
  return format == Kv8::kI8 ? 127.f : format == Kv8::kFp8E4M3 ? 448.f : 57344.f;
}

inline float fp8_e4m3_to_f32(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exponent = (b >> 3) & 0xFu;
  const uint32_t mantissa = b & 0x7u;
  if (exponent == 0xF && mantissa == 0x7) return bits_float(sign | 0x7fc00000u);
  if (exponent == 0) {  // subnormal (or zero): mantissa * 2^-9, a normal f32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    return bits_float(sign | float_bits(magnitude));
  }
  return bits_float(sign | ((exponent - 7 + 127) << 23) | (mantissa << 20));
}

inline float fp8_e5m2_to_f32(uint8_t b) { return f16_to_f32(static_cast<uint16_t>(b << 8)); }

inline float i8_to_f32(uint8_t b) { return static_cast<float>(static_cast<int8_t>(b)); }

inline float kv8_to_f32(Kv8 format, uint8_t b) {
  switch (format) {
    case Kv8::kFp8E4M3:
      return fp8_e4m3_to_f32(b);
    case Kv8::kFp8E5M2:
      return fp8_e5m2_to_f32(b);
    case Kv8::kI8:
    default:
      return i8_to_f32(b);
  }
}

// f32 -> a float8 with kMantissa mantissa bits and bias kBias, rounding to nearest even and
// saturating to the pattern kMaxFinite; NaN becomes kNan. Signs are kept (-0 stays -0).
template <int kMantissa, int kBias, uint32_t kMaxFinite, uint32_t kNan>
inline uint8_t encode_fp8(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | kNan);
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | kMaxFinite);
  if (a < 0x00800000u) return static_cast<uint8_t>(sign);  // f32 zero or subnormal: rounds to 0
  const int32_t exponent = static_cast<int32_t>(a >> 23) - 127 + kBias;  // target's biased exp
  const uint32_t significand = (1u << 23) | (a & 0x7fffffu);
  // Normal targets keep kMantissa bits below the leading one; subnormal ones shift further.
  const int32_t shift = 23 - kMantissa + (exponent >= 1 ? 0 : 1 - exponent);
  if (shift >= 25) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
  uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u))) ++kept;
  // Normal: (exponent - 1) << kMantissa plus kept (which holds the leading one) carries into the
  // exponent on its own; subnormal: kept is the pattern (a carry gives the smallest normal).
  uint32_t bits = exponent >= 1 ? (static_cast<uint32_t>(exponent - 1) << kMantissa) + kept : kept;
  if (bits > kMaxFinite) bits = kMaxFinite;
  return static_cast<uint8_t>(sign | bits);
}

inline uint8_t f32_to_fp8_e4m3(float f) { return encode_fp8<3, 7, 0x7E, 0x7F>(f); }
inline uint8_t f32_to_fp8_e5m2(float f) { return encode_fp8<2, 15, 0x7B, 0x7F>(f); }

// f32 -> int8: nearest, ties to even, saturated to [-127, 127]; NaN -> 0.
inline uint8_t f32_to_i8(float f) {
  if (std::isnan(f)) return 0;
  if (f >= 127.f) return 127;
  if (f <= -127.f) return static_cast<uint8_t>(static_cast<int8_t>(-127));
  const float low = std::floor(f);  // exact for |f| < 127
  const float fraction = f - low;   // exact
  float rounded = low;
  if (fraction > 0.5f || (fraction == 0.5f && std::fmod(low, 2.f) != 0.f)) rounded = low + 1.f;
  return static_cast<uint8_t>(static_cast<int8_t>(rounded));
}

inline uint8_t f32_to_kv8(Kv8 format, float f) {
  switch (format) {
    case Kv8::kFp8E4M3:
      return f32_to_fp8_e4m3(f);
    case Kv8::kFp8E5M2:
      return f32_to_fp8_e5m2(f);
    case Kv8::kI8:
    default:
      return f32_to_i8(f);
  }
}

// The one quantization of the in-place append: writes the n values x (a new key or value row of
// one kv head, after rotary) into `stored`, for a cache whose descale (finite, >= FLT_MIN) is
// `descale`.
//   token_scale == nullptr: stored[i] = Q(f32(x[i] / descale));
//   else *token_scale = min(amax / (qmax * descale), FLT_MAX) rounded to f32, amax = max |x[i]|
//        over the finite x[i] (0 when none), and stored[i] = Q(f32(x[i] / (descale *
//        *token_scale))), or 0 where *token_scale is 0 (an all-zero row, or one so small that
//        its scale underflows).
// Quotients are formed in f64 and clamped to +-2 qmax (saturation gives the same byte) before
// their rounding to f32. Q is f32_to_kv8.
inline void quantize_kv8_row(Kv8 format, const float* x, int64_t n, float descale,
                             float* token_scale, uint8_t* stored) {
  const double qmax = kv8_max(format);
  double divisor = descale;
  if (token_scale != nullptr) {
    double amax = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isfinite(x[i])) amax = std::fmax(amax, std::fabs(static_cast<double>(x[i])));
    }
    const double scale = std::fmin(amax / (qmax * descale), static_cast<double>(FLT_MAX));
    *token_scale = static_cast<float>(scale);
    if (*token_scale == 0.f) {
      for (int64_t i = 0; i < n; ++i) stored[i] = 0;
      return;
    }
    divisor = static_cast<double>(descale) * static_cast<double>(*token_scale);
  }
  for (int64_t i = 0; i < n; ++i) {
    double q = static_cast<double>(x[i]) / divisor;  // NaN stays NaN through the clamp
    if (q > 2 * qmax) q = 2 * qmax;
    if (q < -2 * qmax) q = -2 * qmax;
    stored[i] = f32_to_kv8(format, static_cast<float>(q));
  }
}

}  // namespace anyattn::convert

#endif  // ANYATTN_COMMON_KV8_CONVERT_H_
