// The packed forward's S = Q K^T for bf16 and f16 calls on the Arm extensions that multiply 16-bit
// values into f32 sums: BFDOT (FEAT_BF16) for bf16, FMLAL/FMLAL2 (FEAT_FHM) for f16. The neon
// path packs such a call's K as 16-bit panels (forward/fwd_narrow_scores_neon-inl.h) and runs
// these kernels where the CPU has the instruction; each kernel is compiled in its own translation
// unit with that feature enabled (fwd_scores_bf16_dot_neon.cc, fwd_scores_f16_fml_neon.cc),
// since GCC 12 and clang 14 offer these intrinsics to no function target attribute.
//
// Packed formats (one 64-key block of one kv head, in the f32 panel's K region, which is larger):
//   pairs (bf16)  pair_rows = round_up(D, 8) / 2 rows of 64 32-bit words: word j of row w holds
//                 key j's elements 2w (low half) and 2w + 1 (high half); zero past D.
//   f16           round_up(D, 8) rows of 64 f16: element j of row d is key j's element d; zero
//                 past D.
// Keys past the block's last key are zero up to the next multiple of 8; the kernels score keys up
// to round_up(keys, 4) (pairs) or round_up(keys, 8) (f16) and no further.
//
// Exactness.
//   FMLAL multiplies two f16 values exactly into f32 and adds the product with one rounding, as
//   the f32 FMLA of the widened values does; the kernel adds the products of each score in the
//   f32 path's order (d ascending), so its scores are the f32 path's bits.
//   BFDOT is bounded like the decode scores (decode/fwd_decode_bf16_dot.h): exact bf16 products,
//   each pair's sum and its addition rounded to odd, subnormal inputs and results flushed. The
//   caller runs it only for calls that take dot scores (call_takes_bf16_dot_scores) and keeps
//   the BFDOT scores of a query row only when no element of the row is unfit for it
//   (bf16_query_unfit_for_dot); an unfit row's scores are recomputed in f32.
#ifndef ANYATTN_CPU_FORWARD_FWD_NARROW_SCORES_H_
#define ANYATTN_CPU_FORWARD_FWD_NARROW_SCORES_H_

#include <cstdint>

#include "cpu/shared/prefetch.h"

namespace anyattn::cpu {

// True when this CPU runs FMLAL (FEAT_FHM), this build compiled the f16 kernel and the tests have
// not turned it off.
bool f16_fml_scores_available();

// For tests: packs f16 calls as f32 and scores them with FMLA even where FMLAL exists (false), or
// with FMLAL where it exists (true, the default). Set it between calls.
void set_f16_fml_scores_enabled(bool enabled);

// The next key block's panel, whose lines a kernel prefetches into L2 while it scores this block:
// its packed K, then its V, two lines per step of the kernel until every line was prefetched
// (none when `k` is null).
struct NextPanelLines {
  const char* k;
  int64_t k_bytes;
  const char* v;
  int64_t v_bytes;
};

// Prefetches the next key block's panel into L2 (NextPanelLines), two lines per step.
class PanelLineFeed {
 public:
  explicit PanelLineFeed(NextPanelLines next)
      : next_(next), bytes_(next.k == nullptr ? 0 : next.k_bytes + next.v_bytes) {}
  __attribute__((always_inline)) void step() {
    for (int line = 0; line < 2 && offset_ < bytes_; ++line, offset_ += 64) {
      prefetch_line_l2(offset_ < next_.k_bytes ? next_.k + offset_
                                               : next_.v + (offset_ - next_.k_bytes));
    }
  }

 private:
  NextPanelLines next_;
  int64_t bytes_;
  int64_t offset_ = 0;
};

// s[r * 64 + j] = q_r . k_j (raw, unscaled) for `rows` <= 64 query rows and keys
// j < round_up(keys, 4) of one block in the pairs format. q: bf16 rows of ldq elements (ldq a
// multiple of 8, ldq >= 2 * pair_rows), zero from D on.
namespace neon_bf16 {
void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint32_t* k_pairs,
                  int64_t pair_rows, int64_t keys, NextPanelLines next, float* s);
}  // namespace neon_bf16

// The same for f16: keys j < round_up(keys, 8) of one block in the f16 format (d_rows =
// round_up(D, 8) rows); q: f16 rows of ldq >= d_rows elements, zero from D on.
namespace neon_f16 {
void block_scores(const uint16_t* q, int64_t ldq, int64_t rows, const uint16_t* kt,
                  int64_t d_rows, int64_t keys, NextPanelLines next, float* s);
}  // namespace neon_f16

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_FORWARD_FWD_NARROW_SCORES_H_
