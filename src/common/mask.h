// The attention mask and the score modifiers: which keys each query row sees, and what happens to a
// score before the softmax. The one statement of both, read by the forward, decode and backward
// kernels and by the cost models that order their tasks. Pure scalar C++ (no SIMD): the ISA
// translation units include it before their target regions, and the kernels turn its integers and
// floats into vector constants themselves.
//
// Visibility. Query row i (0 <= i < Sq) of a sequence with Sk keys sees key j iff
//   i + Sk - Sq - window_left  <=  j  <=  i + Sk - Sq + window_right   and   0 <= j < Sk.
// i + Sk - Sq is row i's diagonal: queries are aligned with the end of the keys, so causal
// attention is window_right = 0 and no window is kUnboundedWindow on both sides.
//
// Score modifiers, applied in this order to x = softmax_scale * <q_i, k_j>:
//   softcap   s = softcap * tanh(x / softcap)               (off when softcap is 0)
//   ALiBi     s = s - slope(b, h) * |j - (i + Sk - Sq)|      (off without slopes)
//   sink      a logit sink(h) that joins each row's softmax denominator and adds no value row.
#ifndef ANYATTN_COMMON_MASK_H_
#define ANYATTN_COMMON_MASK_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "common/fwd_args.h"

namespace anyattn {

// Keys (or key blocks) [begin, end); empty when begin >= end.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return begin >= end; }
};

// The call's score modifiers: the same for every sequence of a call.
struct ScoreModifiers {
  float scale = 0.f;           // softmax_scale
  bool softcap = false;        // softcap > 0
  float cap = 0.f;             // softcap (0 when off)
  // The softcap's tanh argument, formed the same way by the forward and the backward:
  // (q.k * tanh_scale_first) * tanh_scale_second, which is softmax_scale / softcap as one factor
  // (then 1) where that quotient is a normal finite f32, else softmax_scale and then 1 / softcap,
  // so that a tiny scale over a huge softcap (1e-30 / 1e30) is not flushed to 0.
  float tanh_scale_first = 0.f;
  float tanh_scale_second = 1.f;
  bool alibi = false;
  bool sinks = false;

  static ScoreModifiers of(const cpu::FwdArgs& args) {
    ScoreModifiers m;
    m.scale = args.softmax_scale;
    m.softcap = args.softcap > 0.f;
    m.cap = args.softcap;
    if (m.softcap) {
      const float scale_over_cap = args.softmax_scale / args.softcap;
      const bool one_factor =
          std::isfinite(scale_over_cap) && std::fabs(scale_over_cap) >= FLT_MIN;
      m.tanh_scale_first = one_factor ? scale_over_cap : args.softmax_scale;
      m.tanh_scale_second = one_factor ? 1.f : 1.f / args.softcap;
    }
    m.alibi = args.alibi_slopes != nullptr;
    m.sinks = args.sinks != nullptr;
    m.slopes_ = args.alibi_slopes;
    m.slope_batch_stride_ = args.alibi_batch_stride;
    m.slope_head_stride_ = args.alibi_head_stride;
    m.sink_values_ = args.sinks;
    m.sink_stride_ = args.sinks_stride;
    return m;
  }

  // Minus the ALiBi slope of query head h of sequence b; 0 without ALiBi.
  float neg_alibi_slope(int64_t b, int64_t h) const {
    return alibi ? -slopes_[b * slope_batch_stride_ + h * slope_head_stride_] : 0.f;
  }
  // The sink logit of query head h (natural-log units); 0 without sinks.
  float sink(int64_t h) const { return sinks ? sink_values_[h * sink_stride_] : 0.f; }

 private:
  const float* slopes_ = nullptr;
  int64_t slope_batch_stride_ = 0, slope_head_stride_ = 0;
  const float* sink_values_ = nullptr;
  int64_t sink_stride_ = 0;
};

// The mask of one sequence, and the call's modifiers as that sequence's rows see them. Ranges are
// clipped to the keys that exist, [0, Sk).
class Mask {
 public:
  Mask(const cpu::FwdArgs& args, const cpu::SeqInfo& seq)
      : modifiers_(ScoreModifiers::of(args)),
        batch_(seq.batch),
        diagonal_offset_(seq.seqlen_k - seq.seqlen_q),
        window_left_(args.window_left),
        window_right_(args.window_right),
        seqlen_k_(seq.seqlen_k) {}

  // Row i's diagonal key, i + Sk - Sq: the origin of its window and of its ALiBi distances.
  int64_t diagonal(int64_t i) const { return i + diagonal_offset_; }

  // The keys that at least one of rows [q_begin, q_end) sees (q_begin < q_end); empty when the
  // window hides every key from every one of them.
  KeyRange visible_keys(int64_t q_begin, int64_t q_end) const {
    return {std::max<int64_t>(diagonal(q_begin) - window_left_, 0),
            std::min(diagonal(q_end - 1) + window_right_ + 1, seqlen_k_)};
  }

  // The blocks of `block_keys` keys (block b: keys [b * block_keys, (b + 1) * block_keys)) that
  // hold a key some row of [q_begin, q_end) sees; {0, 0} when there is none.
  KeyRange visible_blocks(int64_t q_begin, int64_t q_end, int64_t block_keys) const {
    const KeyRange keys = visible_keys(q_begin, q_end);
    if (keys.empty()) return {};
    return {keys.begin / block_keys, (keys.end - 1) / block_keys + 1};
  }

  // The keys row i sees in the block of `block_keys` keys that starts at key j0, relative to j0
  // and clipped to [0, block_keys); begin == end when it sees none of them.
  KeyRange row_keys_in_block(int64_t i, int64_t j0, int64_t block_keys) const {
    const int64_t diagonal_in_block = diagonal(i) - j0;
    const int64_t begin = std::max<int64_t>(diagonal_in_block - window_left_, 0);
    int64_t end = std::min(diagonal_in_block + window_right_ + 1, seqlen_k_ - j0);
    end = std::min(end, block_keys);
    return {begin, std::max(begin, end)};
  }

  // True when the block of `block_keys` keys from j0 holds a key that some row of
  // [q_begin, q_end) does not see, or reaches past the last key: the block then needs its scores
  // masked key by key. False means every row sees every key of the block.
  bool crosses_boundary(int64_t q_begin, int64_t q_end, int64_t j0, int64_t block_keys) const {
    return j0 < diagonal(q_end - 1) - window_left_ ||
           j0 + block_keys - 1 > diagonal(q_begin) + window_right_ || j0 + block_keys > seqlen_k_;
  }

  const ScoreModifiers& modifiers() const { return modifiers_; }
  // Minus the ALiBi slope of query head h for this sequence; 0 without ALiBi.
  float neg_alibi_slope(int64_t h) const { return modifiers_.neg_alibi_slope(batch_, h); }

 private:
  ScoreModifiers modifiers_;
  int64_t batch_;
  int64_t diagonal_offset_;  // Sk - Sq
  int64_t window_left_;
  int64_t window_right_;
  int64_t seqlen_k_;
};

}  // namespace anyattn

#endif  // ANYATTN_COMMON_MASK_H_
