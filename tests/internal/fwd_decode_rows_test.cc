// Where the direct decode loop's prefetch hints go (src/cpu/decode/fwd_decode_rows.h, PassPrefetcher):
// the far hints of a chunk's passes, numbered as the score and P V loops number their loads,
// sweep the chunk ahead once, line by line in ascending memory order, where each pass's share of
// it is one contiguous run (dense rows with the task's kv heads side by side, pages that hold the
// share whole, rows of contiguous kv heads); everywhere else (a page break in a share, a task with
// only some kv heads of each row, rows of a size that is not a multiple of 64 bytes, a chunk past
// the stream's end) they keep the old target, the same bytes of key j + 16 l2_chunks of kv head h.
// The near hints go to the row that pass order reads l1_keys later. Prefetches do not change
// results, so the other tests cannot see any of this.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/decode/fwd_decode_rows.h"

namespace anyattn::cpu {
namespace {

constexpr int64_t kKeys = 2 * kKeyBlock;  // the block's keys and the next block's

// A stream of 2 x kKeyBlock key rows over a buffer: row j at row_offsets[j] bytes, kv head h of
// the task h * head_bytes further.
struct TestStream {
  std::vector<char> buffer;
  std::vector<int64_t> row_offsets;
  int64_t head_bytes = 0;

