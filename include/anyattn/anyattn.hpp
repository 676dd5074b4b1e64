// anyattn C++ API: a thin, header-only C++17 layer over the C ABI in anyattn/anyattn.h.
//
// Everything here is an inline call into the C ABI; the header adds types, defaults and error
// handling, never semantics. The exact contract (shapes, mask alignment, softcap, ALiBi, sinks,
// fully masked rows) is in docs/semantics.md; the entry points are listed in docs/api.md.
//
// Error convention: EXCEPTIONS. Every function that can fail throws anyattn::Error, a
// std::runtime_error that carries the C status code (`status()`) and the library's message
// (`message()`, which names the parameter, the value given and what is supported). `what()` is
// "<STATUS_NAME>: <message>". A call that throws has written nothing to its outputs. The header
// therefore needs exceptions enabled; code built with -fno-exceptions should call the C ABI.
//
// Naming: types are CamelCase (TensorView, FwdOptions), enumerators are kConstant, and functions
// keep the C ABI's snake_case names without the `anyattn_` prefix (anyattn_fwd -> anyattn::fwd).
//
// Example:
//   std::vector<float> q(B * Sq * H * D), k(...), v(...), out(B * Sq * H * D);
//   anyattn::FwdOptions opt;
//   opt.causal = true;
//   anyattn::fwd(anyattn::TensorView(q.data(), {B, Sq, H, D}),
//                anyattn::TensorView(k.data(), {B, Sk, H, D}),
//                anyattn::TensorView(v.data(), {B, Sk, H, D}),
//                anyattn::TensorView(out.data(), {B, Sq, H, D}), std::nullopt, opt);
#ifndef ANYATTN_ANYATTN_HPP_
#define ANYATTN_ANYATTN_HPP_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "anyattn/anyattn.h"

namespace anyattn {

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

// Thrown by every function of this header that fails. Carries the C status and the message.
class Error : public std::runtime_error {
 public:
  Error(anyattn_status status, const std::string& message)
      : std::runtime_error(status_text(status) + ": " + message),
        status_(status),
        message_(message) {}

  // The C status code; never ANYATTN_OK.
  anyattn_status status() const noexcept { return status_; }
  // The library's message alone, without the status name.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string status_text(anyattn_status status) {
    const char* name = anyattn_status_name(status);
    return name != nullptr ? name : "anyattn status " + std::to_string(static_cast<int>(status));
  }

  anyattn_status status_;
  std::string message_;
};

// Throws Error(status, anyattn_last_error()) unless status is ANYATTN_OK. Call it right after a C
// ABI call on the same thread, before any other anyattn call replaces the thread's message.
inline void check(anyattn_status status) {
  if (status != ANYATTN_OK) {
    const char* message = anyattn_last_error();
    throw Error(status, message != nullptr ? message : "");
  }
}

// ------------------------------------------------------------------------------------------------
// Dtypes and storage types
// ------------------------------------------------------------------------------------------------

// Element types, with the C ABI's values.
enum class DType : int32_t {
  kF32 = ANYATTN_DTYPE_F32,
  kF16 = ANYATTN_DTYPE_F16,
  kBF16 = ANYATTN_DTYPE_BF16,
  kI32 = ANYATTN_DTYPE_I32,
  // 8-bit KV-cache storage (k_cache/v_cache of fwd_kvcache only), dequantized as
  // stored * descale * token_scale: see KvCacheOptions.
  kFP8E4M3 = ANYATTN_DTYPE_FP8_E4M3,
  kFP8E5M2 = ANYATTN_DTYPE_FP8_E5M2,
  kI8 = ANYATTN_DTYPE_I8,
};

// IEEE 754 binary16 storage: 16 raw bits, no arithmetic. Conversions round to nearest even.
struct Float16 {
  uint16_t bits;

