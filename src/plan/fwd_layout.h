// Memory layout shared by the forward driver and every ISA's kernels: packed K/V blocks, the
// per-task description, and the per-thread scratch buffers.
//
// Packed K/V (built once per (batch, kv-head), reused by every q-block and every query head of the
// GQA group):
//   block kb covers keys [64*kb, 64*kb + 64). It holds, contiguously,
//     kt[d][j]  D x 64 floats   K transposed: one row of 64 keys per head-dim index, so the score
//                               micro-kernel loads keys as full vectors and broadcasts q[i][d];
//     v[j][c]   64 x dv_pad     V rows, zero-padded to dv_pad columns.
//   Keys past Sk are zero in both (their scores are masked to -inf, so they contribute exactly 0).
//   All values are converted to f32 while packing. (The avx512_amx path packs bf16 blocks in its
//   tile formats instead, in the same space: fwd_tiles_amx-inl.h.)
#ifndef ANYATTN_PLAN_FWD_LAYOUT_H_
#define ANYATTN_PLAN_FWD_LAYOUT_H_

#include <algorithm>
#include <cstdint>

#include "common/fwd_args.h"
#include "common/mask.h"

namespace anyattn::cpu {

// Keys per packed block. A multiple of every ISA's key tile (64 on AVX-512, 16 on AVX2).
constexpr int64_t kKeyBlock = 64;
// Most query rows one task processes; the scratch buffers are sized for it. Dense q blocks of 128
// and of 36 rows were no faster (bench/MEASUREMENTS.md, "Where the forward time goes").
constexpr int64_t kMaxQBlockRows = 64;
// Most query rows per kv head that a cache the direct loop reads through f16 takes direct,
// whatever the path's direct_rows (isa_table.inc): e5m2 always, e4m3 where the loop does not read
// it as f32 bits (cpu/decode/e4m3_read.h: Intel CPUs, NEON, portable). The loop converts each K
// and V element again for every tile of 4 rows, and such an element costs a widening and an F16C
// conversion, so past 12 rows packing each block once is cheaper. e4m3 read as f32 bits, three
// integer instructions, takes the path's 20 (measured: bench/MEASUREMENTS.md, "Design
// constants").
constexpr int64_t kF16ReadDirectRows = 12;
// Keys of one pass of the direct loop's products: a chunk of a key block's keys for one kv head.
// The loop runs the passes chunk by chunk and, within a chunk, kv head by kv head, so that it
// reads the task's part of each key row (its kv heads lie side by side) within a short time.
constexpr int64_t kDirectChunkKeys = 16;
static_assert(kKeyBlock % kDirectChunkKeys == 0, "chunks must tile a key block");
// How far ahead the direct loop prefetches K and V rows (fwd_decode_kernel-inl.h,
// PassPrefetcher), K and V apart: into L1 kDirectPrefetchL1Bytes of one kv head's rows ahead in
// the order its passes read them (8 bf16 rows of D = 128), and into L2 kDirectPrefetchL2Bytes
// of the task's whole key rows ahead, rounded up to whole 16-key chunks (one chunk for bf16 Hk8
// D = 128, 32 KiB). Two distances because with the L1 hint alone the core's few line-fill
// buffers stay busy for a whole trip to memory and stall the arithmetic behind them; the second
// hint of each line is overhead only when K and V are already cached, and a decode step reads
// each layer's cache from memory (docs/design.md, section 6). The distances sit on a flat
// optimum: nearby pairs ran within noise (measured: bench/MEASUREMENTS.md, "Design constants").
constexpr int64_t kDirectPrefetchL1Bytes = 2048;
constexpr int64_t kDirectPrefetchL2Bytes = 8192;
// Alignment of every packed block and scratch buffer, in bytes.
constexpr int64_t kAlignment = 64;
// Floats of one row's running softmax denominator in Scratch::l: one partial sum per vector lane
// (16 is the widest ISA's lane count), added across lanes only when the row is written. This keeps
// a horizontal sum (a chain of shuffles) out of every row of every key block.
constexpr int64_t kRowSumSlots = 16;

inline int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
inline int64_t ceil_div(int64_t value, int64_t divisor) {
  return (value + divisor - 1) / divisor;
}

// 16-float vectors that hold a row of Dv columns: the columns the kernels compute.
inline int64_t dv_vectors16(int64_t head_dim_v) {
  return ceil_div(head_dim_v, 16);
}

// Row stride, in floats, of V panels and output accumulators: Dv rounded up to whole 16-float
// vectors, plus one more vector where that is a multiple of 512 floats (2 KiB). Rows 2 KiB apart
// all fall in two sets of a 32 KiB 8-way L1 (64 sets of 64-byte lines): a P V tile's 64 V lines
// and its 6 output rows would then share 16 lines of L1, and the stream of V evicts the output
// rows before the tile stores them. One vector more spreads consecutive rows over every set. The
// extra columns hold zeros and no kernel computes them. (Measured: bench/MEASUREMENTS.md,
// "Design constants".)
inline int64_t padded_dv(int64_t head_dim_v) {
  const int64_t columns = dv_vectors16(head_dim_v) * 16;
  return columns % 512 == 0 ? columns + 16 : columns;
}

struct PackedLayout {
  int64_t head_dim = 0;      // D
  int64_t q_stride = 0;      // floats per query row in Scratch::q: D rounded up to 16
  int64_t dv_pad = 0;        // row stride of V panels and O rows: padded_dv(Dv)
  int64_t kt_floats = 0;     // D * 64, rounded to the alignment
  int64_t block_floats = 0;  // kt_floats + 64 * dv_pad

