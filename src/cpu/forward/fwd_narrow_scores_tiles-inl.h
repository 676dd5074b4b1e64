// The tiling shared by the narrow score kernels (fwd_narrow_scores.h): included inside each
// kernel's namespace (neon_bf16, neon_f16), after that kernel defines
//   constexpr int64_t kKeyGranule;   keys per key vector of its packed format (4 or 8)
//   template <int R, int NV>
//   void score_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth,
//                   int64_t key0, PanelPrefetchWindow ahead, float* s);
// the scores of R <= 8 query rows against NV key vectors from key key0 (s: row 0's column key0),
// prefetching two lines of `ahead` per step of 8 head-dim elements. Defines block_scores_of: the
// block in tiles of 8 rows x 8 keys, then the rows and key vectors left over.
//
// Tiles of 8 rows x 8 keys keep 16 accumulators (2 per row), and whichever operand a compiler
// loads for the whole step, the 8 q vectors or the key vectors of 8 elements (8 for f16, 2 x 4
// for bf16's pairs), fits beside them in AArch64's 32 vector registers: a 4 x 16 tile would need
// 16 key vectors live and spill.
// No include guard: each kernel's translation unit includes it once, in its own namespace.

constexpr int kNarrowTileRows = 8;
constexpr int64_t kNarrowTileKeys = 8;
constexpr int kNarrowTileVecs = static_cast<int>(kNarrowTileKeys / kKeyGranule);
static_assert(kKeyBlock % kNarrowTileKeys == 0, "score tiles must divide the key block");
static_assert(kNarrowTileVecs <= 2, "a tile's last keys take a whole tile or one vector");

// The keys [0, round_up(keys, kKeyGranule)) of R rows, a window of the next panel per tile.
template <int R>
void score_row_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth,
                    int64_t keys, NextPanelWindows* ahead, float* s) {
  const int64_t steps = depth / 8;
  int64_t key0 = 0;
  for (; key0 + kNarrowTileKeys <= keys; key0 += kNarrowTileKeys) {
    score_tile<R, kNarrowTileVecs>(q, ldq, panel, depth, key0, ahead->window(steps), s);
  }
  if (key0 < keys) {
    const int64_t vectors = (keys - key0 + kKeyGranule - 1) / kKeyGranule;
    if (vectors == kNarrowTileVecs) {
      score_tile<R, kNarrowTileVecs>(q, ldq, panel, depth, key0, ahead->window(steps), s);
    } else {
      score_tile<R, 1>(q, ldq, panel, depth, key0, ahead->window(steps), s);
    }
  }
}

// The rows of a tile that is not whole: R = rows, 1 <= rows < kNarrowTileRows.
template <int R = kNarrowTileRows - 1>
void score_row_remainder(int64_t rows, const uint16_t* q, int64_t ldq, const void* panel,
                         int64_t depth, int64_t keys, NextPanelWindows* ahead, float* s) {
  if constexpr (R >= 1) {
    if (rows == R) {
      score_row_tile<R>(q, ldq, panel, depth, keys, ahead, s);
    } else {
      score_row_remainder<R - 1>(rows, q, ldq, panel, depth, keys, ahead, s);
    }
  }
}

void block_scores_of(const uint16_t* q, int64_t ldq, int64_t rows, const void* panel,
                     int64_t depth, int64_t keys, NextPanelLines next, float* s) {
  NextPanelWindows ahead(next, panel);
  int64_t r = 0;
  for (; r + kNarrowTileRows <= rows; r += kNarrowTileRows) {
    score_row_tile<kNarrowTileRows>(q + r * ldq, ldq, panel, depth, keys, &ahead,
                                    s + r * kKeyBlock);
  }
  score_row_remainder(rows - r, q + r * ldq, ldq, panel, depth, keys, &ahead, s + r * kKeyBlock);
}