  // The binary16 nearest to `x` (ties to even); overflow gives +-inf, NaN stays NaN (quiet).
  static Float16 from_float(float x) noexcept {
    uint32_t f;
    std::memcpy(&f, &x, sizeof f);
    const uint32_t sign = (f >> 16) & 0x8000u;
    const uint32_t abs = f & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) {  // NaN: quiet, keeping the top payload bits (as F16C does).
      return {static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu))};
    }
    if (abs >= 0x477FF000u) return {static_cast<uint16_t>(sign | 0x7C00u)};  // inf, or past 65504.
    if (abs < 0x38800000u) {  // Below 2^-14: a binary16 subnormal or zero.
      if (abs < 0x33000000u) return {static_cast<uint16_t>(sign)};  // At most half of 2^-24.
      const uint32_t exp = abs >> 23;
      const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
      const uint32_t shift = 126u - exp;  // Places the value in units of 2^-24.
      uint32_t half = mant >> shift;
      const uint32_t rest = mant & ((1u << shift) - 1u);
      const uint32_t halfway = 1u << (shift - 1u);
      if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
      return {static_cast<uint16_t>(sign | half)};
    }
    uint32_t half = ((abs >> 13) - (112u << 10));  // Rebias the exponent from 127 to 15.
    const uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // May carry into exponent.
    return {static_cast<uint16_t>(sign | half)};
  }

  // The exact float value of these bits.
  float to_float() const noexcept {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t exp = (bits >> 10) & 0x1Fu;
    uint32_t mant = bits & 0x3FFu;
    uint32_t f;
    if (exp == 0x1Fu) {
      f = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
      f = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      f = sign;
    } else {  // Subnormal: normalise the mantissa.
      uint32_t e = 113u;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      f = sign | (e << 23) | ((mant & 0x3FFu) << 13);
    }
    float x;
    std::memcpy(&x, &f, sizeof x);
    return x;
  }
};

// bfloat16 storage: the top 16 bits of an IEEE binary32. Conversions round to nearest even.
struct BFloat16 {
  uint16_t bits;

  // The bfloat16 nearest to `x` (ties to even); NaN stays NaN.
  static BFloat16 from_float(float x) noexcept {
    uint32_t f;
    std::memcpy(&f, &x, sizeof f);
    if ((f & 0x7FFFFFFFu) > 0x7F800000u) return {static_cast<uint16_t>((f >> 16) | 0x0040u)};
    f += 0x7FFFu + ((f >> 16) & 1u);
    return {static_cast<uint16_t>(f >> 16)};
  }

  // The exact float value of these bits.
  float to_float() const noexcept {
    const uint32_t f = static_cast<uint32_t>(bits) << 16;
    float x;
    std::memcpy(&x, &f, sizeof x);
    return x;
  }
};

static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2, "storage types must be 2 bytes");

// The 8-bit float storage types of a KV cache: raw bits, no arithmetic. to_float is exact;
// from_float rounds to nearest even and saturates to the largest finite value, infinities included
// (as the library's in-place append does); NaN stays NaN. Float8E4M3 follows torch.float8_e4m3fn
// (no infinities, largest finite 448, NaN S.1111.111), Float8E5M2 follows torch.float8_e5m2
// (IEEE-like, largest finite 57344).
namespace detail {

// The float value of an 8-bit float with kMant mantissa bits and exponent bias kBias.
template <int kMant, int kBias>
inline float fp8_to_float(uint8_t bits) noexcept {
  constexpr int kExpBits = 7 - kMant;
  const int exp = (bits >> kMant) & ((1 << kExpBits) - 1);
  const int mant = bits & ((1 << kMant) - 1);
  float magnitude;
  if (exp == 0) {
    magnitude = static_cast<float>(mant) * std::ldexp(1.0f, 1 - kBias - kMant);
  } else {
    magnitude = (1.0f + static_cast<float>(mant) / (1 << kMant)) * std::ldexp(1.0f, exp - kBias);
  }
  return (bits & 0x80u) ? -magnitude : magnitude;
}

// The 8-bit float nearest to `x` (ties to even) with kMant mantissa bits and bias kBias, whose
// largest finite magnitude has the bit pattern kMaxBits; larger magnitudes and infinities saturate
// to it. NaN becomes S.1111111 (a NaN in both formats), keeping the sign.
template <int kMant, int kBias, uint8_t kMaxBits>
inline uint8_t fp8_from_float(float x) noexcept {
  const uint8_t sign = std::signbit(x) ? 0x80u : 0x00u;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7Fu);  // all exponent and mantissa bits
  const float a = std::fabs(x);
  const float max_finite = fp8_to_float<kMant, kBias>(kMaxBits);
  if (a >= max_finite) return static_cast<uint8_t>(sign | kMaxBits);  // infinities included
  // Values are multiples of the spacing 2^(e - kMant) of a's binade (subnormals: the smallest).
  int e = a > 0.0f ? std::ilogb(a) : 1 - kBias;
  if (e < 1 - kBias) e = 1 - kBias;
  const float unit = std::ldexp(1.0f, e - kMant);
  const float units = std::nearbyint(a / unit);  // the default rounding mode: nearest even
  const float rounded = units * unit;
  if (rounded >= max_finite) return static_cast<uint8_t>(sign | kMaxBits);
  // Encode `rounded`, exactly representable: it may have carried into the next binade.
  if (rounded == 0.0f) return sign;
  int re = std::ilogb(rounded);
  if (re < 1 - kBias) {  // subnormal
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(rounded / std::ldexp(1.0f, 1 - kBias - kMant)));
  }
  const int mant = static_cast<int>(rounded / std::ldexp(1.0f, re - kMant)) - (1 << kMant);
  return static_cast<uint8_t>(sign | ((re + kBias) << kMant) | mant);
}

}  // namespace detail