  static PackedLayout for_args(const FwdArgs& args) {
    PackedLayout layout;
    layout.head_dim = args.head_dim;
    layout.q_stride = round_up(args.head_dim, 16);
    layout.dv_pad = padded_dv(args.head_dim_v);
    layout.kt_floats = round_up(args.head_dim * kKeyBlock, kAlignment / 4);
    layout.block_floats = layout.kt_floats + kKeyBlock * layout.dv_pad;
    return layout;
  }
};

// Where a task's results go. When the key range is split, each split writes an unnormalised
// partial result (o, and m/l in natural units) that the driver merges; otherwise the task writes
// the final out and lse rows itself.
struct PartialOutput {
  float* o = nullptr;  // row r of the task at o + r * o_row_stride, dv_pad floats
  float* m = nullptr;  // row r at m[r * ml_row_stride]: max score, natural units
  float* l = nullptr;  // row r at l[r * ml_row_stride]: sum of e^(s - m)
  int64_t o_row_stride = 0;
  int64_t ml_row_stride = 0;
};

// One unit of attention work: query positions [q_begin, q_end) of query heads
// [head_q_begin, head_q_begin + heads), which read kv heads
// [head_q_begin / group, + heads_k), in sequence `seq`, against key blocks
// [block_begin, block_end). Row r of the task is position q_begin + r % (q_end - q_begin) of head
// head_q_begin + r / (q_end - q_begin); at most kMaxQBlockRows rows.
struct AttendTask {
  SeqInfo seq;
  int64_t head_q_begin = 0;
  int64_t heads = 1;
  int64_t heads_k = 1;  // > 1 only for streaming tasks: heads is then heads_k * group size
  int64_t q_begin = 0;
  int64_t q_end = 0;
  int64_t block_begin = 0;
  int64_t block_end = 0;
  // Packed K/V of this (batch, kv head), from block block_begin on; nullptr to stream: the task
  // then packs each block into its scratch panel just before use (each block is used by this
  // task only).
  const float* packed = nullptr;
  // What pack_block found in each packed block from block_begin on (kBlock*).
  const uint8_t* block_flags = nullptr;
  PartialOutput partial;  // o == nullptr: write out/lse directly
};

// Flags pack_block sets for a key block (AttendTask::block_flags).
constexpr uint8_t kBlockVNonfinite = 1;  // V holds a NaN or an infinity
constexpr uint8_t kBlockSubnormal =
    2;  // K or V holds a subnormal (set by avx512_amx's tile packer)
constexpr uint8_t kBlockValuePairs =
    4;  // V is packed in the value-pairs format (forward/fwd_narrow_scores.h)

// Keys a P V tile of rows [r0, r0 + count) must accumulate: all `keys`, or with row_keys (row r's
// probabilities are 0 from key row_keys[r] on: the mask's right edge in a boundary block) the
// largest row_keys of the tile.
inline int64_t tile_keys(const int64_t* row_keys, int64_t r0, int64_t count, int64_t keys) {
  if (row_keys == nullptr) return keys;
  int64_t most = 0;
  for (int64_t r = r0; r < r0 + count; ++r) most = std::max(most, row_keys[r]);
  return std::min(most, keys);
}

// Key blocks of a sequence.
inline int64_t key_blocks(const SeqInfo& seq) {
  return ceil_div(seq.seqlen_k, kKeyBlock);
}

// Per-thread scratch, sized by the driver for kMaxQBlockRows rows.
struct Scratch {
  float* q = nullptr;  // [row][q_stride]  f32 queries (unscaled), zero past D
  float* s = nullptr;  // [row][64] scores, then probabilities, of one key block
  float* o = nullptr;  // [row][dv_pad] output accumulators
  float* m = nullptr;  // [row] running max (natural units)
  float* l = nullptr;  // [row][kRowSumSlots] running denominator, one partial sum per lane
  // Streaming tasks: one packed block per kv head of the task. Then the K staging rows of
  // pack_block (for packed calls one kv head's, for streaming tasks the task's kv heads'): in
  // the workspace rather than on the stack, whose frame they would grow to 36 KiB at D = 576.
  // The direct loop widens 8-bit K and V rows there instead (cpu/decode/kv8_widen.h): up to a
  // key block's rows, as bf16.
  float* panel = nullptr;
  float* staging = nullptr;

