// The packed forward's S = Q K^T for bf16 and f16 calls on the instructions that multiply 16-bit
// values into f32 sums: for bf16, BFDOT (FEAT_BF16) on the neon path and VDPBF16PS
// (AVX512_BF16) on the avx512 path, where it outpaces the FMAs (call_takes_bf16_dot_scores); for
// f16, FMLAL/FMLAL2 (FEAT_FHM) on the neon path. Such a call's K is packed as 16-bit panels
// (forward/fwd_narrow_scores-inl.h) and scored by these kernels; the backward runs S and dP on
// them too (backward/bwd_narrow_scores-inl.h). The Arm kernels are compiled in
// translation units of their own with the feature enabled (fwd_scores_bf16_dot_neon.cc,
// fwd_scores_f16_fml_neon.cc), since GCC 12 and clang 14 offer these intrinsics to no function
// target attribute; the x86-64 one in a target region (fwd_scores_bf16_dot_avx512.cc).
//
// Packed formats (one 64-key block of one kv head, in the f32 panel's K region, which is larger):
//   pairs (bf16)  pair_rows = round_up(D, 8) / 2 rows of 64 32-bit words: word j of row w holds
//                 key j's elements 2w (low half) and 2w + 1 (high half); zero past D. For an
//                 8-bit cache (bf16 q) the elements are the stored values as bf16 (each 8-bit
//                 value is one exactly, kv8_bf16_codes), and the 64 keys' factors (descale
//                 times token scale) follow at narrow_key_factors_offset: the scores are
//                 q . (stored values) times the key's factor, as the direct decode loop forms
//                 them.
//   f16           round_up(D, 8) rows of 64 f16: element j of row d is key j's element d; zero
//                 past D.
// Keys past the block's last key are zero up to the next multiple of the path's vector (4 keys on
// neon, 16 on avx512; 8 for f16); the kernels score keys up to that multiple and no further.
//
// V of a bf16 call that allows bf16 probabilities (FwdArgs::bf16_probabilities, on paths with
// block_pv) is packed in the value-pairs format, in the f32 panel's V region (half of it): pair
// row t (of 32) holds dv_pad 32-bit words, word c column c of keys 2t (low half) and 2t + 1 (high
// half), zero past Dv and for a key past the block's last. For an 8-bit cache the words hold the
// stored values as bf16 (exact) and the 64 keys' V factors follow (value_pair_factors): the
// kernels multiply each probability by its key's factor before rounding it; a block with a factor
// outside [2^-60, 2^60] (but 0) keeps the f32 panel. NaN and infinite values are packed as
// 0 (kBlockVNonfinite) and their products added in f32 from the source, for the rows that see
// them only: a masked key's P = 0 times infinity would be NaN in the others, which this way keep
// the bits they have without the value. A block whose V holds a subnormal keeps the f32 V panel
// and the f32 P V (kBlockValuePairs unset, kBlockSubnormal set): the dot products would flush it.
// From a block with a subnormal on (kBlockSubnormal), O may hold subnormals, which VDPBF16PS would
// flush too: the task's later blocks take f32 products over the value pairs (exact_pair_pv).
//
// Exactness.
//   FMLAL multiplies two f16 values exactly into f32 and adds the product with one rounding, as
//   the f32 FMLA of the widened values does; the kernel adds the products of each score in the
//   f32 path's order (d ascending), so its scores are the f32 path's bits.
//   BFDOT and VDPBF16PS are bounded like the decode scores (decode/fwd_decode_bf16_dot.h): exact
//   bf16 products, added with one rounding each (to odd on BFDOT), subnormal inputs and results
//   flushed. The caller runs them only for calls that take dot scores
//   (call_takes_bf16_dot_scores) and keeps the dot-product scores of a query row only when no
//   element of the row is unfit for them (bf16_query_unfit_for_dot; for 8-bit caches
//   kv8_query_unfit_for_dot, under which no partial sum is subnormal and none overflows, whatever
//   the key factors); an unfit row's scores are recomputed in f32 as the vector path forms them.
#ifndef ANYATTN_CPU_FORWARD_FWD_NARROW_SCORES_H_
#define ANYATTN_CPU_FORWARD_FWD_NARROW_SCORES_H_