struct Float8E4M3 {
  uint8_t bits;
  static Float8E4M3 from_float(float x) noexcept {
    return {detail::fp8_from_float<3, 7, 0x7E>(x)};
  }
  float to_float() const noexcept {
    if ((bits & 0x7Fu) == 0x7Fu) return std::numeric_limits<float>::quiet_NaN();
    return detail::fp8_to_float<3, 7>(bits);
  }
};

struct Float8E5M2 {
  uint8_t bits;
  static Float8E5M2 from_float(float x) noexcept {
    return {detail::fp8_from_float<2, 15, 0x7B>(x)};
  }
  float to_float() const noexcept {
    if ((bits & 0x7Cu) == 0x7Cu) {
      if ((bits & 0x03u) != 0) return std::numeric_limits<float>::quiet_NaN();
      return (bits & 0x80u) ? -std::numeric_limits<float>::infinity()
                            : std::numeric_limits<float>::infinity();
    }
    return detail::fp8_to_float<2, 15>(bits);
  }
};

static_assert(sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1, "fp8 types must be 1 byte");

// dtype_of<T>::value is the DType of element type T; defined for float, Float16, BFloat16,
// int32_t, Float8E4M3, Float8E5M2 and int8_t only, so a pointer of any other type does not compile
// into a TensorView.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> : std::integral_constant<DType, DType::kF32> {};
template <>
struct dtype_of<Float16> : std::integral_constant<DType, DType::kF16> {};
template <>
struct dtype_of<BFloat16> : std::integral_constant<DType, DType::kBF16> {};
template <>
struct dtype_of<int32_t> : std::integral_constant<DType, DType::kI32> {};
template <>
struct dtype_of<Float8E4M3> : std::integral_constant<DType, DType::kFP8E4M3> {};
template <>
struct dtype_of<Float8E5M2> : std::integral_constant<DType, DType::kFP8E5M2> {};
template <>
struct dtype_of<int8_t> : std::integral_constant<DType, DType::kI8> {};

// ------------------------------------------------------------------------------------------------
// Shapes and tensor views
// ------------------------------------------------------------------------------------------------

// Up to ANYATTN_MAX_NDIM extents or strides, built from a braced list ({B, S, H, D}), a pointer
// and a count, or any contiguous container of int64_t (std::vector, std::array). More than
// ANYATTN_MAX_NDIM values throws Error(ANYATTN_E_INVALID_ARGUMENT). The constructors are implicit
// by design, so that a braced list or a vector can be passed where Dims is expected. Braced lists
// hold int64_t: int and int64_t values are fine, size_t values need a cast.
class Dims {
 public:
  Dims(std::initializer_list<int64_t> values) : Dims(values.begin(), values.size()) {}
  Dims(const int64_t* values, size_t count) : size_(static_cast<int32_t>(count)) {
    if (count > ANYATTN_MAX_NDIM) {
      throw Error(ANYATTN_E_INVALID_ARGUMENT, "anyattn::Dims: " + std::to_string(count) +
                                                  " dimensions given; at most " +
                                                  std::to_string(ANYATTN_MAX_NDIM) + " supported");
    }
    for (size_t i = 0; i < count; ++i) values_[i] = values[i];
  }
  template <typename Container,
            typename = std::enable_if_t<std::is_convertible_v<
                decltype(std::data(std::declval<const Container&>())), const int64_t*>>>
  Dims(const Container& values) : Dims(std::data(values), std::size(values)) {}

