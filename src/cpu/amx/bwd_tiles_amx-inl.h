// The avx512_amx backward's tile products: all five products of bf16 calls on AMX tiles, as the
// TileProducts policy of bwd_blocks, and that path's bwd_task. Included at the end of
// bwd_kernel-inl.h when ANYATTN_BWD_BF16_TILES is defined (bwd_avx512_amx.cc, which includes
// amx_tiles-inl.h first); the other paths define bwd_task on VectorProducts there instead.
//
// Design. S = Q K^T and dP = dout V^T read operands that are bf16 inputs converted exactly to f32
// (Q, K, dout, V), so on the tiles they cost no accuracy: each product of two bf16 is exact in
// f32 and the sums are f32, as in the f32 micro-kernel (in another order). dV += (P Z)^T dout,
// dK += dX^T Q and dQ += dX K take P Z and dX, computed in f32: their left operand is split into
// bf16 hi + lo (amx_tiles-inl.h), |a - hi - lo| <= 2^-16 |a|, and both parts meet the same right
// tiles, so these products too keep f32 accuracy, for twice the tile products. Calls that allow
// bf16 probabilities (FwdArgs::bf16_probabilities) round P Z and dX to bf16 instead (round_row)
// and take the one product, as flash-attn's GPU backward does (docs/backward.md).
//
//   Key side, once per task (BwdScratch), from each 64-key block's f32 rows:
//     k_words / v_words [words][64 keys]: K and V rows as bf16 pairs of dims (the high half of
//       each f32, exact), transposed: the right operand of S and dP (row w holds dims 2w and
//       2w + 1 of 16 keys per 64 bytes; rows 256 bytes apart).
//     k_pairs [32 key pairs][d_pad]: word (t, n) holds dim n of keys 2t and 2t + 1: the right
//       operand of dQ (rows d_pad words apart; 16 pair rows per 32-key chunk).
//   Query side, per 64-row query block:
//     q_words / dout_words: Q and dout rows as bf16 (the left operand of S and dP), zero rows up
//       to a multiple of 16 and zero dims up to a multiple of 32.
//     q_pairs / dout_pairs [32 row pairs][d_pad or dv_pad]: rows 2t and 2t + 1 interleaved, zero
//       rows up to a multiple of 32: the right operands of dK and dV.
//   Per tile: P Z and dX ([rows][64] f32, rows up to a multiple of 32 zeroed first) are
//   transposed into staging and split ([64 keys][hi: 64 rows | lo: 64 rows]): the left operands
//   of dV and dK; dX is then split in place ([rows][hi: 64 keys | lo: 64 keys]) for dQ. dK, dV
//   (the task's accumulators) and dQ (the block's) stay f32 in scratch: 16 x 16 pieces are loaded
//   into the tile accumulators, updated and stored, two by two.
//
//   TDPBF16PS treats subnormal inputs, accumulators and results as zero. A key block whose K (V)
//   holds a subnormal computes S and dQ (dP) with the f32 micro-kernel, and a query block whose
//   Q (dout) does, S and dK (dP and dV). The split parts of P Z and dX and the f32 accumulators
//   can still be flushed when below 2^-126: an absolute error under 2^-126 per term.
//
//   Per 64 x 64 tile at D = Dv = 128: 2 x 64 TDPBF16PS for S and dP and 3 x 128 for dV, dK, dQ
//   (hi and lo) replace 5 x 64 x 64 x 128 multiply-adds of the FMA kernel; what stays on the
//   vector units is the elementwise step, the transposes and the splits.

constexpr uint8_t kKeySubnormal = 1;
constexpr uint8_t kValueSubnormal = 2;

