// Where the direct decode loop (fwd_decode_kernel-inl.h) reads K and V rows, and which rows it
// prefetches while it computes a pass: plain pointer arithmetic and prefetch hints, with no
// ISA-specific code, shared by every ISA path and by the VDPBF16PS scores
// (fwd_decode_bf16_dot.h), which inline PassPrefetcher::line into their own loops.
#ifndef ANYATTN_CPU_DECODE_FWD_DECODE_ROWS_H_
#define ANYATTN_CPU_DECODE_FWD_DECODE_ROWS_H_

#include <algorithm>
#include <cstdint>

#include "cpu/shared/prefetch.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu {

// The rows of one stream (K or V) that the loop reads while it works on a key block: the block's
// own rows, then the next block's, for the task's first kv head (head h of the task adds h times
// the head stride), padded past the end of the stream with its last row so that every index below
// 2 * kKeyBlock is a readable row.
class BlockStream {
 public:
  BlockStream(const void* base, const int64_t* offsets, int64_t keys, const int64_t* next_offsets,
              int64_t next_keys, int64_t head_bytes)
      : head_bytes_(head_bytes) {
    const char* origin = static_cast<const char*>(base);
    const char* last = origin;
    int64_t filled = 0;
    for (int64_t j = 0; j < keys; ++j) rows_[filled++] = last = origin + offsets[j];
    while (filled < kKeyBlock) rows_[filled++] = last;
    for (int64_t j = 0; j < next_keys; ++j) rows_[filled++] = last = origin + next_offsets[j];
    while (filled < 2 * kKeyBlock) rows_[filled++] = last;
  }

  // Row `index` for kv head h of the task: index < kKeyBlock is the block's key `index` (past its
  // keys, its last row), then the next block's keys (past them, the stream's last row).
  const char* row(int64_t index, int64_t h) const { return rows_[index] + h * head_bytes_; }

 private:
  int64_t head_bytes_;
  const char* rows_[2 * kKeyBlock];
};

// The prefetches of one pass (chunk c, kv head h). The loops ask for them line by line, next to
// their own loads, so that the hints spread over the arithmetic: the n-th line the pass loads
// (byte `offset` of key j's row; the loops number their loads, 16 rows' lines in all) comes with
// two hints (line):
//   - into L1, the same bytes of the row the loop reads l1_keys later in pass order (this pass,
//     then the next kv head's pass of the chunk, or the first kv head's pass of the next chunk);
//   - into L2, a line of the chunk l2_chunks ahead. The chunk holds 16 x heads row slices (a key's
//     row of one kv head); pass h's share is the h-th 16 of them in memory order: keys 2h and
//     2h + 1 of every kv head for a task of 8 kv heads whose rows hold them side by side (the
//     (B, S, Hk, D) and paged layouts), or kv head h's 16 keys where each head's rows are
//     contiguous instead. Where the share is one contiguous run of whole lines (no page break in
//     it, the task's heads fill the rows), the far hint of the pass's n-th line is line n of the
//     run: the passes ask for the chunk in ascending memory order (far_in_memory_order). Else it
//     is the same bytes of key j + 16 l2_chunks of kv head h.
// The loops take the order as a template argument, chosen per pass, so that line is two loads and
// two prefetches with no branch. It runs inside the product loops with their accumulators live
// and must stay inline there (as an out-of-line call GCC 12 spilled and reloaded every accumulator
// around each key). Choosing the far target per hint at run time instead costs a branch per hint
// in the innermost loop, which was clearly slower.
//
// Why line by line: hints sent in one burst per key, before the key is computed, fill the core's
// miss queue, and the far hints that find it full are dropped. Why ascending memory order: the
// order of the requests matters, not only how early they go out; asking for the same lines in pass
// order, or a 64-byte column at a time across the share's slices, read memory more slowly
// (docs/design.md, section 6; measured: bench/MEASUREMENTS.md, "Prefetch hints spread over the
// loads" and "Far prefetch hints in ascending memory order").
class PassPrefetcher {
 public:
  // The number within its pass of line `line` of key first + g, loaded by a score key group of
  // group_keys keys from `first` (line by line, each over the group's keys): the group's lines
  // follow those of the pass's keys before it.
  static constexpr int64_t score_line_number(int64_t first, int64_t g, int64_t line,
                                             int64_t group_keys, int64_t row_lines) {
    return first * row_lines + line * group_keys + g;
  }

  // The number within its pass of line row_line of key j, loaded by the P V column tile whose lines
  // start from first_line to end_line (bytes_of).
  static constexpr int64_t tile_line_number(int64_t j, int64_t first_line, int64_t end_line,
                                            int64_t row_line) {
    return first_line * kDirectChunkKeys + j * (end_line - first_line) + (row_line - first_line);
  }