  int32_t size() const noexcept { return size_; }
  const int64_t* data() const noexcept { return values_; }
  int64_t operator[](int32_t i) const noexcept { return values_[i]; }

 private:
  int64_t values_[ANYATTN_MAX_NDIM] = {};
  int32_t size_ = 0;
};

// A non-owning strided view of memory: an anyattn_tensor with constructors. Shapes and strides
// count ELEMENTS. The view does not own or copy data; the memory must outlive every call that uses
// the view. A `const TensorView&` parameter that is an output is still written through: constness
// belongs to the view, not to the data. Input views may be built from const pointers; the library
// never writes through q, k, v, ALiBi slopes or sinks.
class TensorView {
 public:
  // An empty view (null data, ndim 0). Every entry point rejects it.
  TensorView() noexcept : t_{} {}

  // A C-contiguous (row-major) view of `shape` over `data` with an explicit dtype. Strides are
  // those of anyattn_tensor_init_contiguous; throws Error for a rank outside [1, 4] or a negative
  // extent.
  TensorView(const void* data, DType dtype, Dims shape) : t_{} {
    check(anyattn_tensor_init_contiguous(&t_, const_cast<void*>(data),
                                         static_cast<anyattn_dtype>(dtype), shape.size(),
                                         shape.data()));
  }

  // A view with explicit strides (in elements). shape and strides must have the same length, in
  // [1, 4]; everything else (unit last stride, ranges) is checked by the call that uses the view.
  TensorView(const void* data, DType dtype, Dims shape, Dims strides) : t_{} {
    if (shape.size() != strides.size() || shape.size() < 1) {
      throw Error(ANYATTN_E_INVALID_ARGUMENT,
                  "anyattn::TensorView: shape has " + std::to_string(shape.size()) +
                      " dimensions and strides " + std::to_string(strides.size()) +
                      "; they must match and be in [1, " + std::to_string(ANYATTN_MAX_NDIM) + "]");
    }
    t_.data = const_cast<void*>(data);
    t_.dtype = static_cast<int32_t>(dtype);
    t_.ndim = shape.size();
    for (int32_t i = 0; i < shape.size(); ++i) {
      t_.shape[i] = shape[i];
      t_.strides[i] = strides[i];
    }
  }

  // Typed forms: the dtype is deduced from T (see dtype_of); other pointer types (void*,
  // uint16_t*, double*) need the explicit-dtype forms above or do not compile.
  template <typename T, typename = decltype(dtype_of<T>::value)>
  TensorView(const T* data, Dims shape) : TensorView(data, dtype_of<T>::value, shape) {}
  template <typename T, typename = decltype(dtype_of<T>::value)>
  TensorView(const T* data, Dims shape, Dims strides)
      : TensorView(data, dtype_of<T>::value, shape, strides) {}

  // Wraps an existing C descriptor as is.
  explicit TensorView(const anyattn_tensor& t) noexcept : t_(t) {}

  void* data() const noexcept { return t_.data; }
  DType dtype() const noexcept { return static_cast<DType>(t_.dtype); }
  int32_t ndim() const noexcept { return t_.ndim; }
  // Extent and stride of dimension i, for 0 <= i < ndim().
  int64_t shape(int32_t i) const noexcept { return t_.shape[i]; }
  int64_t stride(int32_t i) const noexcept { return t_.strides[i]; }
  // The product of the extents (1 for a view of rank 0).
  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int32_t i = 0; i < t_.ndim; ++i) n *= t_.shape[i];
    return n;
  }

  // The C descriptor, for calls into the C ABI.
  const anyattn_tensor& c_tensor() const noexcept { return t_; }

 private:
  anyattn_tensor t_;
};

// ------------------------------------------------------------------------------------------------
// Instruction-set paths and threads
// ------------------------------------------------------------------------------------------------

