// Which calls take the narrow scores, the f16 switch, the 8-bit codes' bf16 values, and the neon
// path's f32 scores of unfit bf16 rows and f32 P V over value pairs (fwd_narrow_scores.h). The
// bf16 scores share the decode loop's switch, bf16_dot_scores_available
// (decode/fwd_decode_bf16_dot.cc).
#include "cpu/forward/fwd_narrow_scores.h"

#include <atomic>
#include <cstring>

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common/kv8_convert.h"
#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "plan/fwd_layout.h"
#include "runtime/cpu_features.h"

namespace anyattn::cpu {
namespace {

std::atomic<bool> g_f16_fml_enabled{true};

}  // namespace

bool f16_fml_scores_available() {
#if defined(ANYATTN_NEON_F16_FML)
  const runtime::CpuFeatures& features = runtime::cpu_features();
  const bool has_kernel = features.has_neon_path() && features.fp16_fml;
#else
  const bool has_kernel = false;
#endif
  return has_kernel && g_f16_fml_enabled.load(std::memory_order_relaxed);
}

void set_f16_fml_scores_enabled(bool enabled) {
  g_f16_fml_enabled.store(enabled, std::memory_order_relaxed);
}

NarrowScores narrow_scores_of(const FwdArgs& args) {
#if (defined(ANYATTN_NEON_BF16_DOT) && defined(ANYATTN_NEON_F16_FML)) || defined(__x86_64__) || \
    defined(_M_X64)
  if (args.head_dim < 4 || args.rotary_cos != nullptr) return NarrowScores::kNone;
  if (args.dtype == DType::kBF16 && call_takes_bf16_dot_scores(args)) {
    const bool key_factors_fit =
        narrow_key_factors_offset(args.head_dim) + kKeyBlock <= args.head_dim * kKeyBlock;
    if (args.kv_dtype == DType::kBF16 || (is_kv8(args.kv_dtype) && key_factors_fit)) {
      return NarrowScores::kBf16Pairs;
    }
  }
  if (args.dtype == DType::kF16 && args.kv_dtype == DType::kF16 && f16_fml_scores_available()) {
    return NarrowScores::kF16;
  }
#else
  (void)args;
#endif
  return NarrowScores::kNone;
}

namespace {

// The table of kv8_bf16_codes for one format.
struct Bf16Codes {
  uint16_t bits[256];
};

Bf16Codes make_bf16_codes(convert::Kv8 format) {
  Bf16Codes codes;
  for (int code = 0; code < 256; ++code) {
    const float value = convert::kv8_to_f32(format, static_cast<uint8_t>(code));
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    codes.bits[code] = static_cast<uint16_t>(bits >> 16);  // exact: the value is a bf16 value
  }
  return codes;
}

}  // namespace

const uint16_t* kv8_bf16_codes(DType kv_dtype) {
  static const Bf16Codes e4m3 = make_bf16_codes(convert::Kv8::kFp8E4M3);
  static const Bf16Codes e5m2 = make_bf16_codes(convert::Kv8::kFp8E5M2);
  static const Bf16Codes i8 = make_bf16_codes(convert::Kv8::kI8);
  switch (kv_dtype) {
    case DType::kFp8E4M3:
      return e4m3.bits;
    case DType::kFp8E5M2:
      return e5m2.bits;
    case DType::kI8:
    default:
      return i8.bits;
  }
}

#if defined(__aarch64__)
void neon_bf16::exact_pair_scores(const uint16_t* q_row, const uint32_t* k_pairs,
                                  int64_t pair_rows, int64_t keys, float* s_row) {
  for (int64_t c = 0; c < keys; c += 4) {
    float32x4_t sum = vdupq_n_f32(0.f);
    for (int64_t w = 0; w < pair_rows; ++w) {
      const uint32x4_t words = vld1q_u32(k_pairs + w * kKeyBlock + c);
      const float32x4_t even = vreinterpretq_f32_u32(vshlq_n_u32(words, 16));
      const float32x4_t odd = vreinterpretq_f32_u32(vandq_u32(words, vdupq_n_u32(0xFFFF0000u)));
      const uint32_t q_even = static_cast<uint32_t>(q_row[2 * w]) << 16;
      const uint32_t q_odd = static_cast<uint32_t>(q_row[2 * w + 1]) << 16;
      sum = vfmaq_f32(sum, vreinterpretq_f32_u32(vdupq_n_u32(q_even)), even);
      sum = vfmaq_f32(sum, vreinterpretq_f32_u32(vdupq_n_u32(q_odd)), odd);
    }
    vst1q_f32(s_row + c, sum);
  }
}

void neon_bf16::exact_pair_pv(const float* p, int64_t rows, const uint32_t* v_pairs,
                              const float* factors, int64_t keys, float* o, int64_t dv_pad,
                              int64_t columns) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* p_row = p + r * kKeyBlock;
    for (int64_t c = 0; c < columns; c += 4) {
      float* o_columns = o + r * dv_pad + c;
      float32x4_t sum = vld1q_f32(o_columns);
      for (int64_t t = 0; 2 * t < keys; ++t) {
        const uint32x4_t words = vld1q_u32(v_pairs + t * dv_pad + c);
        float32x4_t even = vreinterpretq_f32_u32(vshlq_n_u32(words, 16));
        float32x4_t odd = vreinterpretq_f32_u32(vandq_u32(words, vdupq_n_u32(0xFFFF0000u)));
        if (factors != nullptr) {
          even = vmulq_n_f32(even, factors[2 * t]);
          odd = vmulq_n_f32(odd, factors[2 * t + 1]);
        }
        sum = vfmaq_n_f32(sum, even, p_row[2 * t]);
        sum = vfmaq_n_f32(sum, odd, p_row[2 * t + 1]);
      }
      vst1q_f32(o_columns, sum);
    }
  }
}
#endif

}  // namespace anyattn::cpu
