// Where the direct decode loop (fwd_decode_kernel-inl.h) reads K and V rows, and which rows it
// prefetches while it computes a pass: plain pointer arithmetic and prefetch hints, with no
// ISA-specific code, shared by every ISA path and by the VDPBF16PS scores
// (fwd_decode_bf16_dot.h), which inline PassPrefetcher::line_of into their own loops.
#ifndef ANYATTN_CPU_FWD_DECODE_ROWS_H_
#define ANYATTN_CPU_FWD_DECODE_ROWS_H_

#include <algorithm>
#include <cstdint>

#include "cpu/fwd_layout.h"
#include "cpu/prefetch.h"

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

// The prefetches of one pass (chunk c, kv head h). For each key j of the pass there are two
// target rows, and the loops ask for them line by line, each line next to their own loads of the
// same bytes of key j's row (line_of, bytes_of), so that the hints spread over the arithmetic:
//   - into L1, the row the loop reads l1_keys later in pass order (this pass, then the next kv
//     head's pass of the chunk, or the first kv head's pass of the next chunk);
//   - into L2, row c + j of the chunk l2_chunks ahead, same kv head: over one chunk of passes
//     this asks for whole key rows of the task's kv heads, in memory order, that many chunks
//     early (into the next block's rows, which BlockStream holds).
// The targets are gathered once per pass, so that line_of is two loads and two prefetch
// instructions with no branch: it runs inside the product loops with their accumulators live
// and must stay inline there (as an out-of-line call GCC 12 spilled and reloaded every
// accumulator around each key).
//
// Why line by line: until 2026-12-02 each key's 2 x (row bytes / 64) hints went out in one burst
// before the key was computed (4 keys' worth, 32 hints, before each VDPBF16PS key group), and a
// Zen 4 VM read K/V 6-13% slower that way (bench/MEASUREMENTS.md, "Prefetch hints spread over the
// loads"). Our reading, without hardware counters to confirm it: a burst fills the core's miss
// queue, and the far (prefetcht1) hints that find it full are dropped, so their lines later
// arrive on demand.
class PassPrefetcher {
 public:
  PassPrefetcher(const BlockStream& stream, int64_t c, int64_t h, int64_t heads, int64_t l1_keys,
                 int64_t l2_chunks, int64_t row_bytes)
      : row_bytes_(row_bytes) {
    for (int64_t j = 0; j < kDirectChunkKeys; ++j) {
      const int64_t ahead = j + l1_keys;  // position in pass order, l1_keys <= a chunk
      const bool this_pass = ahead < kDirectChunkKeys;
      const bool next_chunk = !this_pass && h + 1 == heads;
      const int64_t key =
          c + (this_pass ? ahead : ahead - kDirectChunkKeys) + (next_chunk ? kDirectChunkKeys : 0);
      const int64_t head = this_pass ? h : next_chunk ? 0 : h + 1;
      l1_[j] = stream.row(key, head);
      l2_[j] = stream.row(c + j + l2_chunks * kDirectChunkKeys, h);
    }
  }

  // The line at byte `offset` (< row_bytes) of key j's two targets.
  __attribute__((always_inline)) void line_of(int64_t j, int64_t offset) const {
    prefetch_line_l1(l1_[j] + offset);
    prefetch_line_l2(l2_[j] + offset);
  }

  // The lines of bytes [begin, end) of key j's targets, clipped to the row.
  __attribute__((always_inline)) void bytes_of(int64_t j, int64_t begin, int64_t end) const {
    const int64_t stop = std::min(end, row_bytes_);
    for (int64_t offset = begin; offset < stop; offset += 64) line_of(j, offset);
  }

 private:
  int64_t row_bytes_;
  const char* l1_[kDirectChunkKeys];
  const char* l2_[kDirectChunkKeys];
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

#endif  // ANYATTN_CPU_FWD_DECODE_ROWS_H_