// Kernel instruction-set paths, with the C ABI's values.
enum class Isa : int32_t {
  kAuto = ANYATTN_ISA_AUTO,          // Fastest supported, or the ANYATTN_ISA environment variable.
  kPortable = ANYATTN_ISA_PORTABLE,  // Plain C++; every machine.
  kAvx2 = ANYATTN_ISA_AVX2,          // x86-64 AVX2 + FMA + F16C.
  kAvx512 = ANYATTN_ISA_AVX512,      // x86-64 AVX-512 F/BW/VL/DQ.
  kAvx512Amx = ANYATTN_ISA_AVX512_AMX,  // kAvx512 with bf16 products on AMX tiles.
  kNeon = ANYATTN_ISA_NEON,             // AArch64 Advanced SIMD.
};

// How a forward call multiplies the probabilities by V, and a backward call its gradient
// products (anyattn_precision in anyattn.h).
enum class Precision : int32_t {
  kDefault = ANYATTN_PRECISION_DEFAULT,    // kAccurate, or kFast if ANYATTN_PRECISION=fast.
  kAccurate = ANYATTN_PRECISION_ACCURATE,  // P V and the gradients at f32 accuracy on every path.
  kFast = ANYATTN_PRECISION_FAST,  // bf16 calls may round P (P Z, dS) to bf16 before P V (dV,
                                   // dK, dQ).
};

// True if this build contains `isa` and the running CPU can execute it.
inline bool isa_supported(Isa isa) {
  return anyattn_isa_supported(static_cast<anyattn_isa>(isa)) != 0;
}
// The path Isa::kAuto resolves to on this machine; never Isa::kAuto.
inline Isa default_isa() {
  return static_cast<Isa>(anyattn_isa_default());
}
// "auto", "portable", "avx2", "avx512", "avx512_amx", "neon" or "unknown".
inline const char* isa_name(Isa isa) {
  return anyattn_isa_name(static_cast<anyattn_isa>(isa));
}

// Sets the process-wide thread count of later calls; n <= 0 restores the default
// (ANYATTN_NUM_THREADS, else the CPUs of the process's affinity mask). Results are bitwise
// independent of the thread count.
inline void set_num_threads(int n) {
  anyattn_set_num_threads(n);
}
// The thread count later calls will use.
inline int get_num_threads() {
  return anyattn_get_num_threads();
}

// The loaded library's version, encoded as major * 10000 + minor * 100 + patch. Compare with
// ANYATTN_VERSION (the header's) to detect a header/library mismatch.
inline int version() {
  return anyattn_version();
}
// The same as "major.minor.patch".
inline const char* version_string() {
  return anyattn_version_string();
}

// ------------------------------------------------------------------------------------------------
// Forward attention
// ------------------------------------------------------------------------------------------------

// Options of fwd(); every field defaults to the flash-attn 2.x default.
struct FwdOptions {
  // Multiplies <q_i, k_j>; std::nullopt selects 1/sqrt(D). Must be finite and non-zero: the C ABI
  // reserves 0 for "default", so an explicit 0 cannot be expressed and to_c() throws
  // Error(ANYATTN_E_INVALID_ARGUMENT) for it rather than silently using 1/sqrt(D).
  std::optional<float> softmax_scale;
  // Causal mask, bottom-right aligned (window_size.second becomes 0).
  bool causal = false;
  // (left, right): key j is visible to query i iff
  // i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 means unbounded on that side.
  std::pair<int, int> window_size{-1, -1};
  // If > 0, scores become softcap * tanh(score / softcap) before ALiBi and masking.
  float softcap = 0.0f;
  // f32 ALiBi slopes of shape (Hq) or (B, Hq): score += -slope * |i + Sk - Sq - j|.
  std::optional<TensorView> alibi_slopes;
  // f32 per-query-head sink logits of shape (Hq), in score units.
  std::optional<TensorView> sinks;
  // Dropout probability in [0, 1) with its Philox seed and offset (see anyattn.h); the same
  // values give the same mask in fwd and bwd. Not supported by fwd_kvcache.
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  // Splits of the key dimension; 0 = chosen from the problem shape, 1 = no split.
  int num_splits = 0;
  // Forces an instruction-set path; one the CPU cannot run throws ANYATTN_E_UNSUPPORTED.
  Isa isa = Isa::kAuto;
  // Backward only: the out and lse handed to bwd() are this library's forward results for these
  // inputs and options, so that rows of at most 64 keys may be normalised from their own scores
  // and bf16/f16 dsinks summed without out's rounding (anyattn_fwd_params::bwd_own_forward).
  // false uses out and lse as handed over.
  bool bwd_own_forward = false;
  // Whether bf16 calls may round the probabilities to bf16 before P V, and the backward P Z and
  // dS before dV, dK and dQ (anyattn_fwd_params::precision).
  Precision precision = Precision::kDefault;

