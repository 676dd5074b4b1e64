// Tiles, tasks and per-thread scratch of the backward kernels, shared by the driver and every
// ISA's bwd_kernel-inl.h.
//
// The backward works on 64 x 64 tiles of one sequence's attention matrix (64 query rows x 64
// keys). Head dims are zero-padded to whole 16-float vectors (d_pad, dv_pad), so every
// micro-kernel column count is a whole number of vectors on every ISA and padded columns
// contribute exact zeros.
//
// A task is (sequence, kv head, head split, key chunk): a head split is a range of the GQA group's
// query heads, a chunk a run of consecutive 64-key blocks. The number of head splits per group and
// of chunks per sequence depend only on the shape (BwdLayout::head_splits, num_chunks), never on
// the thread count. With one head split a task writes dk and dv directly, with several each split
// writes f32 dK/dV partials; with one chunk a task writes dq directly, with several each chunk
// writes an f32 dq partial. Final passes sum the partials in split and chunk order.
#ifndef ANYATTN_PLAN_BWD_LAYOUT_H_
#define ANYATTN_PLAN_BWD_LAYOUT_H_

#include <algorithm>
#include <cstdint>

#include "common/bwd_args.h"
#include "common/mask.h"

namespace anyattn::cpu {

// Query rows and keys per tile.
constexpr int64_t kBwdBlock = 64;

// One sequence of a backward call: the forward's SeqInfo plus where its rows live in dout and dq
// and in the call's row-indexed workspace (delta, dq partials).
struct BwdSeq {
  SeqInfo seq;
  int64_t dout_offset = 0;  // element offset of dout position 0, head 0
  int64_t dq_offset = 0;    // element offset of dq position 0, head 0
  // Workspace row of (head h, position i) is row_first + h * seq.seqlen_q + i.
  int64_t row_first = 0;
  // dK/dV partial row of (kv head hk, key j) is key_row_first + hk * seq.seqlen_k + j.
  int64_t key_row_first = 0;
};

inline BwdSeq bwd_sequence(const BwdArgs& args, int64_t b, int64_t row_first,
                           int64_t key_row_first) {
  BwdSeq s;
  s.seq = sequence_info(args.fwd, b);
  const int64_t q_start = args.fwd.cu_seqlens_q != nullptr ? args.fwd.cu_seqlens_q[b] : 0;
  s.dout_offset = b * args.dout_batch_stride + q_start * args.dout_row_stride;
  s.dq_offset = b * args.dq_batch_stride + q_start * args.dq_row_stride;
  s.row_first = row_first;
  s.key_row_first = key_row_first;
  return s;
}

// One task of the fused pass: keys [key_begin, key_end) of one sequence and kv head, for query
// heads [group_begin, group_end) of the GQA group (0 .. group size). key_begin is a multiple of 64.
struct BwdTask {
  BwdSeq seq;
  int64_t head_k = 0;
  int64_t group_begin = 0;
  int64_t group_end = 1;
  int64_t key_begin = 0;
  int64_t key_end = 0;
  // f32 dq partial rows of this chunk (indexed by workspace row, d_pad floats each), or null when
  // the sequence has one chunk and the task writes dq itself.
  float* dq_partial = nullptr;
  // f32 dK and dV partial rows of this head split (indexed by dK/dV partial row, d_pad floats of
  // dK then dv_pad of dV, both unscaled), or null when the group has one head split and the task
  // writes dk and dv itself.
  float* dkv_partial = nullptr;
};

// The key blocks of the task's chunk (0 = its first) that hold a key at least one of query rows
// [i0, i0 + rows) sees; empty when there is none. The kernel visits these, and the driver's cost
// model counts them.
inline KeyRange chunk_blocks_seen(const Mask& mask, const BwdTask& task, int64_t i0,
                                  int64_t rows) {
  const KeyRange visible = mask.visible_keys(i0, i0 + rows);
  const int64_t first = std::max(task.key_begin, visible.begin);
  const int64_t last = std::min(task.key_end, visible.end) - 1;
  if (first > last) return {};
  return {(first - task.key_begin) / kBwdBlock, (last - task.key_begin) / kBwdBlock + 1};
}

// The operand copies a path's kernels pack for a call besides the f32 ones (BwdScratch): each
// makes the scratch larger, so the path states them once (bwd_copies) and the plan sizes it.
struct BwdCopies {
  // The products on AMX tiles (bf16 calls on the avx512_amx path): bf16 copies of K, V, Q and
  // dout in the tiles' formats.
  bool bf16_tiles = false;
  // S and dP on the path's 16-bit kernels (forward/fwd_narrow_scores.h): the Q and dout rows as
  // 16-bit values (q16, dout16).
  bool rows16 = false;
  // dV, dK and dQ on the path's bf16 dot products from P Z and dX rounded to bf16 (bf16 calls
  // that allow bf16 probabilities; backward/bwd_narrow_scores-inl.h): K, Q and dout in row pairs,
  // a transposed tile and the key blocks' flags.
  bool bf16_pairs = false;
};

struct BwdLayout {
  int64_t d_pad = 0;        // D rounded up to 16
  int64_t dv_pad = 0;       // Dv rounded up to 16
  int64_t head_splits = 1;  // query-head ranges per GQA group, at most the group size
  int64_t num_chunks = 1;   // key chunks per sequence (fewer when a sequence has fewer blocks)
  int64_t chunk_keys = 0;   // keys of the largest chunk, a multiple of 64
  // The call's BwdCopies.
  bool bf16_tiles = false;
  bool rows16 = false;
  bool bf16_pairs = false;