  __attribute__((always_inline))
  PassPrefetcher(const BlockStream& stream, int64_t c, int64_t h, int64_t heads, int64_t l1_keys,
                 int64_t l2_chunks, bool heads_side_by_side, int64_t row_bytes)
      : row_bytes_(row_bytes) {
    const int64_t far_chunk = c + l2_chunks * kDirectChunkKeys;
    // The near targets in two runs of consecutive keys (l1_keys <= a chunk): this pass's keys from
    // l1_keys on, then the first keys of the next pass in pass order (the next kv head's pass of
    // this chunk, or the first kv head's pass of the next chunk).
    const int64_t split = kDirectChunkKeys - l1_keys;
    const bool next_chunk = h + 1 == heads;
    const int64_t wrap_key = next_chunk ? c + kDirectChunkKeys : c;
    const int64_t wrap_head = next_chunk ? 0 : h + 1;
    for (int64_t j = 0; j < split; ++j) l1_[j] = stream.row(c + l1_keys + j, h);
    for (int64_t j = split; j < kDirectChunkKeys; ++j) {
      l1_[j] = stream.row(wrap_key + j - split, wrap_head);
    }
    for (int64_t j = 0; j < kDirectChunkKeys; ++j) far_[j] = stream.row(far_chunk + j, h);
    // The share's first and last slices. The bytes between two rows of one stream belong to its
    // buffer, so a run whose ends lie 15 rows apart is safe to sweep whatever lies inside it.
    const char* first = far_[0];
    const char* last = far_[kDirectChunkKeys - 1];
    if (heads_side_by_side) {
      const int64_t first_slice = h * kDirectChunkKeys;
      const int64_t last_slice = first_slice + kDirectChunkKeys - 1;
      first = stream.row(far_chunk + first_slice / heads, first_slice % heads);
      last = stream.row(far_chunk + last_slice / heads, last_slice % heads);
    }
    far_run_ = first;
    far_in_memory_order_ =
        row_bytes % 64 == 0 && last == first + (kDirectChunkKeys - 1) * row_bytes;
  }

  // Whether the far hints may go in memory order (the loops' template argument).
  bool far_in_memory_order() const { return far_in_memory_order_; }

  // The two hints for the n-th line the pass loads, byte `offset` of key j's row.
  template <bool kFarInMemoryOrder>
  __attribute__((always_inline)) void line(int64_t j, int64_t offset, int64_t n) const {
    prefetch_line_l1(near_target(j, offset));
    prefetch_line_l2(far_target<kFarInMemoryOrder>(j, offset, n));
  }

  // The hints of key first + g of a score key group of group_keys keys, as two bases that the
  // loop offsets by the byte `offset` of each line start it loads: the line's near hint goes to
  // near + offset, its far hint to far + offset * score_far_step (group_keys in memory order,
  // else 1). The same targets as line() with score_line_number's n, at one address add per hint.
  struct RowHints {
    const char* near;
    const char* far;
  };
  template <bool kFarInMemoryOrder>
  __attribute__((always_inline)) RowHints score_hints(int64_t first, int64_t g,
                                                      int64_t group_keys,
                                                      int64_t row_lines) const {
    const int64_t j = first + g;
    if constexpr (kFarInMemoryOrder) {
      return {l1_[j], far_run_ + 64 * score_line_number(first, g, 0, group_keys, row_lines)};
    } else {
      return {l1_[j], far_[j]};
    }
  }
  template <bool kFarInMemoryOrder>
  static constexpr int64_t score_far_step(int64_t group_keys) {
    return kFarInMemoryOrder ? group_keys : 1;
  }

  // Where line's two hints go (also read by the tests).
  __attribute__((always_inline)) const char* near_target(int64_t j, int64_t offset) const {
    return l1_[j] + offset;
  }
  template <bool kFarInMemoryOrder>
  __attribute__((always_inline)) const char* far_target(int64_t j, int64_t offset,
                                                        int64_t n) const {
    if constexpr (kFarInMemoryOrder) {
      return far_run_ + n * 64;
    } else {
      return far_[j] + offset;
    }
  }

  // The lines of a key row that start within its bytes [begin, end) (clipped to the row): the
  // lines a column tile of the pass loads first. Depends on the tile's columns only, so a tile
  // computes it once for all its keys.
  struct LineRange {
    int64_t first = 0;
    int64_t end = 0;  // exclusive
  };
  __attribute__((always_inline)) LineRange lines_in(int64_t begin, int64_t end) const {
    return {(begin + 63) / 64, (std::min(end, row_bytes_) + 63) / 64};
  }

  // The hints for the lines of key j's row in `lines` (lines_in), loaded by a column tile of the
  // pass: each line once, however many tiles share it (a 32-byte tile of AVX2 covers half a
  // line). The tiles cover the row in ascending order, each over the pass's 16 keys, so the tile
  // whose lines start from line L0 to L1 loads the pass's lines from 16 L0 on, key j's from there
  // j (L1 - L0) on (tile_line_number).
  template <bool kFarInMemoryOrder>
  __attribute__((always_inline)) void tile_lines(int64_t j, LineRange lines) const {
    for (int64_t row_line = lines.first; row_line < lines.end; ++row_line) {
      line<kFarInMemoryOrder>(j, row_line * 64,
                              tile_line_number(j, lines.first, lines.end, row_line));
    }
  }

 private:
  int64_t row_bytes_;
  const char* far_run_;
  bool far_in_memory_order_;
  const char* l1_[kDirectChunkKeys];
  const char* far_[kDirectChunkKeys];
};

// The prefetch distances for rows of row_bytes and `heads` kv heads per task: the L1 one in keys
// of pass order (kDirectPrefetchL1Bytes of one head's rows, 1 to a chunk), the L2 one in chunks
// (kDirectPrefetchL2Bytes of the task's whole key rows, rounded up, 1 to 4: the next block's rows
// are the farthest BlockStream holds).
struct PrefetchDistances {
  int64_t l1_keys = 1;
  int64_t l2_chunks = 1;
};

inline PrefetchDistances prefetch_distances(int64_t row_bytes, int64_t heads) {
  PrefetchDistances d;
  d.l1_keys = std::clamp<int64_t>(kDirectPrefetchL1Bytes / std::max<int64_t>(row_bytes, 1), 1,
                                  kDirectChunkKeys);
  const int64_t chunk_bytes = std::max<int64_t>(kDirectChunkKeys * heads * row_bytes, 1);
  d.l2_chunks = std::clamp<int64_t>(ceil_div(kDirectPrefetchL2Bytes, chunk_bytes), 1,
                                    kKeyBlock / kDirectChunkKeys);
  return d;
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_DECODE_FWD_DECODE_ROWS_H_