  // The equivalent C parameters. Its alibi_slopes and sinks pointers point into this object, so
  // the result is valid only while this object lives unchanged.
  anyattn_fwd_params to_c() const {
    anyattn_fwd_params p;
    anyattn_fwd_params_init(&p);
    if (softmax_scale.has_value()) {
      if (*softmax_scale == 0.0f) {
        throw Error(ANYATTN_E_INVALID_ARGUMENT,
                    "softmax_scale: an explicit 0 cannot be expressed (the C ABI reads 0 as "
                    "\"default 1/sqrt(D)\"); leave it unset for the default");
      }
      p.softmax_scale = *softmax_scale;
    }
    p.softcap = softcap;
    p.causal = causal ? 1 : 0;
    p.window_left = window_size.first;
    p.window_right = window_size.second;
    p.alibi_slopes = alibi_slopes ? &alibi_slopes->c_tensor() : nullptr;
    p.sinks = sinks ? &sinks->c_tensor() : nullptr;
    p.dropout_p = dropout_p;
    p.dropout_seed = dropout_seed;
    p.dropout_offset = dropout_offset;
    p.num_splits = num_splits;
    p.isa = static_cast<int32_t>(isa);
    p.bwd_own_forward = bwd_own_forward ? 1 : 0;
    p.precision = static_cast<int32_t>(precision);
    return p;
  }
};

// Dense forward attention; see anyattn_fwd in anyattn.h and docs/semantics.md.
//   q   (B, Sq, Hq, D)    f32/f16/bf16
//   k   (B, Sk, Hk, D)    q's dtype; Hq % Hk == 0
//   v   (B, Sk, Hk, Dv)   q's dtype
//   out (B, Sq, Hq, Dv)   q's dtype; written
//   lse (B, Hq, Sq)       f32; written when given
// 0 <= D <= 576, 0 <= Dv <= 512 (0: docs/semantics.md, section 6); the last dimension of every
// tensor has stride 1; out must not overlap an input or lse. Throws Error on any invalid argument, and then writes nothing.
inline void fwd(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const std::optional<TensorView>& lse = std::nullopt,
                const FwdOptions& options = FwdOptions()) {
  const anyattn_fwd_params params = options.to_c();
  check(anyattn_fwd(&q.c_tensor(), &k.c_tensor(), &v.c_tensor(), &out.c_tensor(),
                    lse ? &lse->c_tensor() : nullptr, &params));
}

// The same without lse.
inline void fwd(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const FwdOptions& options) {
  fwd(q, k, v, out, std::nullopt, options);
}

// Variable-length forward over packed sequences; see anyattn_fwd_varlen in anyattn.h.
//   q (total_q, Hq, D), k (total_k, Hk, D), v (total_k, Hk, Dv), out (total_q, Hq, Dv),
//   lse (Hq, total_q) f32 when given; cu_seqlens_q / cu_seqlens_k int32 (B + 1); seqused_k
//   int32 (B) when given. Throws Error on any invalid argument, and then writes nothing.
inline void fwd_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& cu_seqlens_q,
                       const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                       const std::optional<TensorView>& lse = std::nullopt,
                       const std::optional<TensorView>& seqused_k = std::nullopt,
                       const FwdOptions& options = FwdOptions()) {
  const anyattn_fwd_params params = options.to_c();
  check(anyattn_fwd_varlen(&q.c_tensor(), &k.c_tensor(), &v.c_tensor(), &out.c_tensor(),
                           lse ? &lse->c_tensor() : nullptr, &cu_seqlens_q.c_tensor(),
                           &cu_seqlens_k.c_tensor(), seqused_k ? &seqused_k->c_tensor() : nullptr,
                           max_seqlen_q, max_seqlen_k, &params));
}

