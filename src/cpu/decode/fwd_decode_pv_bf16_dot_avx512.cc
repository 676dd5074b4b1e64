// The direct decode loop's O += P V on VDPBF16PS, for bf16 caches of calls that allow bf16
// probabilities (ANYATTN_PRECISION_FAST; fwd_decode_bf16_dot.h, chunk_pv_pairs).
//
// Design. One pass is the 16 keys of a chunk and the query rows of one kv head. First the pass's
// V rows are interleaved in key pairs into `pairs` (8 pair rows of head_dim_v 32-bit words, in
// L1): word i of group g holds column 32g + 2i (the first 16 words) or 32g + 2i + 1 (the next
// 16) of keys 2t and 2t + 1, the column order in which the loop keeps O (fwd_decode_kernel-inl.h,
// split_pairs); two shifts and two word blends per 32 columns of two rows, with a test for
// subnormal values on the same loads. Each row's 16 probabilities are rounded once to bf16 (to
// nearest even); as 32-bit words they are the same key pairs. Then tiles of 4 rows by 2 column
// groups (64 columns) keep 16 accumulators of O in registers across the 8 pair rows: per pair row
// 4 loads and 4 broadcasts feed 16 VDPBF16PS, 512 multiply-adds, where the f32 loop spends 32
// FMAs and the widening of 4 V vectors per row tile on 256. O is loaded and stored once per tile
// and pass; the pairs (16 KiB at Dv 512) are read once per row tile, from L1.
//
// Exactness as for the packed forward's value pairs (forward/fwd_narrow_scores.h): bf16 products
// are exact, each pair's two are added with one rounding, and subnormal inputs and results are
// flushed. A pass whose V rows hold a subnormal is left to the caller's f32 products (the
// function returns false before writing O); from then on O may hold subnormals, so the caller
// keeps the task's kv head on the f32 products.
//
// Compiled for AVX512_BF16 in a target region of its own; called only where the CPU has it.
#include <algorithm>
#include <cstdint>

#include "cpu/decode/fwd_decode_bf16_dot.h"
#include "cpu/simd/avx512_intrinsics.h"
#include "cpu/simd/isa_target.h"
#include "common/head_dims.h"
#include "plan/fwd_layout.h"