  BlockStream stream() const {
    return BlockStream(buffer.data(), row_offsets.data(), kKeyBlock, row_offsets.data() + kKeyBlock,
                       kKeyBlock, head_bytes);
  }
  const char* row(int64_t j, int64_t h) const {
    return buffer.data() + row_offsets[j] + h * head_bytes;
  }
};

// Rows of `heads` kv heads of row_bytes side by side, key j at j * row_stride.
TestStream dense_stream(int64_t heads, int64_t row_bytes, int64_t row_stride) {
  TestStream s;
  s.head_bytes = row_bytes;
  s.buffer.assign(kKeys * row_stride + heads * row_bytes, 0);
  for (int64_t j = 0; j < kKeys; ++j) s.row_offsets.push_back(j * row_stride);
  return s;
}

// The far targets of one chunk's passes, in the order the score loop issues them: per pass, key
// groups of 4 keys, each line by line over its keys.
template <bool kFarInMemoryOrder>
std::vector<const char*> score_far_targets(const std::vector<PassPrefetcher>& passes,
                                           int64_t row_lines) {
  std::vector<const char*> targets;
  for (const PassPrefetcher& pass : passes) {
    for (int64_t first = 0; first < kDirectChunkKeys; first += 4) {
      for (int64_t line = 0; line < row_lines; ++line) {
        for (int64_t g = 0; g < 4; ++g) {
          const int64_t n = PassPrefetcher::score_line_number(first, g, line, 4, row_lines);
          targets.push_back(pass.far_target<kFarInMemoryOrder>(first + g, line * 64, n));
        }
      }
    }
  }
  return targets;
}

// The far targets of one chunk's passes in the order P V issues them: per pass, column tiles of
// tile_bytes, each over the pass's keys, line by line.
template <bool kFarInMemoryOrder>
std::vector<const char*> pv_far_targets(const std::vector<PassPrefetcher>& passes,
                                        int64_t row_bytes, int64_t tile_bytes) {
  std::vector<const char*> targets;
  for (const PassPrefetcher& pass : passes) {
    for (int64_t begin = 0; begin < row_bytes; begin += tile_bytes) {
      const int64_t first_line = (begin + 63) / 64;
      const int64_t end_line = (std::min(begin + tile_bytes, row_bytes) + 63) / 64;
      for (int64_t j = 0; j < kDirectChunkKeys; ++j) {
        for (int64_t line = first_line; line < end_line; ++line) {
          const int64_t n = PassPrefetcher::tile_line_number(j, first_line, end_line, line);
          targets.push_back(pass.far_target<kFarInMemoryOrder>(j, line * 64, n));
        }
      }
    }
  }
  return targets;
}

std::vector<PassPrefetcher> chunk_passes(const TestStream& s, int64_t c, int64_t heads,
                                         int64_t l1_keys, int64_t l2_chunks, bool side_by_side,
                                         int64_t row_bytes) {
  std::vector<PassPrefetcher> passes;
  const BlockStream stream = s.stream();
  for (int64_t h = 0; h < heads; ++h) {
    passes.emplace_back(stream, c, h, heads, l1_keys, l2_chunks, side_by_side, row_bytes);
  }
  return passes;
}

// Every line from `start` on, once, in ascending order.
void expect_ascending_run(const std::vector<const char*>& targets, const char* start) {
  for (size_t i = 0; i < targets.size(); ++i) {
    ASSERT_EQ(targets[i], start + static_cast<int64_t>(i) * 64) << "hint " << i;
  }
}

TEST(FwdDecodePrefetch, DenseRowsSweepTheChunkAheadInMemoryOrder) {
  // bf16 Hk8 D128: 256-byte slices, 2 KiB rows; and f32 D64 Hk4, and D256 bf16 Hk2.
  struct Case {
    int64_t heads, row_bytes, l2_chunks;
  };
  for (const Case& shape : {Case{8, 256, 1}, Case{4, 256, 2}, Case{2, 512, 3}, Case{1, 128, 4}}) {
    const TestStream s = dense_stream(shape.heads, shape.row_bytes, shape.heads * shape.row_bytes);
    const int64_t row_lines = shape.row_bytes / 64;
    for (int64_t c = 0; c < kKeyBlock; c += kDirectChunkKeys) {
      SCOPED_TRACE(::testing::Message()
                   << "heads " << shape.heads << " row " << shape.row_bytes << " chunk " << c);
      const std::vector<PassPrefetcher> passes =
          chunk_passes(s, c, shape.heads, 8, shape.l2_chunks, true, shape.row_bytes);
      for (const PassPrefetcher& pass : passes) EXPECT_TRUE(pass.far_in_memory_order());
      const char* far_chunk = s.row(c + shape.l2_chunks * kDirectChunkKeys, 0);
      const std::vector<const char*> scores = score_far_targets<true>(passes, row_lines);
      ASSERT_EQ(scores.size(), static_cast<size_t>(kDirectChunkKeys * shape.heads * row_lines));
      expect_ascending_run(scores, far_chunk);
      // P V in AVX-512's bf16 column tiles (128 bytes), and in 64-byte ones.
      expect_ascending_run(pv_far_targets<true>(passes, shape.row_bytes, 128), far_chunk);
      expect_ascending_run(pv_far_targets<true>(passes, shape.row_bytes, 64), far_chunk);
    }
  }
}

TEST(FwdDecodePrefetch, HalfLineTilesHintEachLineOnce) {
  // AVX2's 32-byte P V tiles: the tile that starts a line asks for it, the other none.
  const TestStream s = dense_stream(8, 256, 2048);
  const std::vector<PassPrefetcher> passes = chunk_passes(s, 0, 8, 8, 1, true, 256);
  expect_ascending_run(pv_far_targets<true>(passes, 256, 32), s.row(kDirectChunkKeys, 0));
}

TEST(FwdDecodePrefetch, ContiguousHeadsSweepEachHeadsKeysInOrder) {
  // (B, Hk, S, D): kv head h's rows follow each other, the heads kKeys rows apart.
  TestStream s;
  const int64_t heads = 4, row_bytes = 256;
  s.head_bytes = kKeys * row_bytes;
  s.buffer.assign(heads * kKeys * row_bytes, 0);
  for (int64_t j = 0; j < kKeys; ++j) s.row_offsets.push_back(j * row_bytes);
  const std::vector<PassPrefetcher> passes = chunk_passes(s, 16, heads, 8, 1, false, row_bytes);
  for (int64_t h = 0; h < heads; ++h) {
    ASSERT_TRUE(passes[h].far_in_memory_order());
    const std::vector<const char*> targets = score_far_targets<true>({passes[h]}, row_bytes / 64);
    expect_ascending_run(targets, s.row(32, h));
  }
}

// Where the share is not one run, the far hint of key j's bytes is the same bytes of key
// j + 16 l2_chunks of kv head h.
void expect_pass_order_fallback(const TestStream& s, int64_t c, int64_t heads, int64_t l2_chunks,
                                bool side_by_side, int64_t row_bytes, bool all_passes) {
  const std::vector<PassPrefetcher> passes =
      chunk_passes(s, c, heads, 8, l2_chunks, side_by_side, row_bytes);
  bool any_fallback = false;
  for (int64_t h = 0; h < heads; ++h) {
    if (passes[h].far_in_memory_order()) {
      EXPECT_FALSE(all_passes) << "pass " << h;
      continue;
    }
    any_fallback = true;
    for (int64_t j = 0; j < kDirectChunkKeys; ++j) {
      for (int64_t offset = 0; offset < row_bytes; offset += 64) {
        EXPECT_EQ(passes[h].far_target<false>(j, offset, 0),
                  s.row(c + j + l2_chunks * kDirectChunkKeys, h) + offset);
      }
    }
  }
  EXPECT_TRUE(any_fallback);
}

TEST(FwdDecodePrefetch, SharesThatAreNotOneRunKeepThePassOrderTargets) {
  {
    SCOPED_TRACE("pages of one key, scattered");
    TestStream s = dense_stream(8, 256, 2048);
    for (int64_t j = 0; j < kKeys; ++j) s.row_offsets[j] = ((j * 37) % kKeys) * 2048;
    expect_pass_order_fallback(s, 0, 8, 1, true, 256, true);
  }
  {
    SCOPED_TRACE("pages of 8 keys, the sequence starting 5 keys into its first page");
    // Key j in page (j + 5) / 8, pages scattered: bf16 Hk8 pass h's share (keys 2h and 2h + 1 of
    // the chunk ahead) straddles a page break for h = 1 and h = 5 of the chunk at 16.
    TestStream s = dense_stream(8, 256, 2048);
    const int64_t pages = (kKeys + 5 + 7) / 8;
    s.buffer.assign(pages * 8 * 2048 + 8 * 256, 0);
    for (int64_t j = 0; j < kKeys; ++j) {
      const int64_t page = (j + 5) / 8, page_slot = (page * 5) % pages;
      s.row_offsets[j] = (page_slot * 8 + (j + 5) % 8) * 2048;
    }
    const std::vector<PassPrefetcher> passes = chunk_passes(s, 0, 8, 8, 1, true, 256);
    for (int64_t h = 0; h < 8; ++h) {
      EXPECT_EQ(passes[h].far_in_memory_order(), h != 1 && h != 5) << "pass " << h;
    }
    expect_pass_order_fallback(s, 0, 8, 1, true, 256, false);
  }
  {
    SCOPED_TRACE("a task with 4 of the row's 8 kv heads");
    expect_pass_order_fallback(dense_stream(4, 256, 2048), 0, 4, 1, true, 256, true);
  }
  {
    SCOPED_TRACE("rows of 160 bytes (bf16 D80)");
    expect_pass_order_fallback(dense_stream(8, 160, 8 * 160), 0, 8, 1, true, 160, true);
  }
  {
    SCOPED_TRACE("a chunk ahead past the stream's end");
    TestStream s = dense_stream(8, 256, 2048);
    const BlockStream stream(s.buffer.data(), s.row_offsets.data(), kKeyBlock, nullptr, 0, 256);
    for (int64_t h = 0; h < 8; ++h) {
      const PassPrefetcher pass(stream, kKeyBlock - kDirectChunkKeys, h, 8, 8, 1, true, 256);
      EXPECT_FALSE(pass.far_in_memory_order()) << "pass " << h;
    }
  }
}

TEST(FwdDecodePrefetch, NearHintsGoToTheRowPassOrderReadsLater) {
  const TestStream s = dense_stream(8, 256, 2048);
  const int64_t c = 16;
  // 1 and a whole chunk are the distances' bounds (prefetch_distances).
  for (int64_t l1_keys : {int64_t{1}, int64_t{8}, kDirectChunkKeys}) {
    const std::vector<PassPrefetcher> passes = chunk_passes(s, c, 8, l1_keys, 1, true, 256);
    for (int64_t h = 0; h < 8; ++h) {
      for (int64_t j = 0; j < kDirectChunkKeys; ++j) {
        // Pass order: the chunk's keys for kv head 0, then for kv head 1, ..., then the next
        // chunk.
        const int64_t position = h * kDirectChunkKeys + j + l1_keys;
        const int64_t head = position / kDirectChunkKeys;
        const int64_t key = c + position % kDirectChunkKeys;
        const char* expected = head < 8 ? s.row(key, head) : s.row(key + kDirectChunkKeys, 0);
        EXPECT_EQ(passes[h].near_target(j, 64), expected + 64)
            << "l1_keys " << l1_keys << " pass " << h << " key " << j;
      }
    }
  }
}

// The score loop issues each line's hints from two bases per key (score_hints) plus the line's
// byte offset (times score_far_step for the far one); the targets must be line()'s, in both far
// orders, for key groups of 2 and 4 (AVX2's and AVX-512's).
template <bool kFarInMemoryOrder>
void expect_score_hints_match_line_targets(const std::vector<PassPrefetcher>& passes,
                                           int64_t row_lines) {
  for (size_t h = 0; h < passes.size(); ++h) {
    const PassPrefetcher& pass = passes[h];
    for (int64_t group : {2, 4}) {
      const int64_t far_step = PassPrefetcher::score_far_step<kFarInMemoryOrder>(group);
      for (int64_t first = 0; first < kDirectChunkKeys; first += group) {
        for (int64_t g = 0; g < group; ++g) {
          const PassPrefetcher::RowHints hints =
              pass.score_hints<kFarInMemoryOrder>(first, g, group, row_lines);
          for (int64_t line = 0; line < row_lines; ++line) {
            const int64_t offset = line * 64;
            const int64_t n = PassPrefetcher::score_line_number(first, g, line, group, row_lines);
            ASSERT_EQ(hints.near + offset, pass.near_target(first + g, offset))
                << "pass " << h << " group " << group << " key " << first + g << " line " << line;
            ASSERT_EQ(hints.far + offset * far_step,
                      pass.far_target<kFarInMemoryOrder>(first + g, offset, n))
                << "pass " << h << " group " << group << " key " << first + g << " line " << line;
          }
        }
      }
    }
  }
}

TEST(FwdDecodePrefetch, ScoreHintBasesGiveTheLineTargets) {
  const TestStream dense = dense_stream(8, 256, 2048);
  for (int64_t c = 0; c < kKeyBlock; c += kDirectChunkKeys) {
    const std::vector<PassPrefetcher> passes = chunk_passes(dense, c, 8, 8, 2, true, 256);
    expect_score_hints_match_line_targets<true>(passes, 4);
    expect_score_hints_match_line_targets<false>(passes, 4);
  }
  // Rows of 320 bytes (f32 D80): five lines, not in memory order.
  const TestStream odd = dense_stream(2, 320, 1024);
  const std::vector<PassPrefetcher> passes = chunk_passes(odd, 16, 2, 4, 1, true, 320);
  expect_score_hints_match_line_targets<false>(passes, 5);
}

}  // namespace
}  // namespace anyattn::cpu
