// Which calls take the narrow scores, the f16 switch, and the neon path's f32 scores of unfit bf16
// rows (fwd_narrow_scores.h). The bf16 scores share the decode loop's switch,
// bf16_dot_scores_available (decode/fwd_decode_bf16_dot.cc).
#include "cpu/forward/fwd_narrow_scores.h"

#include <atomic>

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

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
  if (args.head_dim < 4 || args.kv_dtype != args.dtype || args.rotary_cos != nullptr) {
    return NarrowScores::kNone;
  }
  if (args.dtype == DType::kBF16 && call_takes_bf16_dot_scores(args)) {
    return NarrowScores::kBf16Pairs;
  }
  if (args.dtype == DType::kF16 && f16_fml_scores_available()) return NarrowScores::kF16;
#else
  (void)args;
#endif
  return NarrowScores::kNone;
}

#if defined(__aarch64__)
void neon_bf16::exact_pair_scores(const uint16_t* q_row, const uint32_t* k_pairs, int64_t pair_rows,
                       int64_t keys, float* s_row) {
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
#endif

}  // namespace anyattn::cpu