// The cache-specific arguments of fwd_kvcache; every field mirrors anyattn_kvcache_params.
struct KvCacheOptions {
  std::optional<TensorView> k_new;            // (B, S_new, Hk, D): appended in place
  std::optional<TensorView> v_new;            // (B, S_new, Hk, Dv)
  std::optional<TensorView> cache_seqlens;    // int32 (B); else cache_seqlen for all
  int64_t cache_seqlen = -1;                  // -1: the whole (contiguous) cache
  std::optional<TensorView> cache_batch_idx;  // int32 (B)
  std::optional<TensorView> cache_leftpad;    // int32 (B)
  std::optional<TensorView> block_table;      // int32 (B, max_blocks): paged cache
  std::optional<TensorView> rotary_cos;       // (S_rotary, rotary_dim / 2)
  std::optional<TensorView> rotary_sin;
  bool rotary_interleaved = false;
  // 8-bit caches (k_cache/v_cache of dtype kFP8E4M3, kFP8E5M2 or kI8) are read as
  // stored * descale * token_scale. Each is f32 and optional (absent = 1):
  std::optional<TensorView> k_descale;      // (1), (Hk) or (B, Hk): per tensor / kv head / seq
  std::optional<TensorView> v_descale;
  std::optional<TensorView> k_token_scale;  // (B_cache, S_cache, Hk) or paged (num_blocks,
  std::optional<TensorView> v_token_scale;  // page_size, Hk); written by the in-place append

  // The equivalent C struct; its pointers point into this object.
  anyattn_kvcache_params to_c() const {
    anyattn_kvcache_params c;
    anyattn_kvcache_params_init(&c);
    const auto ptr = [](const std::optional<TensorView>& t) {
      return t ? &t->c_tensor() : nullptr;
    };
    c.k_new = ptr(k_new);
    c.v_new = ptr(v_new);
    c.cache_seqlens = ptr(cache_seqlens);
    c.cache_seqlen = cache_seqlen;
    c.cache_batch_idx = ptr(cache_batch_idx);
    c.cache_leftpad = ptr(cache_leftpad);
    c.block_table = ptr(block_table);
    c.rotary_cos = ptr(rotary_cos);
    c.rotary_sin = ptr(rotary_sin);
    c.rotary_interleaved = rotary_interleaved ? 1 : 0;
    c.k_descale = ptr(k_descale);
    c.v_descale = ptr(v_descale);
    c.k_token_scale = ptr(k_token_scale);
    c.v_token_scale = ptr(v_token_scale);
    return c;
  }
};

// Attention of q against a KV cache with optional in-place append and rotary; see
// anyattn_fwd_kvcache in anyattn.h. Everything is validated before the cache is written.
inline void fwd_kvcache(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                        const TensorView& out, const KvCacheOptions& cache,
                        const std::optional<TensorView>& lse = std::nullopt,
                        const FwdOptions& options = FwdOptions()) {
  const anyattn_fwd_params params = options.to_c();
  const anyattn_kvcache_params cache_params = cache.to_c();
  check(anyattn_fwd_kvcache(&q.c_tensor(), &k_cache.c_tensor(), &v_cache.c_tensor(),
                            &out.c_tensor(), lse ? &lse->c_tensor() : nullptr, &cache_params,
                            &params));
}

// Packed variable-length queries against a KV cache (flash-attn's paged varlen); see
// anyattn_fwd_kvcache_varlen in anyattn.h. q (total_q, Hq, D), out (total_q, Hq, Dv), lse
// (Hq, total_q) f32 when given, cu_seqlens_q int32 (B + 1). The cache is only read: cache.k_new,
// cache.v_new and the rotary tables must be empty.
inline void fwd_kvcache_varlen(const TensorView& q, const TensorView& k_cache,
                               const TensorView& v_cache, const TensorView& out,
                               const TensorView& cu_seqlens_q, int64_t max_seqlen_q,
                               const KvCacheOptions& cache,
                               const std::optional<TensorView>& lse = std::nullopt,
                               const FwdOptions& options = FwdOptions()) {
  const anyattn_fwd_params params = options.to_c();
  const anyattn_kvcache_params cache_params = cache.to_c();
  check(anyattn_fwd_kvcache_varlen(&q.c_tensor(), &k_cache.c_tensor(), &v_cache.c_tensor(),
                                   &out.c_tensor(), lse ? &lse->c_tensor() : nullptr,
                                   &cu_seqlens_q.c_tensor(), max_seqlen_q, &cache_params, &params));
}

