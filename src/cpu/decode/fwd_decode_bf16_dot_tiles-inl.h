// The row tiling shared by the bf16 dot-product score kernels (fwd_decode_bf16_dot.h): included
// inside each kernel's namespace (avx512_bf16, neon_bf16), after that kernel defines
//   template <int R, bool kFarInMemoryOrder>
//   void tile_scores(const uint16_t* q, int64_t ldq, const void* const* k_rows, int64_t keys,
//                    int64_t head_dim, const PassPrefetcher* prefetch, float* s);
// the scores of one pass for a tile of R <= 4 query rows. Defines chunk_scores (declared in
// fwd_decode_bf16_dot.h): tiles of up to 4 rows, the first of which issues the pass's
// prefetches, with the far hints in the order the prefetcher chose. The same dispatch as
// for_each_row_tile in fwd_decode_kernel-inl.h, written out again here: that helper lives in each
// ISA path's target region, and GCC does not inline across two regions' target options.
// No include guard: each kernel's translation unit includes it once, in its own namespace.

constexpr int kDotTileRows = 4;

template <bool kFarInMemoryOrder>
void tile_scores_of(int64_t tile_rows, const uint16_t* q, int64_t ldq, const void* const* k_rows,
                    int64_t keys, int64_t head_dim, const PassPrefetcher* prefetch, float* s) {
  switch (tile_rows) {
    case 1:
      tile_scores<1, kFarInMemoryOrder>(q, ldq, k_rows, keys, head_dim, prefetch, s);
      break;
    case 2:
      tile_scores<2, kFarInMemoryOrder>(q, ldq, k_rows, keys, head_dim, prefetch, s);
      break;
    case 3:
      tile_scores<3, kFarInMemoryOrder>(q, ldq, k_rows, keys, head_dim, prefetch, s);
      break;
    default:
      tile_scores<4, kFarInMemoryOrder>(q, ldq, k_rows, keys, head_dim, prefetch, s);
      break;
  }
}

void chunk_scores(const uint16_t* q, int64_t ldq, int64_t rows, const void* const* k_rows,
                  int64_t keys, int64_t head_dim, const PassPrefetcher* prefetch, float* s) {
  for (int64_t r = 0; r < rows; r += kDotTileRows) {
    const PassPrefetcher* tile_prefetch = r == 0 ? prefetch : nullptr;
    const int64_t tile_rows = std::min<int64_t>(rows - r, kDotTileRows);
    if (tile_prefetch != nullptr && tile_prefetch->far_in_memory_order()) {
      tile_scores_of<true>(tile_rows, q + r * ldq, ldq, k_rows, keys, head_dim, tile_prefetch,
                           s + r * kKeyBlock);
    } else {
      tile_scores_of<false>(tile_rows, q + r * ldq, ldq, k_rows, keys, head_dim, tile_prefetch,
                            s + r * kKeyBlock);
    }
  }
}