#include <cstdint>

#include "common/fwd_args.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu {

// How a call's S = Q K^T (and on the neon path's backward also dP = dout V^T) is formed on a path
// that has the narrow kernels (ANYATTN_FWD_NARROW_SCORES; on the others every call packs f32).
enum class NarrowScores : uint8_t {
  kNone,       // f32 FMAs, K (and V) packed as f32
  kBf16Pairs,  // BFDOT or VDPBF16PS over the pairs format
  kF16,        // FMLAL over the f16 format
};

// The format of a call, a function of the call, the CPU and the tests' switches only, so that
// the packers and the kernels agree: bf16 q with a bf16 or 8-bit K and V cache on a CPU and call
// that take the bf16 dot products (call_takes_bf16_dot_scores), or f16 q, K and V where FMLAL is
// available, without rotary, with D >= 4 (the 16-bit panels fit in the f32 panels' space:
// round_up(D, 8) * 32 floats <= D * 64), and for 8-bit caches D >= 5 (room for the key factors
// too); kNone everywhere else, and on AArch64 builds without the Arm kernels.
NarrowScores narrow_scores_of(const FwdArgs& args);

// Elements per packed row of a head dim of n in the 16-bit formats, zero past n: the kernels step
// 8 at a time.
constexpr int64_t narrow_depth(int64_t n) {
  return (n + 7) / 8 * 8;
}

// Where, in floats from the panel's start, the key factors of a pairs panel of an 8-bit cache
// begin (kKeyBlock floats, right after the pairs of a head dim of n).
constexpr int64_t narrow_key_factors_offset(int64_t n) {
  return narrow_depth(n) * 32;
}

// The bf16 bits of the value of each of the 256 codes of an 8-bit cache dtype (exact; NaN codes
// give NaN, e5m2's infinities infinity).
const uint16_t* kv8_bf16_codes(DType kv_dtype);

// True when this CPU runs FMLAL (FEAT_FHM), this build compiled the f16 kernel and the tests have
// not turned it off.
bool f16_fml_scores_available();

// For tests: packs f16 calls as f32 and scores them with FMLA even where FMLAL exists (false), or
// with FMLAL where it exists (true, the default). Set it between calls.
void set_f16_fml_scores_enabled(bool enabled);

// The next key block's panel, whose used lines (its packed K, then its V) the kernels prefetch
// into L2 while they score this block; `k` is null when there is no next block.
struct NextPanelLines {
  const char* k;
  int64_t k_bytes;
  const char* v;
  int64_t v_bytes;
};

// The lines one score tile prefetches, two per step of its loop: `line` and line + `step`, then
// line += 2 * step; step is 64, or 0 to prefetch one cached line over and over.
struct PanelPrefetchWindow {
  const char* line;
  int64_t step;
};

// Hands out windows of the next panel's lines, one per score tile, in order: K's lines, then V's.
// A window never crosses from one to the other (the last window of each is moved back to end at
// its end, re-prefetching a few lines); a range shorter than a window is skipped, and once all are
// handed out, windows repeat one line of the current panel. So the loads stay inside the panels
// and the tiles' loops have no branch for them.
class NextPanelWindows {
 public:
  NextPanelWindows(NextPanelLines next, const void* current)
      : ranges_{{next.k, next.k == nullptr ? 0 : next.k_bytes},
                {next.v, next.k == nullptr ? 0 : next.v_bytes}},
        idle_{static_cast<const char*>(current), 0} {}

  // The window of a tile whose loop runs `steps` times.
  PanelPrefetchWindow window(int64_t steps) {
    const int64_t bytes = steps * 2 * 64;
    for (; range_ < 2; ++range_, offset_ = 0) {
      const Range& range = ranges_[range_];
      if (offset_ >= range.bytes || bytes > range.bytes) continue;
      const int64_t start = offset_ < range.bytes - bytes ? offset_ : range.bytes - bytes;
      offset_ += bytes;
      return {range.begin + start, 64};
    }
    return idle_;
  }

 private:
  struct Range {
    const char* begin;
    int64_t bytes;
  };
  Range ranges_[2];
  PanelPrefetchWindow idle_;
  int range_ = 0;
  int64_t offset_ = 0;
};