  // Staging floats for `heads_k` heads (at least one): 16 key rows per head, each padded to a
  // multiple of 16; or, if more, kKeyBlock widened rows (bf16, kv8_widened_stride of D or Dv).
  static int64_t staging_floats(const PackedLayout& layout, int64_t heads_k) {
    const int64_t packing = std::max<int64_t>(heads_k, 1) * 16 * round_up(layout.head_dim, 16);
    const int64_t widened_row = round_up(std::max(layout.head_dim, layout.dv_pad), 64);
    return std::max(packing, kKeyBlock * widened_row / 2);
  }
  // With `panel_heads_k` packed panels (streaming tasks that pack; 0 otherwise).
  static int64_t floats_needed(const PackedLayout& layout, int64_t panel_heads_k) {
    return kMaxQBlockRows * layout.q_stride + kMaxQBlockRows * kKeyBlock +
           kMaxQBlockRows * layout.dv_pad + kMaxQBlockRows + kMaxQBlockRows * kRowSumSlots +
           panel_heads_k * layout.block_floats + staging_floats(layout, panel_heads_k);
  }
  // Carves the buffers out of `base` (64-byte aligned, floats_needed floats).
  static Scratch carve(float* base, const PackedLayout& layout, int64_t panel_heads_k) {
    Scratch scratch;
    scratch.q = base;
    scratch.s = scratch.q + kMaxQBlockRows * layout.q_stride;
    scratch.o = scratch.s + kMaxQBlockRows * kKeyBlock;
    scratch.m = scratch.o + kMaxQBlockRows * layout.dv_pad;
    scratch.l = scratch.m + kMaxQBlockRows;
    scratch.panel = scratch.l + kMaxQBlockRows * kRowSumSlots;
    scratch.staging = scratch.panel + panel_heads_k * layout.block_floats;
    return scratch;
  }
};

}  // namespace anyattn::cpu

#endif  // ANYATTN_PLAN_FWD_LAYOUT_H_
