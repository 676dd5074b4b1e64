// Whether the f16 scores run on FMLAL (fwd_narrow_scores.h). The bf16 scores share the decode
// loop's switch, bf16_dot_scores_available (decode/fwd_decode_bf16_dot.cc).
#include "cpu/forward/fwd_narrow_scores.h"

#include <atomic>

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

}  // namespace anyattn::cpu