#if defined(__x86_64__) || defined(_M_X64)
ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx512bf16")
namespace anyattn::cpu::avx512_bf16 {
namespace {

constexpr int64_t kGroupColumns = 32;  // bf16 values per 64-byte row line and VDPBF16PS operand
constexpr int64_t kPairRows = kDirectChunkKeys / 2;
constexpr int kTileRows = 4;
constexpr int kTileGroups = 2;

// Interleaves the pass's `keys` V rows (bf16, head_dim_v a multiple of 32) in key pairs into
// `pairs` (the layout above; a missing partner of the last key reads as zeros), issuing each
// row's prefetch hints next to its loads. False when a value is subnormal.
template <bool kFarInMemoryOrder>
bool interleave_value_pairs(const void* const* v_rows, int64_t keys, int64_t head_dim_v,
                            const PassPrefetcher* prefetch, uint32_t* pairs) {
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i subnormal_count = _mm512_set1_epi16(0x7F);
  const __mmask32 high_words = 0xAAAAAAAAu;
  const PassPrefetcher::LineRange lines =
      prefetch != nullptr ? prefetch->lines_in(0, head_dim_v * 2) : PassPrefetcher::LineRange{};
  __mmask32 subnormal = 0;
  for (int64_t t = 0; 2 * t < keys; ++t) {
    const bool partner = 2 * t + 1 < keys;
    if (prefetch != nullptr) {
      prefetch->tile_lines<kFarInMemoryOrder>(2 * t, lines);
      if (partner) prefetch->tile_lines<kFarInMemoryOrder>(2 * t + 1, lines);
    }
    const uint16_t* a = static_cast<const uint16_t*>(v_rows[2 * t]);
    const uint16_t* b = partner ? static_cast<const uint16_t*>(v_rows[2 * t + 1]) : nullptr;
    uint32_t* row = pairs + t * head_dim_v;
    for (int64_t c = 0; c < head_dim_v; c += kGroupColumns) {
      const __m512i first = _mm512_loadu_si512(a + c);
      const __m512i second = b != nullptr ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
      // A subnormal's magnitude bits m satisfy 1 <= m <= 0x7F.
      subnormal |= _mm512_cmplt_epu16_mask(
          _mm512_sub_epi16(_mm512_and_si512(first, magnitude), one), subnormal_count);
      subnormal |= _mm512_cmplt_epu16_mask(
          _mm512_sub_epi16(_mm512_and_si512(second, magnitude), one), subnormal_count);
      const __m512i even =
          _mm512_mask_blend_epi16(high_words, first, _mm512_slli_epi32(second, 16));
      const __m512i odd =
          _mm512_mask_blend_epi16(high_words, _mm512_srli_epi32(first, 16), second);
      _mm512_storeu_si512(row + c, even);
      _mm512_storeu_si512(row + c + kGroupColumns / 2, odd);
    }
  }
  return subnormal == 0;
}

// o[r][columns of `groups` groups from col] += the pass's P V for R rows, from the pair rows and
// each row's probability pairs (p_pairs[r * kPairRows + t]).
template <int R, int G>
void pairs_tile(const uint32_t* p_pairs, const uint32_t* pairs, int64_t pair_rows,
                int64_t head_dim_v, int64_t col, float* o, int64_t ldo) {
  constexpr int kVecs = 2 * G;
  __m512 acc[R][kVecs];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < kVecs; ++n) acc[r][n] = _mm512_loadu_ps(o + r * ldo + col + n * 16);
  }
  for (int64_t t = 0; t < pair_rows; ++t) {
    __m512bh values[kVecs];
    for (int n = 0; n < kVecs; ++n) {
      values[n] = (__m512bh)_mm512_loadu_si512(pairs + t * head_dim_v + col + n * 16);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh pair = (__m512bh)_mm512_set1_epi32(
          static_cast<int>(p_pairs[r * kPairRows + t]));
      for (int n = 0; n < kVecs; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], pair, values[n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < kVecs; ++n) _mm512_storeu_ps(o + r * ldo + col + n * 16, acc[r][n]);
  }
}

template <int R>
void pairs_rows(const uint32_t* p_pairs, const uint32_t* pairs, int64_t pair_rows,
                int64_t head_dim_v, float* o, int64_t ldo) {
  int64_t c = 0;
  for (; c + kTileGroups * kGroupColumns <= head_dim_v; c += kTileGroups * kGroupColumns) {
    pairs_tile<R, kTileGroups>(p_pairs, pairs, pair_rows, head_dim_v, c, o, ldo);
  }
  if (c < head_dim_v) pairs_tile<R, 1>(p_pairs, pairs, pair_rows, head_dim_v, c, o, ldo);
}

}  // namespace

bool chunk_pv_pairs(const float* p, int64_t rows, const void* const* v_rows, int64_t keys,
                    int64_t head_dim_v, const PassPrefetcher* prefetch, float* o, int64_t ldo) {
  alignas(64) uint32_t pairs[kPairRows * kMaxHeadDimV];
  const bool fit = prefetch != nullptr && prefetch->far_in_memory_order()
                       ? interleave_value_pairs<true>(v_rows, keys, head_dim_v, prefetch, pairs)
                       : interleave_value_pairs<false>(v_rows, keys, head_dim_v, prefetch, pairs);
  if (!fit) return false;
  pairs_pv(p, rows, pairs, keys, head_dim_v, o, ldo);
  return true;
}

void pairs_pv(const float* p, int64_t rows, const uint32_t* pairs, int64_t keys,
              int64_t head_dim_v, float* o, int64_t ldo) {
  alignas(64) uint32_t p_pairs[kMaxQBlockRows * kPairRows];
  const __mmask16 present = static_cast<__mmask16>((1u << keys) - 1u);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 row = _mm512_maskz_loadu_ps(present, p + r * kKeyBlock);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_pairs + r * kPairRows),
                        (__m256i)_mm512_cvtneps_pbh(row));
  }
  const int64_t pair_rows = (keys + 1) / 2;
  for (int64_t r = 0; r < rows; r += kTileRows) {
    const uint32_t* tile_p = p_pairs + r * kPairRows;
    float* tile_o = o + r * ldo;
    switch (std::min<int64_t>(kTileRows, rows - r)) {
      case 1: pairs_rows<1>(tile_p, pairs, pair_rows, head_dim_v, tile_o, ldo); break;
      case 2: pairs_rows<2>(tile_p, pairs, pair_rows, head_dim_v, tile_o, ldo); break;
      case 3: pairs_rows<3>(tile_p, pairs, pair_rows, head_dim_v, tile_o, ldo); break;
      default: pairs_rows<4>(tile_p, pairs, pair_rows, head_dim_v, tile_o, ldo); break;
    }
  }
}

}  // namespace anyattn::cpu::avx512_bf16
ANYATTN_TARGET_END()
#endif  // x86-64
