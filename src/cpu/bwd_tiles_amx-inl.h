// The avx512_amx backward's tile products: S = Q K^T and dP = dout V^T of bf16 calls on AMX
// tiles. Included by bwd_kernel-inl.h when ANYATTN_BWD_BF16_TILES is defined (bwd_avx512_amx.cc),
// after amx_tiles-inl.h; the other paths include bwd_tiles_none-inl.h, which has the same names.
//
// Design: both products read operands that are bf16 inputs converted exactly to f32 (Q, K, dout,
// V), so on the tiles they cost no accuracy: each product of two bf16 is exact in f32 and the
// sums are f32, as in the f32 micro-kernel (in another order). The other three products of the
// backward take P and dS, which are computed in f32, and stay on the FMA micro-kernel.
//
//   Key side, once per task (BwdScratch): each 64-key block's K rows and V rows, already
//   converted to f32 for the other products, are written back as bf16 pairs (the high half of
//   each f32, exact) into [64 keys][words] staging and transposed into a panel [words][64 keys]:
//   the B operand of the tiles, row w holding dims 2w and 2w + 1 of 16 keys per 64 bytes. The
//   tile of key group g and 32-dim chunk c is read in place (rows 256 bytes apart).
//   Query side, per 64-row query block: the Q and dout rows as bf16 rows (the A operand), zero
//   rows up to a multiple of 16 and zero dims up to a multiple of 32.
//   TDPBF16PS treats subnormal inputs as zero: a key block whose K (V) holds a subnormal, or a
//   query block whose Q (dout) does, computes that product with the f32 micro-kernel instead.
//   Per 64 x 64 tile at D = Dv = 128: 2 x 64 TDPBF16PS replace 2 x 64 x 64 x 128 multiply-adds
//   of the FMA kernel, two of the backward's five products.

constexpr uint8_t kKeySubnormal = 1;
constexpr uint8_t kValueSubnormal = 2;

inline bool tiles_on(const BwdLayout& layout) {
  return layout.bf16_tiles;
}

inline void tiles_begin(const BwdLayout& layout) {
  if (layout.bf16_tiles) configure_tiles();
}

inline void tiles_end(const BwdLayout& layout) {
  if (layout.bf16_tiles) _tile_release();
}

// dst[w] = bf16(src[2w]) | bf16(src[2w + 1]) << 16 for w < words, where src holds n_pad floats
// (a multiple of 16) that are bf16 values exactly, and zeros past them. True if any is subnormal.
inline bool bf16_pairs_of_row(const float* src, int64_t n_pad, int64_t words, uint32_t* dst) {
  // Half t of the result (t < 32) is the high half of float t of first:second, that is element
  // 2t + 1 of the 64 halves the two sources hold.
  alignas(64) static constexpr uint16_t kHighHalves[32] = {
      1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
      33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i high_halves = _mm512_load_si512(kHighHalves);
  __mmask32 subnormal = 0;
  for (int64_t w = 0; w < words; w += 16) {
    const int64_t i = 2 * w;
    const __m512i first = i < n_pad ? _mm512_loadu_si512(src + i) : _mm512_setzero_si512();
    const __m512i second =
        i + 16 < n_pad ? _mm512_loadu_si512(src + i + 16) : _mm512_setzero_si512();
    const __m512i pairs = _mm512_permutex2var_epi16(first, high_halves, second);
    subnormal |= subnormal_lanes(pairs);
    _mm512_storeu_si512(dst + w, pairs);
  }
  return subnormal != 0;
}

// The B-operand panel [words][64] of one 64-key block from its f32 rows (n_pad floats apart).
// True if any value is subnormal.
inline bool pack_key_words(const float* rows, int64_t n_pad, int64_t words, float* staging,
                           uint32_t* panel) {
  bool subnormal = false;
  for (int64_t j = 0; j < kTile; ++j) {
    subnormal |= bf16_pairs_of_row(rows + j * n_pad, n_pad, words,
                                   reinterpret_cast<uint32_t*>(staging + j * words));
  }
  transpose_to_columns(staging, words, reinterpret_cast<float*>(panel));
  return subnormal;
}

// The A operand of `rows` query rows (f32, n_pad apart): bf16 rows of `words` words, then zero
// rows up to a multiple of 16. True if any value is subnormal.
inline bool pack_query_words(const float* src, int64_t rows, int64_t n_pad, int64_t words,
                             uint32_t* dst) {
  bool subnormal = false;
  for (int64_t r = 0; r < rows; ++r) {
    subnormal |= bf16_pairs_of_row(src + r * n_pad, n_pad, words, dst + r * words);
  }
  for (int64_t r = rows; r < (rows + kTileRows - 1) / kTileRows * kTileRows; ++r) {
    for (int64_t w = 0; w < words; w += 16)
      _mm512_storeu_si512(dst + r * words + w, _mm512_setzero_si512());
  }
  return subnormal;
}

// out[r][0 .. 64) = <a_r, b_j> over head_dim dims for the `rows` rows of a (pack_query_words)
// and the 64 keys of panel (pack_key_words); rows up to a multiple of 16 are written too.
inline void tile_products(int64_t head_dim, const uint32_t* a, int64_t rows, const uint32_t* panel,
                          float* out) {
  const KeyTiles keys{reinterpret_cast<const char*>(panel), kTileRows * 4, kTileRows * kTile * 4,
                      kTile * 4};
  score_block_tiles(head_dim, a, rows, keys, out, kTile * 4);
}