// dst[w] = bf16(src[2w]) | bf16(src[2w + 1]) << 16 for w < words, where src holds n_pad floats
// (a multiple of 16) that are bf16 values exactly, and zeros past them. True if any is subnormal.
inline bool bf16_pairs_of_row(const float* src, int64_t n_pad, int64_t words, uint32_t* dst) {
  __mmask32 subnormal = 0;
  for (int64_t w = 0; w < words; w += 16) {
    const int64_t i = 2 * w;
    const __m512i first = i < n_pad ? _mm512_loadu_si512(src + i) : _mm512_setzero_si512();
    const __m512i second =
        i + 16 < n_pad ? _mm512_loadu_si512(src + i + 16) : _mm512_setzero_si512();
    const __m512i pairs = high_halves(first, second);
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

// The left operand of dV or dK from a tile's [rows][64] f32 values (P Z or dX; rows from `rows`
// up to a multiple of 32 are zeroed in place): dst[j] = the split row of column j, [hi: 64 rows |
// lo: 64 rows] (parts = kSplitParts) or rounded (kRoundedParts), kSplitRowBytes apart.
inline void split_transposed(float* tile, int64_t rows, int parts, float* dst) {
  zero_floats(tile + rows * kTile, ((rows + 31) / 32 * 32 - rows) * kTile);
  transpose_to_columns(tile, kTile, dst);
  split_rows(dst, kTile, parts, dst);
}

// c[16 row_groups][cols] += A B over `chunks` 32-deep chunks: A split rows (kSplitRowBytes apart,
// `parts` of each read), B pair rows of `cols` words (pack_row_pairs), c f32 rows `cols` floats
// apart; cols a multiple of 16.
inline void split_products(const void* a, int64_t row_groups, const uint32_t* b, int64_t cols,
                           int64_t chunks, int parts, float* c) {
  const RightTiles right{64, kTileRows * cols * 4, cols * 4};
  const int64_t column_groups = cols / 16;
  const char* a_bytes = static_cast<const char*>(a);
  const char* b_bytes = reinterpret_cast<const char*>(b);
  for (int64_t g = 0; g < row_groups; g += 2) {
    for (int64_t cg = 0; cg < column_groups; cg += 2) {
      const SplitStep step{a_bytes + g * kTileRows * kSplitRowBytes, b_bytes + cg * 64, chunks};
      split_product_pass(g + 1 < row_groups, cg + 1 < column_groups, &step, 1, parts, right,
                         c + g * kTileRows * cols + cg * 16, cols * 4);
    }
  }
}

// The five products on AMX tiles, for bwd_blocks (one object per task; the interface is
// VectorProducts'). Besides the f32 operands every path packs, the task packs bf16 copies in the
// tiles' formats (BwdScratch's word and pair buffers) and notes where a subnormal would be
// flushed: each product whose operands hold one runs on VectorProducts instead.
class TileProducts {
 public:
  TileProducts(const FwdArgs& f, const BwdLayout& layout, const BwdScratch& s)
      : vector_(f, layout, s),
        s_(s),
        head_dim_(f.head_dim),
        head_dim_v_(f.head_dim_v),
        d_pad_(layout.d_pad),
        dv_pad_(layout.dv_pad),
        d_words_(layout.d_words()),
        dv_words_(layout.dv_words()),
        parts_(f.bf16_probabilities ? kRoundedParts : kSplitParts) {}

  // K and V of key block kb as the right operands of S and dP (from s.k and s.rows), K as the
  // right operand of dQ, and the block's subnormal flags.
  void pack_key_block(int64_t kb) {
    const bool k_subnormal = pack_key_words(s_.k + kb * kTile * d_pad_, d_pad_, d_words_,
                                            s_.staging, s_.k_words + kb * d_words_ * kTile);
    const bool v_subnormal =
        pack_key_words(s_.rows, dv_pad_, dv_words_, s_.staging, s_.v_words + kb * dv_words_ * kTile);
    s_.key_flags[kb] = static_cast<uint8_t>((k_subnormal ? kKeySubnormal : 0) |
                                            (v_subnormal ? kValueSubnormal : 0));
    pack_row_pairs(s_.k + kb * kTile * d_pad_, kTile, d_pad_, kTile / 2,
                   s_.k_pairs + kb * kTile / 2 * d_pad_);
  }
  // Q and dout of the query block as the left operands of S and dP and the right operands of dK
  // and dV; notes whether either holds a subnormal.
  void pack_query_block(int64_t rows) {
    const int64_t row_chunks = (rows + 31) / 32;
    q_subnormal_ = pack_query_words(s_.q, rows, d_pad_, d_words_, s_.q_words);
    dout_subnormal_ = pack_query_words(s_.dout, rows, dv_pad_, dv_words_, s_.dout_words);
    pack_row_pairs(s_.q, rows, d_pad_, row_chunks * 16, s_.q_pairs);
    pack_row_pairs(s_.dout, rows, dv_pad_, row_chunks * 16, s_.dout_pairs);
  }
  void scores(int64_t kb, int64_t rows) const {
    if (!q_subnormal_ && (s_.key_flags[kb] & kKeySubnormal) == 0) {
      tile_products(head_dim_, s_.q_words, rows, s_.k_words + kb * d_words_ * kTile, s_.s);
    } else {
      vector_.scores(kb, rows);
    }
  }
  void value_scores(int64_t kb, int64_t rows) const {
    if (!dout_subnormal_ && (s_.key_flags[kb] & kValueSubnormal) == 0) {
      tile_products(head_dim_v_, s_.dout_words, rows, s_.v_words + kb * dv_words_ * kTile, s_.dp);
    } else {
      vector_.value_scores(kb, rows);
    }
  }
  // P Z split and transposed into staging: the left operand, dout pairs the right.
  void add_dv(int64_t kb, int64_t rows, int64_t keys) const {
    if (!dout_subnormal_) {
      split_transposed(s_.s, rows, parts_, s_.staging);
      split_products(s_.staging, (keys + 15) / 16, s_.dout_pairs, dv_pad_, (rows + 31) / 32,
                     parts_, s_.dv + kb * kTile * dv_pad_);
    } else {
      vector_.add_dv(kb, rows, keys);
    }
  }
  // dX split and transposed into staging: the left operand, Q pairs the right.
  void add_dk(int64_t kb, int64_t rows, int64_t keys) const {
    if (!q_subnormal_) {
      split_transposed(s_.dp, rows, parts_, s_.staging);
      split_products(s_.staging, (keys + 15) / 16, s_.q_pairs, d_pad_, (rows + 31) / 32, parts_,
                     s_.dk + kb * kTile * d_pad_);
    } else {
      vector_.add_dk(kb, rows, keys);
    }
  }
  // dX split in place (its rows become hi | lo): the left operand, K pairs the right.
  void add_dq(int64_t kb, int64_t rows, int64_t keys) const {
    if ((s_.key_flags[kb] & kKeySubnormal) == 0) {
      split_rows(s_.dp, rows, parts_, s_.dp);
      split_products(s_.dp, (rows + 15) / 16, s_.k_pairs + kb * kTile / 2 * d_pad_, d_pad_,
                     (keys + 31) / 32, parts_, s_.dq);
    } else {
      vector_.add_dq(kb, rows, keys);
    }
  }

 private:
  VectorProducts vector_;
  const BwdScratch& s_;
  int64_t head_dim_, head_dim_v_, d_pad_, dv_pad_, d_words_, dv_words_;
  int parts_;  // of the split rows of P Z and dX (kRoundedParts: bf16 probabilities allowed)
  bool q_subnormal_ = true;
  bool dout_subnormal_ = true;
};

void bwd_task(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task, const float* delta,
              double* sink_terms, float* scratch) {
  if (!layout.bf16_tiles) {
    bwd_blocks<VectorProducts>(args, layout, task, delta, sink_terms, scratch);
    return;
  }
  configure_tiles();
  bwd_blocks<TileProducts>(args, layout, task, delta, sink_terms, scratch);
  _tile_release();
}