// Words of one block row's probabilities rounded to bf16 in key pairs (block_pv's tiles).
constexpr int64_t kProbabilityPairWords = kKeyBlock / 2;

// An 8-bit cache's V factors (descale times token scale) of a value-pairs panel's 64 keys: after
// its 32 pair rows, in the half of the f32 V region they leave free.
inline float* value_pair_factors(uint32_t* pairs, int64_t dv_pad) {
  return reinterpret_cast<float*>(pairs + kKeyBlock / 2 * dv_pad);
}
inline const float* value_pair_factors(const uint32_t* pairs, int64_t dv_pad) {
  return reinterpret_cast<const float*>(pairs + kKeyBlock / 2 * dv_pad);
}

// s[r * 64 + j] = q_r . k_j (raw, unscaled) for `rows` <= 64 query rows and keys
// j < round_up(keys, 4) of one block in the pairs format, depth = round_up(D, 8). q: bf16 rows of
// ldq >= depth elements, zero from D on. Prefetches the lines of `next` on the way.
//
// exact_pair_scores: s_row[j] = q . k_j for the same keys with f32 FMAs over a pairs-format
// panel, head-dim elements in ascending order: the f32 path's bits, for a bf16 row unfit for
// BFDOT. q_row: bf16, zero from D to 2 * pair_rows.
//
// block_pv (fwd_pv_bf16_dot_neon.cc): o[r][0, columns) += sum_j bf16(p[r][j] f_j) v[j][0, columns)
// for `rows` <= 64 rows (p: rows of kKeyBlock floats; o: rows dv_pad floats apart; columns a
// multiple of the path's vector, at most dv_pad), each probability (times its key's V factor f_j
// for an 8-bit cache: `factors`, value_pair_factors; null for bf16, f_j = 1) rounded to bf16 to
// nearest even, over the keys of one block of `keys` keys with V in the value-pairs format.
// row_keys (or null): per row the key from which its probabilities are zero; each tile of rows
// stops at the largest of its rows. p must be 0 from `keys` to the next even key, and the pairs
// panel's words of that key 0.
//
// exact_pair_pv: o[r] += sum_j p[r][j] (v_j f_j) with f32 FMAs, p unrounded and each value times
// its factor rounded once, keys in ascending order (the vector path's bits), for every row over
// all `keys`: for blocks after one whose V held a subnormal, when O may hold subnormals, which the
// dot products would flush.
//
// AArch64 builds only.
namespace neon_bf16 {
void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint32_t* k_pairs,
                  int64_t depth, int64_t keys, NextPanelLines next, float* s);
void exact_pair_scores(const uint16_t* q_row, const uint32_t* k_pairs, int64_t pair_rows,
                       int64_t keys, float* s_row);
void block_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
              int64_t keys, const int64_t* row_keys, float* o, int64_t dv_pad, int64_t columns);
void exact_pair_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
                   int64_t keys, float* o, int64_t dv_pad, int64_t columns);
}  // namespace neon_bf16

// The same four on VDPBF16PS and AVX-512 FMAs (fwd_scores_bf16_dot_avx512.cc,
// fwd_pv_bf16_dot_avx512.cc), for keys j < round_up(keys, 16) and columns a multiple of 16.
// x86-64 builds only.
namespace avx512_bf16 {
void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint32_t* k_pairs,
                  int64_t depth, int64_t keys, NextPanelLines next, float* s);
void exact_pair_scores(const uint16_t* q_row, const uint32_t* k_pairs, int64_t pair_rows,
                       int64_t keys, float* s_row);
void block_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
              int64_t keys, const int64_t* row_keys, float* o, int64_t dv_pad, int64_t columns);
void exact_pair_pv(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
                   int64_t keys, float* o, int64_t dv_pad, int64_t columns);
}  // namespace avx512_bf16

// The same for f16: keys j < round_up(keys, 8) of one block in the f16 format; q: f16 rows.
namespace neon_f16 {
void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint16_t* kt,
                  int64_t depth, int64_t keys, NextPanelLines next, float* s);
}  // namespace neon_f16

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_FORWARD_FWD_NARROW_SCORES_H_
