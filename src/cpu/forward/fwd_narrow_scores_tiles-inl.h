// The tiling shared by the narrow score kernels (fwd_narrow_scores.h): included inside each
// kernel's namespace (neon_bf16, neon_f16), after that kernel defines
//   constexpr int64_t kKeyGranule;   keys per key vector of its packed format (4 or 8)
//   template <int R, int NV>
//   void score_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth_rows,
//                   int64_t key0, PanelLineFeed* feed, float* s);
// the scores of R <= 4 query rows against NV key vectors from key key0 (s: row 0's column key0),
// calling feed->step() once per step of 8 head-dim elements. Defines block_scores: the block in
// tiles of 4 rows x 16 keys, then the rows and key vectors left over.
// No include guard: each kernel's translation unit includes it once, in its own namespace.

constexpr int kNarrowTileRows = 4;
constexpr int64_t kNarrowTileKeys = 16;
constexpr int kNarrowTileVecs = static_cast<int>(kNarrowTileKeys / kKeyGranule);
static_assert(kKeyBlock % kNarrowTileKeys == 0, "score tiles must divide the key block");

// The key vectors [key0, key0 + vectors * kKeyGranule) of R rows, 1 <= vectors <= kNarrowTileVecs.
template <int R, int NV = kNarrowTileVecs>
void score_vectors(int64_t vectors, const uint16_t* q, int64_t ldq, const void* panel,
                   int64_t depth_rows, int64_t key0, PanelLineFeed* feed, float* s) {
  if constexpr (NV > 1) {
    if (vectors < NV) {
      score_vectors<R, NV - 1>(vectors, q, ldq, panel, depth_rows, key0, feed, s);
      return;
    }
  }
  score_tile<R, NV>(q, ldq, panel, depth_rows, key0, feed, s);
}

// The keys [0, round_up(keys, kKeyGranule)) of R rows.
template <int R>
void score_row_tile(const uint16_t* q, int64_t ldq, const void* panel, int64_t depth_rows,
                    int64_t keys, PanelLineFeed* feed, float* s) {
  const int64_t vectors = (keys + kKeyGranule - 1) / kKeyGranule;
  int64_t v = 0;
  for (; v + kNarrowTileVecs <= vectors; v += kNarrowTileVecs) {
    score_tile<R, kNarrowTileVecs>(q, ldq, panel, depth_rows, v * kKeyGranule, feed, s);
  }
  if (v < vectors) score_vectors<R>(vectors - v, q, ldq, panel, depth_rows, v * kKeyGranule, feed, s);
}

void block_scores_of(const uint16_t* q, int64_t ldq, int64_t rows, const void* panel,
                     int64_t depth_rows, int64_t keys, NextPanelLines next, float* s) {
  PanelLineFeed feed(next);
  for (int64_t r = 0; r < rows; r += kNarrowTileRows) {
    const uint16_t* q_tile = q + r * ldq;
    float* s_tile = s + r * kKeyBlock;
    switch (std::min<int64_t>(rows - r, kNarrowTileRows)) {
      case 1:
        score_row_tile<1>(q_tile, ldq, panel, depth_rows, keys, &feed, s_tile);
        break;
      case 2:
        score_row_tile<2>(q_tile, ldq, panel, depth_rows, keys, &feed, s_tile);
        break;
      case 3:
        score_row_tile<3>(q_tile, ldq, panel, depth_rows, keys, &feed, s_tile);
        break;
      default:
        score_row_tile<4>(q_tile, ldq, panel, depth_rows, keys, &feed, s_tile);
        break;
    }
  }
}