  // 32-bit words (bf16 pairs) per row of D or Dv rounded up to the tiles' 32-element chunks.
  int64_t d_words() const { return (d_pad + 31) / 32 * 16; }
  int64_t dv_words() const { return (dv_pad + 31) / 32 * 16; }
  // Floats per row of BwdScratch::staging: a key row of D or Dv in words, at least 128.
  int64_t staging_row_floats() const {
    return std::max<int64_t>({d_words(), dv_words(), 128});
  }
  int64_t tile_floats() const {
    return chunk_keys * (d_words() + dv_words()) + chunk_keys / 2 * d_pad +
           kBwdBlock * (d_words() + dv_words()) + kBwdBlock / 2 * (d_pad + dv_pad) +
           kBwdBlock * staging_row_floats() + (chunk_keys / kBwdBlock + 15) / 16 * 16;
  }

  // Key blocks [first, end) of chunk c of a sequence with `blocks` key blocks: an even split.
  static int64_t chunk_first_block(int64_t blocks, int64_t chunks, int64_t c) {
    return blocks * c / chunks;
  }
  int64_t chunks_for(int64_t blocks) const { return std::min(num_chunks, blocks); }
  // Query heads [first, next first) of head split `split` of a group of `group_size`: even ranges.
  int64_t split_first_head(int64_t group_size, int64_t split) const {
    return group_size * split / head_splits;
  }
  // Floats of one dK/dV partial row.
  int64_t dkv_row_floats() const { return d_pad + dv_pad; }

  // Floats of the rows16 copies (q16, dout16) and of the bf16_pairs ones (BwdScratch).
  int64_t rows16_floats() const { return kBwdBlock / 2 * (d_pad + dv_pad); }
  int64_t pairs_floats() const {
    return chunk_keys / 2 * d_pad + kBwdBlock / 2 * (d_pad + dv_pad) + kBwdBlock * kBwdBlock +
           (chunk_keys / kBwdBlock + 63) / 64 * 16;
  }

  // Floats of one thread's scratch (BwdScratch::carve).
  int64_t scratch_floats() const {
    return chunk_keys * (3 * d_pad + 2 * dv_pad) + kBwdBlock * (2 * d_pad + 2 * dv_pad) +
           3 * kBwdBlock * kBwdBlock + 2 * kBwdBlock + (bf16_tiles ? tile_floats() : 0) +
           (rows16 ? rows16_floats() : 0) + (bf16_pairs ? pairs_floats() : 0);
  }
};

// One thread's buffers, all 64-byte aligned when the base is (every size is a multiple of 16
// floats). Key side, for the task's chunk, packed once per task:
//   kt  [chunk blocks][d_pad][64]   K transposed in 64-key panels (B operand of S = Q K^T)
//   k   [chunk_keys][d_pad]         K rows (B operand of dQ += dS K)
//   vt  [chunk blocks][dv_pad][64]  V transposed in 64-key panels (B operand of dP = dO V^T)
//   dk  [chunk_keys][d_pad], dv [chunk_keys][dv_pad]   f32 accumulators
// Query side, per 64-row query block:
//   q [64][d_pad], dout [64][dv_pad], dq [64][d_pad], rows [64][dv_pad] (V rows while packing)
// Tiles: s, dp, z [64][64] (scores then P Z; dP then dS; dropout factors); per row neg_lse (minus
// the LSE) and delta.
// With bf16_tiles, in 32-bit words of two bf16 (w = d_words(), wv = dv_words()):
//   k_words [chunk blocks][w][64], v_words [chunk blocks][wv][64]   K and V as the right operand
//            of S and dP (row w: dims 2w and 2w + 1 of each of 64 keys)
//   k_pairs [chunk blocks][32][d_pad]   K as the right operand of dQ (word (t, n): dim n of keys
//            2t and 2t + 1)
//   q_words [64][w], dout_words [64][wv]   Q and dout rows as the left operand of S and dP
//   q_pairs [32][d_pad], dout_pairs [32][dv_pad]   Q and dout as the right operands of dK and dV
//            (word (t, n): dim n of rows 2t and 2t + 1)
//   staging [64][max(w, wv, 128)]   key rows in words before they are transposed (while
//            packing), then the split, transposed P Z or dX of a tile ([64][64]); 128 words
//            (D = 256) at least, the layout of every D <= 256
//   key_flags [chunk blocks] bytes   kKeySubnormal / kValueSubnormal per key block
// With rows16, in 16-bit values: q16 [64][d_pad], dout16 [64][dv_pad], Q and dout rows as the
// left operands of the 16-bit S and dP kernels (and kt, vt then hold 16-bit panels).
// With bf16_pairs (and rows16), in 32-bit words of two bf16:
//   k_pairs, q_pairs, dout_pairs   as with bf16_tiles: the right operands of dQ, dK and dV
//   staging [64][64]   P Z or dX of a tile transposed (f32): the left operand of dV or dK
//   key_flags [chunk blocks] bytes   whether the block's K holds a subnormal
struct BwdScratch {
  float* kt = nullptr;
  float* k = nullptr;
  float* vt = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* q = nullptr;
  float* dout = nullptr;
  float* dq = nullptr;
  float* rows = nullptr;
  float* s = nullptr;
  float* dp = nullptr;
  float* z = nullptr;
  float* neg_lse = nullptr;
  float* delta = nullptr;
  uint32_t* k_words = nullptr;
  uint32_t* v_words = nullptr;
  uint32_t* q_words = nullptr;
  uint32_t* dout_words = nullptr;
  uint32_t* k_pairs = nullptr;
  uint32_t* q_pairs = nullptr;
  uint32_t* dout_pairs = nullptr;
  float* staging = nullptr;
  uint8_t* key_flags = nullptr;
  uint16_t* q16 = nullptr;
  uint16_t* dout16 = nullptr;

