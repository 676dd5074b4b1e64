// The direct decode loop's bf16 score pass on VDPBF16PS (fwd_decode_bf16_dot.h).
//
// Design. One pass: kDirectChunkKeys (16) keys of one kv head against up to 12 query rows, in
// tiles of up to 4 rows. Per group of 4 keys, R x 4 accumulators; each 64-byte load of a K row
// holds 32 bf16 values, which one VDPBF16PS multiplies by 32 q values and adds in pairs into 16
// f32 lanes: no widening, and half the instructions of the f32 FMAs per K element (half the time
// where VDPBF16PS zmm issues at the FMA's rate). The row tail past the last 32 elements is loaded
// with a zeroing mask, so no byte past head_dim is read; q is zero there. The 16 accumulators of
// 16 keys are reduced by lane_sums into one vector of 16 scores per row, stored to S (in L1). K
// rows come from L1 or L2: the first row tile issues the pass's prefetches, for each 64 bytes of
// K it loads that line's two hints (PassPrefetcher::line), as the f32 path does.
#include "cpu/decode/fwd_decode_bf16_dot.h"

#include <algorithm>
#include <atomic>

#include "cpu/simd/avx512_intrinsics.h"
#include "cpu/simd/isa_target.h"
#include "plan/fwd_layout.h"
#include "runtime/cpu_features.h"

namespace anyattn::cpu {
namespace {

std::atomic<Bf16DotScores> g_choice{Bf16DotScores::kCpuDefault};

}  // namespace

bool bf16_dot_scores_available() {
  const runtime::CpuFeatures& features = runtime::cpu_features();
#if defined(__x86_64__) || defined(_M_X64)
  const bool has_kernel = features.has_avx512_path() && features.avx512bf16;
  const bool preferred = features.bf16_dot_outpaces_fma;
#elif defined(ANYATTN_NEON_BF16_DOT)
  const bool has_kernel = features.has_neon_path() && features.bf16;
  const bool preferred = true;
#else
  const bool has_kernel = false;
  const bool preferred = false;
#endif
  switch (g_choice.load(std::memory_order_relaxed)) {
    case Bf16DotScores::kWhereAvailable:
      return has_kernel;
    case Bf16DotScores::kOff:
      return false;
    case Bf16DotScores::kCpuDefault:
    default:
      return has_kernel && preferred;
  }
}

void set_bf16_dot_scores_for_tests(Bf16DotScores choice) {
  g_choice.store(choice, std::memory_order_relaxed);
}

}  // namespace anyattn::cpu

// The VDPBF16PS kernel, on x86-64 (BFDOT's is fwd_decode_bf16_dot_neon.cc).
#if defined(__x86_64__) || defined(_M_X64)
ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")
namespace anyattn::cpu::avx512_bf16 {

#include "cpu/simd/vec_avx512.h"

constexpr int kLanes = Vec::kLanes;
constexpr int kKeyGroup = 4;
constexpr int64_t kPairLanes = 32;  // bf16 values per VDPBF16PS operand
static_assert(kDirectChunkKeys == kLanes, "one lane_sums per row and pass");

// partial[r * lanes + first + g] = lane-wise pair sums of q_r . k_g for R rows and G keys.
template <int R, int G, bool kFarInMemoryOrder>
__attribute__((always_inline)) inline void key_group(const uint16_t* q, int64_t ldq,
                                                     const void* const* k_rows, int64_t head_dim,
                                                     Vec* partial, int64_t first,
                                                     const PassPrefetcher* prefetch) {
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  }
  const int64_t row_lines = (head_dim + kPairLanes - 1) / kPairLanes;
  int64_t c = 0;
  for (; c + kPairLanes <= head_dim; c += kPairLanes) {
    if (prefetch != nullptr) {
      for (int g = 0; g < G; ++g) {
        prefetch->line<kFarInMemoryOrder>(
            first + g, c * 2,
            PassPrefetcher::score_line_number(first, g, c / kPairLanes, G, row_lines));
      }
    }
    __m512bh key[G];
    for (int g = 0; g < G; ++g) {
      key[g] = (__m512bh)_mm512_loadu_si512(static_cast<const uint16_t*>(k_rows[g]) + c);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh q_pairs = (__m512bh)_mm512_loadu_si512(q + r * ldq + c);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], q_pairs, key[g]);
    }
  }
  if (c < head_dim) {
    if (prefetch != nullptr) {
      for (int g = 0; g < G; ++g) {
        prefetch->line<kFarInMemoryOrder>(
            first + g, c * 2,
            PassPrefetcher::score_line_number(first, g, c / kPairLanes, G, row_lines));
      }
    }
    const __mmask32 present = static_cast<__mmask32>((uint64_t{1} << (head_dim - c)) - 1);
    __m512bh key[G];
    for (int g = 0; g < G; ++g) {
      key[g] =
          (__m512bh)_mm512_maskz_loadu_epi16(present, static_cast<const uint16_t*>(k_rows[g]) + c);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh q_pairs = (__m512bh)_mm512_loadu_si512(q + r * ldq + c);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], q_pairs, key[g]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) partial[r * kLanes + first + g].v = acc[r][g];
  }
}

template <int R, bool kFarInMemoryOrder>
void tile_scores(const uint16_t* q, int64_t ldq, const void* const* k_rows, int64_t keys,
                 int64_t head_dim, const PassPrefetcher* prefetch, float* s) {
  Vec partial[R * kLanes];
  for (int64_t first = 0; first < kDirectChunkKeys; first += kKeyGroup) {
    const int64_t present = std::clamp<int64_t>(keys - first, 0, kKeyGroup);
    if (present == kKeyGroup) {
      key_group<R, kKeyGroup, kFarInMemoryOrder>(q, ldq, k_rows + first, head_dim, partial, first,
                                                 prefetch);
      continue;
    }
    for (int64_t g = 0; g < kKeyGroup; ++g) {
      if (g < present) {
        key_group<R, 1, kFarInMemoryOrder>(q, ldq, k_rows + first + g, head_dim, partial, first + g,
                                           prefetch);
      } else {
        for (int r = 0; r < R; ++r) partial[r * kLanes + first + g] = Vec::zero();
      }
    }
  }
  for (int r = 0; r < R; ++r) lane_sums(partial + r * kLanes).store(s + r * kKeyBlock);
}

#include "cpu/decode/fwd_decode_bf16_dot_tiles-inl.h"

}  // namespace anyattn::cpu::avx512_bf16
ANYATTN_TARGET_END()
#endif  // x86-64