// Merges two partial attentions over disjoint key sets by their LSE; see
// anyattn_merge_attention_states. out may be out_a (in place), lse_out may be lse_a.
inline void merge_attention_states(const TensorView& out_a, const TensorView& lse_a,
                                   const TensorView& out_b, const TensorView& lse_b,
                                   const TensorView& out,
                                   const std::optional<TensorView>& lse_out = std::nullopt) {
  check(anyattn_merge_attention_states(&out_a.c_tensor(), &lse_a.c_tensor(), &out_b.c_tensor(),
                                       &lse_b.c_tensor(), &out.c_tensor(),
                                       lse_out ? &lse_out->c_tensor() : nullptr));
}

// ------------------------------------------------------------------------------------------------
// Backward
// ------------------------------------------------------------------------------------------------

// Dense backward attention; see anyattn_bwd in anyattn.h and docs/backward.md. Pass the forward's
// q, k, v, out, lse and the same options.
//   dout (B, Sq, Hq, Dv), q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv),
//   out (B, Sq, Hq, Dv): one dtype; lse (B, Hq, Sq) f32, required
//   dq, dk, dv: shaped like q, k, v; written (dk, dv summed over each GQA group)
//   dsinks (Hq) f32: written; required iff options.sinks is set
// Throws Error on any invalid argument, and then writes nothing.
inline void bwd(const TensorView& dout, const TensorView& q, const TensorView& k,
                const TensorView& v, const TensorView& out, const TensorView& lse,
                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const std::optional<TensorView>& dsinks = std::nullopt,
                const FwdOptions& options = FwdOptions()) {
  const anyattn_fwd_params params = options.to_c();
  check(anyattn_bwd(&dout.c_tensor(), &q.c_tensor(), &k.c_tensor(), &v.c_tensor(), &out.c_tensor(),
                    &lse.c_tensor(), &dq.c_tensor(), &dk.c_tensor(), &dv.c_tensor(),
                    dsinks ? &dsinks->c_tensor() : nullptr, &params));
}

// The same without sinks.
inline void bwd(const TensorView& dout, const TensorView& q, const TensorView& k,
                const TensorView& v, const TensorView& out, const TensorView& lse,
                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const FwdOptions& options) {
  bwd(dout, q, k, v, out, lse, dq, dk, dv, std::nullopt, options);
}

// Variable-length backward over packed sequences; see anyattn_bwd_varlen in anyattn.h. Tensors as
// in fwd_varlen plus dout (total_q, Hq, Dv), lse (Hq, total_q) f32 (required), dq/dk/dv shaped
// like q/k/v, dsinks (Hq) f32 iff options.sinks is set. Throws Error on any invalid argument, and
// then writes nothing.
inline void bwd_varlen(const TensorView& dout, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& out, const TensorView& lse,
                       const TensorView& dq, const TensorView& dk, const TensorView& dv,
                       const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                       int64_t max_seqlen_q, int64_t max_seqlen_k,
                       const std::optional<TensorView>& dsinks = std::nullopt,
                       const std::optional<TensorView>& seqused_k = std::nullopt,
                       const FwdOptions& options = FwdOptions()) {
  const anyattn_fwd_params params = options.to_c();
  check(anyattn_bwd_varlen(
      &dout.c_tensor(), &q.c_tensor(), &k.c_tensor(), &v.c_tensor(), &out.c_tensor(),
      &lse.c_tensor(), &dq.c_tensor(), &dk.c_tensor(), &dv.c_tensor(),
      dsinks ? &dsinks->c_tensor() : nullptr, &cu_seqlens_q.c_tensor(), &cu_seqlens_k.c_tensor(),
      seqused_k ? &seqused_k->c_tensor() : nullptr, max_seqlen_q, max_seqlen_k, &params));
}

}  // namespace anyattn

#endif  // ANYATTN_ANYATTN_HPP_