  static BwdScratch carve(float* base, const BwdLayout& layout) {
    const int64_t ck = layout.chunk_keys;
    BwdScratch s;
    s.kt = base;
    s.k = s.kt + ck * layout.d_pad;
    s.vt = s.k + ck * layout.d_pad;
    s.dk = s.vt + ck * layout.dv_pad;
    s.dv = s.dk + ck * layout.d_pad;
    s.q = s.dv + ck * layout.dv_pad;
    s.dout = s.q + kBwdBlock * layout.d_pad;
    s.dq = s.dout + kBwdBlock * layout.dv_pad;
    s.rows = s.dq + kBwdBlock * layout.d_pad;
    s.s = s.rows + kBwdBlock * layout.dv_pad;
    s.dp = s.s + kBwdBlock * kBwdBlock;
    s.z = s.dp + kBwdBlock * kBwdBlock;
    s.neg_lse = s.z + kBwdBlock * kBwdBlock;
    s.delta = s.neg_lse + kBwdBlock;
    float* next = s.delta + kBwdBlock;
    if (layout.bf16_tiles) {
      s.k_words = reinterpret_cast<uint32_t*>(next);
      next += ck * layout.d_words();
      s.v_words = reinterpret_cast<uint32_t*>(next);
      next += ck * layout.dv_words();
      s.q_words = reinterpret_cast<uint32_t*>(next);
      next += kBwdBlock * layout.d_words();
      s.dout_words = reinterpret_cast<uint32_t*>(next);
      next += kBwdBlock * layout.dv_words();
      s.k_pairs = reinterpret_cast<uint32_t*>(next);
      next += ck / 2 * layout.d_pad;
      s.q_pairs = reinterpret_cast<uint32_t*>(next);
      next += kBwdBlock / 2 * layout.d_pad;
      s.dout_pairs = reinterpret_cast<uint32_t*>(next);
      next += kBwdBlock / 2 * layout.dv_pad;
      s.staging = next;
      next += kBwdBlock * layout.staging_row_floats();
      s.key_flags = reinterpret_cast<uint8_t*>(next);
    }
    if (layout.bf16_tiles) next = s.delta + kBwdBlock + layout.tile_floats();
    if (layout.rows16) {
      s.q16 = reinterpret_cast<uint16_t*>(next);
      s.dout16 = s.q16 + kBwdBlock * layout.d_pad;
      next += layout.rows16_floats();
    }
    if (layout.bf16_pairs) {
      s.k_pairs = reinterpret_cast<uint32_t*>(next);
      next += layout.chunk_keys / 2 * layout.d_pad;
      s.q_pairs = reinterpret_cast<uint32_t*>(next);
      next += kBwdBlock / 2 * layout.d_pad;
      s.dout_pairs = reinterpret_cast<uint32_t*>(next);
      next += kBwdBlock / 2 * layout.dv_pad;
      s.staging = next;
      next += kBwdBlock * kBwdBlock;
      s.key_flags = reinterpret_cast<uint8_t*>(next);
    }
    return s;
  }
};

}  // namespace anyattn::cpu

#endif  // ANYATTN_PLAN_BWD_LAYOUT_H_
