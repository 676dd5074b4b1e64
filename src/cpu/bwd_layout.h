// Tiles and per-thread scratch of the backward kernels, shared by the driver and every ISA's
// bwd_kernel-inl.h.
//
// Both passes work on 64 x 64 tiles of the attention matrix (64 query rows x 64 keys). Head dims
// are zero-padded to whole 16-float vectors (d_pad, dv_pad), so every micro-kernel column count is
// a whole number of vectors on every ISA and padded columns contribute exact zeros.
#ifndef ANYATTN_CPU_BWD_LAYOUT_H_
#define ANYATTN_CPU_BWD_LAYOUT_H_

#include <cstdint>

#include "cpu/bwd_args.h"

namespace anyattn::cpu {

// Query rows and keys per tile.
constexpr int64_t kBwdBlock = 64;

struct BwdLayout {
  int64_t d_pad = 0;           // D rounded up to 16
  int64_t dv_pad = 0;          // Dv rounded up to 16
  int64_t num_key_blocks = 0;  // ceil(Sk / 64)
  int64_t num_q_blocks = 0;    // ceil(Sq / 64)

  static BwdLayout for_args(const BwdArgs& args) {
    BwdLayout layout;
    layout.d_pad = (args.fwd.head_dim + 15) / 16 * 16;
    layout.dv_pad = (args.fwd.head_dim_v + 15) / 16 * 16;
    layout.num_key_blocks = (args.fwd.seqlen_k + kBwdBlock - 1) / kBwdBlock;
    layout.num_q_blocks = (args.fwd.seqlen_q + kBwdBlock - 1) / kBwdBlock;
    return layout;
  }

  // Floats of one thread's scratch: enough for either pass (BwdScratch::carve).
  int64_t scratch_floats() const {
    return kBwdBlock * (4 * d_pad + 4 * dv_pad) + 3 * kBwdBlock * kBwdBlock + 2 * kBwdBlock;
  }
};

// One thread's buffers. Names follow the pass that uses them; all are 64-byte aligned when the
// base is (every size is a multiple of 16 floats).
//   key side:  k [64][d_pad], v [64][dv_pad], and for pass 1 the accumulators dk, dv (same shapes);
//              for pass 2 the transposed panels kt [d_pad][64], vt [dv_pad][64].
//   query side: q [64][d_pad], dout [64][dv_pad], and for pass 1 their transposes qt, doutt; for
//              pass 2 the dq accumulator [64][d_pad].
//   tiles:     s, dp, z [64][64] (scores then probabilities; dP then dS; dropout factors).
//   per row:   lse2 [64] (lse in log2 units), delta [64] (rowsum(dout * out)).
struct BwdScratch {
  float* k = nullptr;
  float* v = nullptr;
  float* key_acc_or_kt = nullptr;    // pass 1: dk [64][d_pad]; pass 2: kt [d_pad][64]
  float* value_acc_or_vt = nullptr;  // pass 1: dv [64][dv_pad]; pass 2: vt [dv_pad][64]
  float* q = nullptr;
  float* dout = nullptr;
  float* qt_or_dq = nullptr;  // pass 1: qt [d_pad][64]; pass 2: dq [64][d_pad]
  float* doutt = nullptr;     // pass 1 only: [dv_pad][64]
  float* s = nullptr;
  float* dp = nullptr;
  float* z = nullptr;
  float* lse2 = nullptr;
  float* delta = nullptr;

  static BwdScratch carve(float* base, const BwdLayout& layout) {
    const int64_t kd = kBwdBlock * layout.d_pad, kv = kBwdBlock * layout.dv_pad;
    BwdScratch s;
    s.k = base;
    s.v = s.k + kd;
    s.key_acc_or_kt = s.v + kv;
    s.value_acc_or_vt = s.key_acc_or_kt + kd;
    s.q = s.value_acc_or_vt + kv;
    s.dout = s.q + kd;
    s.qt_or_dq = s.dout + kv;
    s.doutt = s.qt_or_dq + kd;
    s.s = s.doutt + kv;
    s.dp = s.s + kBwdBlock * kBwdBlock;
    s.z = s.dp + kBwdBlock * kBwdBlock;
    s.lse2 = s.z + kBwdBlock * kBwdBlock;
    s.delta = s.lse2 + kBwdBlock;
    return s;
  }
};

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_BWD_LAYOUT_H_
