// The tiling shared by the value-pairs P V kernels (fwd_narrow_scores.h, block_pv): included inside
// each kernel's namespace (avx512_bf16, neon_bf16), after that kernel defines
//   constexpr int kPvColumnLanes;   columns of O per vector (16 or 4)
//   constexpr int kPvTileRows;      query rows per tile
//   constexpr int kPvTileVecs;      column vectors per tile
//   void round_probability_pairs(const float* p_row, const float* factors, uint32_t* pairs);
//     the 64 probabilities of a block row (each times its key's factor where factors is not null)
//     rounded to nearest bf16, as 32 key pairs (word t: keys 2t and 2t + 1)
//   template <int R, int NV>
//   void pv_tile(const uint32_t* p_pairs, const uint32_t* v_pairs, int64_t ldv, int64_t pair_rows,
//                float* o, int64_t ldo);
//     o[r][0, NV * kPvColumnLanes) += the products of pair rows [0, pair_rows) for R rows
//     (p_pairs: R rows of kProbabilityPairWords words; v_pairs and o: rows ldv words and ldo
//     floats apart)
// Defines block_pv_of: the block in tiles of kPvTileRows rows x kPvTileVecs column vectors, each
// row tile's probabilities rounded once for all its column tiles, then the rows and column
// vectors left over. Each row tile stops at the pair holding the last key its rows see.
// No include guard: each kernel's translation unit includes it once, in its own namespace.

// The column vectors [0, vectors) of R rows past the whole tiles, at a width fixed at compile
// time.
template <int R, int NV = kPvTileVecs - 1>
void pv_column_remainder(int64_t vectors, const uint32_t* p_pairs, const uint32_t* v_pairs,
                         int64_t ldv, int64_t pair_rows, float* o, int64_t ldo) {
  if constexpr (NV >= 1) {
    if (vectors == NV) {
      pv_tile<R, NV>(p_pairs, v_pairs, ldv, pair_rows, o, ldo);
    } else {
      pv_column_remainder<R, NV - 1>(vectors, p_pairs, v_pairs, ldv, pair_rows, o, ldo);
    }
  }
}

template <int R>
void pv_rows(const float* p, const uint32_t* v_pairs, const float* factors, int64_t dv_pad,
             int64_t columns, int64_t pair_rows, float* o) {
  alignas(64) uint32_t p_pairs[R * kProbabilityPairWords];
  for (int r = 0; r < R; ++r) {
    round_probability_pairs(p + r * kKeyBlock, factors, p_pairs + r * kProbabilityPairWords);
  }
  const int64_t vectors = columns / kPvColumnLanes;
  int64_t n = 0;
  for (; n + kPvTileVecs <= vectors; n += kPvTileVecs) {
    pv_tile<R, kPvTileVecs>(p_pairs, v_pairs + n * kPvColumnLanes, dv_pad, pair_rows,
                            o + n * kPvColumnLanes, dv_pad);
  }
  pv_column_remainder<R>(vectors - n, p_pairs, v_pairs + n * kPvColumnLanes, dv_pad, pair_rows,
                         o + n * kPvColumnLanes, dv_pad);
}

// The rows of a tile that is not whole: R = rows, 1 <= rows < kPvTileRows.
template <int R = kPvTileRows - 1>
void pv_row_remainder(int64_t rows, const float* p, const uint32_t* v_pairs, const float* factors,
                      int64_t dv_pad, int64_t columns, int64_t pair_rows, float* o) {
  if constexpr (R >= 1) {
    if (rows == R) {
      pv_rows<R>(p, v_pairs, factors, dv_pad, columns, pair_rows, o);
    } else {
      pv_row_remainder<R - 1>(rows, p, v_pairs, factors, dv_pad, columns, pair_rows, o);
    }
  }
}

// Pair rows a tile of rows [r0, r0 + count) must accumulate: those holding its keys (tile_keys).
inline int64_t tile_pair_rows(const int64_t* row_keys, int64_t r0, int64_t count, int64_t keys) {
  return (tile_keys(row_keys, r0, count, keys) + 1) / 2;
}

void block_pv_of(const float* p, int64_t rows, const uint32_t* v_pairs, const float* factors,
                 int64_t keys, const int64_t* row_keys, float* o, int64_t dv_pad,
                 int64_t columns) {
  int64_t r = 0;
  for (; r + kPvTileRows <= rows; r += kPvTileRows) {
    pv_rows<kPvTileRows>(p + r * kKeyBlock, v_pairs, factors, dv_pad, columns,
                         tile_pair_rows(row_keys, r, kPvTileRows, keys), o + r * dv_pad);
  }
  if (r < rows) {
    pv_row_remainder(rows - r, p + r * kKeyBlock, v_pairs, factors, dv_pad, columns,
                     tile_pair_rows(row_keys, r, rows - r, keys), o + r * dv_pad);
  }
}
