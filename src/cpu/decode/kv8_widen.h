// 8-bit cache rows widened to bf16 for the direct decode loop (fwd_decode_kernel-inl.h): on CPUs
// whose bf16 scores run on the dot products (fwd_decode_bf16_dot.h), a task with many query rows
// per kv head widens each pass's K and V rows once, into its scratch, instead of converting every
// element again in each tile of 4 rows, and then runs the bf16 loops on them: the scores on
// VDPBF16PS (half the product instructions of the f32 FMAs, no conversion) and O += P V on the
// paired widening.
//
// Exactness. Every value of the three formats is a bf16 value: e4m3 and e5m2 hold 4 and 3
// significant bits and exponents within bf16's normal range (e4m3's subnormals m 2^-9 and e5m2's
// m 2^-16 are bf16 normals), int8 values are integers of magnitude at most 128. The widened rows
// hold the stored values exactly (times 2^-e4m3_exponent for e4m3, exact too), and the NaN code of
// e4m3 (and e5m2's NaNs and infinities) as bf16 NaN and infinities, so the products see them as
// the exact reads would. The scores then differ from the f32 FMA loop's only in the order of
// their rounded additions, which VDPBF16PS does in pairs; where the queries qualify
// (kv8_query_unfit_for_dot) no partial sum is ever subnormal, so its flushing of subnormal
// results never applies.
#ifndef ANYATTN_CPU_DECODE_KV8_WIDEN_H_
#define ANYATTN_CPU_DECODE_KV8_WIDEN_H_

#include <cstdint>

#include "common/fwd_args.h"
#include "cpu/decode/fwd_decode_rows.h"

namespace anyattn::cpu {

// True when the direct loop may widen 8-bit rows to bf16: bf16 scores run on the dot products
// (bf16_dot_scores_available) and this build has the widening kernel for this CPU (x86-64 with
// AVX512_VBMI, whose byte permutes look codes up in tables held in registers).
bool kv8_widening_available();

// Query rows per kv head from which the direct loop widens K rows of an 8-bit format and scores
// them on the dot products, and from which it widens V rows too. With one tile of rows (four or
// fewer) the f32 FMA loop converts each element once anyway: widening K then pays only for e4m3,
// whose read costs the most per element, from four rows (the products halve and the table lookup
// is cheaper than the read through f16), and widening V, whose rows are read once more from the
// scratch, from two tiles on. int8's two-instruction read and e5m2's read through f16 break even
// below three tiles for both (measured: bench/MEASUREMENTS.md, "8-bit rows widened to bf16 once
// per pass" and "e4m3 K rows widened at four query rows").
constexpr int64_t kv8_widen_key_min_rows(DType kv_dtype) {
  return kv_dtype == DType::kFp8E4M3 ? 4 : 12;
}
constexpr int64_t kv8_widen_value_min_rows(DType kv_dtype) {
  return kv_dtype == DType::kFp8E4M3 ? 8 : 12;
}

// Row stride, in bf16 elements, of widened rows of n elements: whole 64-element groups, each
// widened with one load (zeros past n).
constexpr int64_t kv8_widened_stride(int64_t n) { return (n + 63) / 64 * 64; }

// True when a bf16 query element keeps its kv head off the widened dot products: nonzero with
// |q| < 2^-64 (subnormals included), |q| >= 2^64, or not finite. Every other query element is a
// multiple of 2^-71 with 8 significant bits, and every 8-bit value a multiple of 2^-16, so each
// product, and each rounded sum of them, is 0 or at least 2^-110 (no partial sum is subnormal), and
// none exceeds 2^64 * 57344 * 576 < 2^91. On the magnitude bits m (sign cleared) the test is
// m != 0 and not 0x1F80 <= m < 0x5F80: branch-free, so that a loop over a row vectorises.
constexpr bool kv8_query_unfit_for_dot(uint16_t bits) {
  constexpr uint16_t kSmallest = (127 - 64) << 7;
  constexpr uint16_t kLargeFirst = (127 + 64) << 7;
  const uint16_t magnitude = bits & 0x7FFFu;
  const bool in_range = static_cast<uint16_t>(magnitude - kSmallest) < kLargeFirst - kSmallest;
  return (magnitude != 0) & !in_range;
}

namespace avx512_vbmi {

// out[j * ld_out + d] = the bf16 bits of element d of rows[j], for j < count and d < n, each value
// times 2^-e4m3_exponent for an e4m3 cache (0 or 8; 0 for the other formats); zero from n to
// kv8_widened_stride(n). kv_dtype: an 8-bit type; rows[j]: n bytes each, read no further;
// ld_out a multiple of 64 and at least kv8_widened_stride(n); out 64-byte aligned. With
// `prefetch` (a pass of kDirectChunkKeys keys, count <= kDirectChunkKeys), each 64-byte line
// loaded comes with that line's hints (PassPrefetcher::line, lines numbered key by key).
void widen_kv8_rows(DType kv_dtype, int e4m3_exponent, const void* const* rows, int64_t count,
                    int64_t n, const PassPrefetcher* prefetch, uint16_t* out, int64_t ld_out);

// The same values in the value pairs' layout of chunk_pv_pairs (fwd_decode_bf16_dot.h), for
// calls that allow bf16 probabilities: pair row t (n words at pairs + t * n) holds keys 2t and
// 2t + 1, the 16 words from 32g those keys' columns 32g, 32g + 2, ..., the next 16 columns
// 32g + 1, 32g + 3, ..., key 2t in each word's low half; a missing partner reads as zero. n a
// multiple of 32; pairs 64-byte aligned, (count + 1) / 2 rows. Hints as widen_kv8_rows's.
void widen_kv8_value_pairs(DType kv_dtype, int e4m3_exponent, const void* const* rows,
                           int64_t count, int64_t n, const PassPrefetcher* prefetch,
                           uint32_t* pairs);

}  // namespace avx512_vbmi
}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_DECODE_KV8_WIDEN_H_
