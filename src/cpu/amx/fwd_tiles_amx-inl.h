// bf16 block products on AMX tiles: the avx512_amx path's pack_block and attend.
//
// Included at the end of fwd_kernel-inl.h when ANYATTN_FWD_BF16_TILES is defined
// (fwd_avx512_amx.cc), inside namespace anyattn::cpu::avx512_amx and its target region (AVX-512,
// AVX512_BF16, AMX-TILE, AMX-BF16). Calls the tiles cannot take (f32 and f16 inputs, D < 16,
// rotary, streaming tasks of several kv heads) run the vector products of fwd_kernel-inl.h,
// compiled here as on avx512.
//
// Design (same tasks, key blocks, softmax and output rows as the vector path; only the two products
// and the packed formats differ):
//
//   Tiles (all 16 rows x 64 bytes): 0-3 f32 accumulators (16 x 16), 4-5 left operands (16 rows x 32
//   bf16), 6-7 right operands in the pair-interleaved ("VNNI") order TDPBF16PS reads: row w holds,
//   for each of 16 columns n, the two elements of reduction index 2w and 2w + 1. One TDPBF16PS is
//   16 x 16 x 32 multiply-adds; the products of two bf16 are exact in f32 and are summed in f32.
//   Each pass loads two left and two right tiles for four products (2 x 2 blocking).
//
//   Packed K (the f32 layout's kt region): per group of 16 keys, dp / 2 rows of 16 key pairs, dp =
//   D rounded up to 32 (zeros past D): the tile for dims [32c, 32c + 32) of key group g is 1 KiB,
//   contiguous. Packed V (the f32 layout's V region): per group of 16 output columns, 32 rows of
//   key pairs x 16 columns; the tile for keys [32c, 32c + 32) is 1 KiB, contiguous. Both are half
//   the f32 panels' bytes and fit in them for D >= 16, so the driver's PackedLayout and scratch
//   serve both paths. bf16 is copied bit for bit (no conversion).
//
//   q: the task's rows as bf16, dp per row, unscaled (rounding q * scale to bf16 would lose bits);
//   rows up to the next multiple of 16 are zero. S = Q K^T: per pair of 16-row groups and pair of
//   16-key groups, dp / 32 passes; the softmax multiplies S by softmax_scale in f32 as it reads
//   it (online_softmax_row), so S is read and written once (64 x 64 floats, in L1).
//
//   O += P V: each probability row is split in place into bf16 hi + lo (hi = p truncated to
//   bf16, lo = bf16(p - hi), |p - hi - lo| <= 2^-16 |p|), so P V is as accurate as in f32 (bf16 P
//   alone, as GPU kernels use, would cost 2^-9 of |p| per term). The f32 row of 64 probabilities
//   (256 bytes) becomes [hi: 64 bf16 | lo: 64 bf16], and two left tiles per 32 keys feed the same
//   V tiles (split_row and split_product_tiles, amx_tiles-inl.h, shared with the backward). Calls
//   that allow bf16 probabilities (ANYATTN_PRECISION_FAST) round p to bf16 instead (round_row)
//   and take the hi tiles only: half the P V tile products. O
//   stays in scratch.o as f32: its 16 x 16 pieces are loaded into the accumulators, updated and
//   stored. A packed task gathers the split P of up to kMaxDeferredBlocks key blocks first (their
//   panels stay in place), so each O piece is loaded and stored once per 256 keys rather than per
//   64 (on a causal diagonal block a row group stops at the last key it sees); where a block's
//   softmax moves a row's max, the gathered P of that row is rescaled as O is.
//
//   TDPBF16PS treats subnormal inputs, subnormal accumulators and subnormal results as zero. Blocks
//   whose K or V holds a subnormal (kBlockSubnormal, found while packing), and every block of a
//   task whose q does, take f32 vector products over the same packed formats instead, so
//   subnormals are computed as on the other paths. Otherwise the tiles only see normal bf16 values
//   and probabilities, which are never subnormal (vec_math-inl.h's exp2); what they still flush is
//   a product or sum of normal values that falls below 2^-126, an absolute error under 2^-126.
//   V entries that are NaN or infinite are packed as 0 (kBlockVNonfinite) and their products are
//   added in f32 from the source, for the rows that see them only, before the tiles run: a zero lo
//   part (or a masked key's P = 0) times infinity would be NaN in rows that never see that key, and
//   this way the other rows keep exactly the bits they have without the non-finite value.
//
//   Per 64 x 64 block at D = Dv = 128: 64 TDPBF16PS for S and 128 for P V (hi and lo), against
//   65536 FMA instructions of 16 lanes on the avx512 path; the softmax, unchanged, becomes the
//   larger part of the time. K and V panels (16 KiB each) come from L2; q, S and O pass through L1.

#include "cpu/amx/amx_tiles-inl.h"

// Key blocks whose P V a packed task gathers before one pass over O (see TileProducts).
constexpr int64_t kMaxDeferredBlocks = 4;
// A row of one key block's scores (64 f32) or of its split probabilities (64 bf16 hi, then 64
// bf16 lo): 256 bytes either way.
constexpr int64_t kBlockRowBytes = kKeyBlock * 4;
static_assert(kBlockRowBytes == kSplitRowBytes, "a split P row replaces its f32 row in place");
// Packed V: one 16-column group, 32 rows of key pairs x 16 columns of 32-bit pairs.
constexpr int64_t kVGroupBytes = kKeyBlock / 2 * 64;

// The 32-bit word of packed V that holds keys (2t, 2t + 1) of column 16 g (and the next 15).
inline int64_t v_pair_word(int64_t g, int64_t t) {
  return (g * (kKeyBlock / 2) + t) * kTileRows;
}
// Packed V as the right operand of P V: column groups kVGroupBytes apart, 32-key chunks one
// contiguous 1 KiB tile each.
constexpr RightTiles kPackedVTiles{kVGroupBytes, kTileBytes, 64};

// True when this call's bf16 products run on the tiles.
inline bool uses_tiles(const FwdArgs& args) {
  return args.dtype == DType::kBF16 && args.kv_dtype == DType::kBF16 && args.head_dim >= 16 &&
         args.rotary_cos == nullptr;
}

// dst[0 .. padded) = the n bf16 of src (none when src is null), then zeros.
inline void copy_bf16_row(const uint16_t* src, int64_t n, int64_t padded, uint16_t* dst) {
  for (int64_t i = 0; i < padded; i += 32) {
    const int64_t count = src == nullptr ? 0 : std::max<int64_t>(0, std::min<int64_t>(32, n - i));
    const __m512i values =
        count == 0
            ? _mm512_setzero_si512()
            : _mm512_maskz_loadu_epi16(static_cast<__mmask32>((uint64_t{1} << count) - 1), src + i);
    _mm512_storeu_si512(dst + i, values);
  }
}

// ---------------------------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------------------------

// Lanes (of 32 bf16) that hold a NaN or an infinity: every exponent bit set.
inline __mmask32 nonfinite_lanes(__m512i values) {
  const __m512i exponent_bits = _mm512_set1_epi16(0x7f80);
  return _mm512_cmpeq_epi16_mask(_mm512_and_si512(values, exponent_bits), exponent_bits);
}

// Packs key block `block` of kv head `head_k` into `panel` (the tile formats above) and sets
// *block_flags: kBlockSubnormal if K or V holds a subnormal, kBlockVNonfinite if V holds a NaN or
// infinity (packed as 0). `staging`: 8 * dp floats.
inline void pack_head_tiles(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                            int64_t head_k, int64_t block, float* panel, float* staging,
                            uint8_t* block_flags) {
  const int64_t j0 = block * kKeyBlock;
  const int64_t keys = std::min(kKeyBlock, seq.seqlen_k - j0);
  const int64_t head_dim = args.head_dim;
  const int64_t pair_rows = tile_head_dim(head_dim) / 2;  // 32-bit words per staged key row
  const int64_t k_row_bytes = head_dim * 2;
  __mmask32 subnormal = 0;

  // K: 16 key rows at a time, copied as 32-bit words (pairs of dims), then transposed 16 x 16.
  for (int64_t group = 0; group < kKeyBlock / kTileRows; ++group) {
    for (int64_t n = 0; n < kTileRows; ++n) {
      const int64_t j = group * kTileRows + n;
      uint16_t* staged = reinterpret_cast<uint16_t*>(staging + n * pair_rows);
      prefetch_rows_ahead(args, seq, args.k, args.k_batch_stride, args.k_row_stride,
                          args.k_head_stride, j0 + j, head_k, k_row_bytes);
      const uint16_t* src = nullptr;
      if (j < keys) {
        const int64_t offset = key_row_offset(args, seq, j0 + j, head_k, args.k_batch_stride,
                                              args.k_row_stride, args.k_head_stride);
        src = static_cast<const uint16_t*>(element_address(args.k, args.dtype, offset));
      }
      copy_bf16_row(src, head_dim, 2 * pair_rows, staged);
      for (int64_t i = 0; i < 2 * pair_rows; i += 32) {
        subnormal |= subnormal_lanes(_mm512_loadu_si512(staged + i));
      }
    }
    float* k_group = panel + group * pair_rows * kTileRows;
    for (int64_t w = 0; w < pair_rows; w += kTileRows) {
      transpose_tile(staging + w, pair_rows, k_group + w * kTileRows, kTileRows);
    }
  }

  // V: key pairs (2t, 2t + 1) interleaved column by column, 16 columns per group.
  const int64_t head_dim_v = args.head_dim_v;
  const int64_t column_groups = dv_vectors16(args.head_dim_v);
  uint32_t* v_words = reinterpret_cast<uint32_t*>(panel + layout.kt_floats);
  __mmask32 nonfinite = 0;
  for (int64_t t = 0; t < kKeyBlock / 2; ++t) {
    const uint16_t* rows[2] = {nullptr, nullptr};
    for (int e = 0; e < 2; ++e) {
      const int64_t j = 2 * t + e;
      prefetch_rows_ahead(args, seq, args.v, args.v_batch_stride, args.v_row_stride,
                          args.v_head_stride, j0 + j, head_k, head_dim_v * 2);
      if (j < keys) {
        const int64_t offset = key_row_offset(args, seq, j0 + j, head_k, args.v_batch_stride,
                                              args.v_row_stride, args.v_head_stride);
        rows[e] = static_cast<const uint16_t*>(element_address(args.v, args.dtype, offset));
      }
    }
    for (int64_t g = 0; g < column_groups; ++g) {
      const int64_t c0 = g * 16;
      const int64_t count = std::max<int64_t>(0, std::min<int64_t>(16, head_dim_v - c0));
      const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
      const __m256i even = rows[0] == nullptr ? _mm256_setzero_si256()
                                              : _mm256_maskz_loadu_epi16(mask, rows[0] + c0);
      const __m256i odd = rows[1] == nullptr ? _mm256_setzero_si256()
                                             : _mm256_maskz_loadu_epi16(mask, rows[1] + c0);
      const __m512i pairs = _mm512_or_si512(_mm512_cvtepu16_epi32(even),
                                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(odd), 16));
      const __mmask32 bad = nonfinite_lanes(pairs);
      nonfinite |= bad;
      subnormal |= subnormal_lanes(pairs);
      _mm512_storeu_si512(v_words + v_pair_word(g, t),
                          _mm512_maskz_mov_epi16(static_cast<__mmask32>(~bad), pairs));
    }
  }
  *block_flags = static_cast<uint8_t>((subnormal != 0 ? kBlockSubnormal : 0) |
                                      (nonfinite != 0 ? kBlockVNonfinite : 0));
}

// ---------------------------------------------------------------------------------------------
// S = Q K^T
// ---------------------------------------------------------------------------------------------

// s[r][0 .. 64) = q_r . k_j for the `rows` rows at q (bf16, tile_head_dim(D) per
// row, zero rows up to a multiple of 16) against the packed block kt. Rows of s up to the next
// multiple of 16 are written too (with zeros).
inline void compute_scores_tiles(const FwdArgs& args, const float* q, int64_t rows, const float* kt,
                                 float* s) {
  const int64_t group_bytes = tile_head_dim(args.head_dim) / 2 * 64;
  const KeyTiles k{reinterpret_cast<const char*>(kt), group_bytes, kTileBytes, 64};
  static_assert(kKeyBlock == 4 * kTileRows, "score_block_tiles computes 64 keys");
  score_block_tiles(args.head_dim, q, rows, k, s, kBlockRowBytes);
}

// ---------------------------------------------------------------------------------------------
// O += P V
// ---------------------------------------------------------------------------------------------

// Multiplies one split row (hi | lo, as split_rows writes it with `parts`) by alpha: p = hi + lo
// (exact in f32), p * alpha, split (or rounded) again.
inline void rescale_split_row(void* row, float alpha, int parts) {
  const uint16_t* halves = static_cast<const uint16_t*>(row);
  alignas(64) float values[kKeyBlock];
  const __m512 scale = _mm512_set1_ps(alpha);
  for (int64_t c = 0; c < kKeyBlock; c += 16) {
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves + c));
    const __m256i lo =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves + kKeyBlock + c));
    const __m512 sum =
        _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)),
                      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(lo), 16)));
    _mm512_store_ps(values + c, _mm512_mul_ps(sum, scale));
  }
  if (parts == kRoundedParts) {
    round_row(values, row);
  } else {
    split_row(values, row);
  }
}

// A key block whose split P waits for its P V pass (TileProducts defers them).
struct SplitBlock {
  const char* p;                                     // split rows, 256 bytes apart
  const char* v;                                     // packed V
  int64_t chunks[kMaxQBlockRows / (2 * kTileRows)];  // per pair of row groups
};

// O[rows][0 .. 16 * column_groups) += sum over `count` blocks of P V (rows of O dv_pad floats
// apart; P rows with `parts`): per pair of row groups and pair of column groups, one
// split_product_tiles pass over every block.
inline void accumulate_split_blocks(const SplitBlock* blocks, int64_t count, int64_t rows,
                                    int parts, float* o, int64_t dv_pad, int64_t column_groups) {
  const int64_t row_groups = ceil_div(rows, kTileRows);
  const int64_t o_row_bytes = dv_pad * 4;
  for (int64_t g = 0; g < row_groups; g += 2) {
    const bool two_rows = g + 1 < row_groups;
    for (int64_t cg = 0; cg < column_groups; cg += 2) {
      SplitStep steps[kMaxDeferredBlocks];
      int64_t used = 0;
      for (int64_t b = 0; b < count; ++b) {
        const int64_t chunks = blocks[b].chunks[g / 2];
        if (chunks == 0) continue;
        steps[used++] = {blocks[b].p + g * kTileRows * kBlockRowBytes,
                         blocks[b].v + cg * kVGroupBytes, chunks};
      }
      if (used == 0) continue;
      split_product_pass(two_rows, cg + 1 < column_groups, steps, used, parts, kPackedVTiles,
                         o + g * kTileRows * dv_pad + cg * 16, o_row_bytes);
    }
  }
}

// The 32-key chunks each pair of row groups needs: up to the last key any of its rows may see
// (row_keys, or all `keys` when null).
inline void block_chunks(const int64_t* row_keys, int64_t rows, int64_t keys, int64_t* chunks) {
  for (int64_t g = 0; g < ceil_div(rows, kTileRows); g += 2) {
    const int64_t r0 = g * kTileRows;
    const int64_t group_rows = std::min(rows, r0 + 2 * kTileRows) - r0;
    chunks[g / 2] = ceil_div(tile_keys(row_keys, r0, group_rows, keys), 32);
  }
}

// O[rows][0 .. 16 * column_groups) += P[rows][0 .. keys) V, P split (or rounded: `parts`) in
// place first. row_keys (or null): as in accumulate_pv, per row the key from which its
// probabilities are zero; each pair of row groups stops at the 32-key chunk holding the last key
// either group needs.
inline void accumulate_pv_tiles(float* p, int64_t rows, int parts, const float* v, int64_t keys,
                                float* o, int64_t dv_pad, int64_t column_groups,
                                const int64_t* row_keys) {
  split_rows(p, rows, parts, p);
  SplitBlock block;
  block.p = reinterpret_cast<const char*>(p);
  block.v = reinterpret_cast<const char*>(v);
  block_chunks(row_keys, rows, keys, block.chunks);
  accumulate_split_blocks(&block, 1, rows, parts, o, dv_pad, column_groups);
}

// O += P V in f32 over each row's visible keys only, from the packed tile V (f32 vector products,
// subnormals included): for blocks whose K or V holds a subnormal.
inline void accumulate_pv_exact_tiles(const Mask& mask, const TaskRows& rows, int64_t j0,
                                      const float* p, const float* v, float* o, int64_t dv_pad,
                                      int64_t column_groups) {
  const uint32_t* v_words = reinterpret_cast<const uint32_t*>(v);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t r = 0; r < rows.count; ++r) {
    const KeyRange range = mask.row_keys_in_block(rows.position(r), j0, kKeyBlock);
    for (int64_t j = range.begin; j < range.end; ++j) {
      const Vec p_rj = Vec::broadcast(p[r * kKeyBlock + j]);
      for (int64_t g = 0; g < column_groups; ++g) {
        const __m512i pairs = _mm512_loadu_si512(v_words + v_pair_word(g, j / 2));
        const __m512i bits =
            (j & 1) != 0 ? _mm512_and_si512(pairs, high_half) : _mm512_slli_epi32(pairs, 16);
        float* o_cols = o + r * dv_pad + g * 16;
        fma(p_rj, Vec{_mm512_castsi512_ps(bits)}, Vec::load(o_cols)).store(o_cols);
      }
    }
  }
}

// s[r][0 .. 64) = q_r . k_j in f32 vector products (subnormals included) from the bf16 q rows and
// the packed tile K: for blocks whose K holds a subnormal and tasks whose q does.
inline void compute_scores_exact_tiles(const FwdArgs& args, const float* q, int64_t rows,
                                       const float* kt, float* s) {
  const int64_t pair_rows = tile_head_dim(args.head_dim) / 2;
  const uint16_t* q_bf16 = reinterpret_cast<const uint16_t*>(q);
  const uint32_t* k_words = reinterpret_cast<const uint32_t*>(kt);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* q_row = q_bf16 + r * 2 * pair_rows;
    for (int64_t group = 0; group < kKeyBlock / kTileRows; ++group) {
      const uint32_t* k_group = k_words + group * pair_rows * kTileRows;
      Vec sum = Vec::zero();
      for (int64_t w = 0; w < pair_rows; ++w) {
        const __m512i pairs = _mm512_loadu_si512(k_group + w * kTileRows);
        const Vec even{_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16))};
        const Vec odd{_mm512_castsi512_ps(_mm512_and_si512(pairs, high_half))};
        sum = fma(Vec::broadcast(bf16_to_f32(q_row[2 * w])), even, sum);
        sum = fma(Vec::broadcast(bf16_to_f32(q_row[2 * w + 1])), odd, sum);
      }
      sum.store(s + r * kKeyBlock + group * kTileRows);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The products, for attend_blocks
// ---------------------------------------------------------------------------------------------

// The tile products for attend_blocks, one object per task. In packed tasks, whose K/V panels stay
// in place until the task ends, the P V of up to kMaxDeferredBlocks key blocks is gathered (split P
// kept here) and run in one pass over O, so each O tile is loaded and stored once per gathered run
// instead of once per block. When a block's softmax moves a row's max (it rescales that row of O),
// the gathered P rows are rescaled alike; blocks that need f32 products run the gathered ones
// first.
class TileProducts {
 public:
  // The task's rows as bf16 (tile_head_dim(D) each, zero past D), then zero rows up to a multiple
  // of 16; notes whether q holds a subnormal.
  void load_queries(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                    const TaskRows& rows, const Scratch& scratch) {
    const int64_t dp = tile_head_dim(args.head_dim);
    uint16_t* q = reinterpret_cast<uint16_t*>(scratch.q);
    __mmask32 subnormal = 0;
    for (int64_t r = 0; r < round_up(rows.count, kTileRows); ++r) {
      const uint16_t* src = nullptr;
      if (r < rows.count) {
        const int64_t offset = task.seq.q_offset + rows.position(r) * args.q_row_stride +
                               rows.head(r) * args.q_head_stride;
        src = static_cast<const uint16_t*>(element_address(args.q, args.dtype, offset));
      }
      copy_bf16_row(src, args.head_dim, dp, q + r * dp);
      for (int64_t i = 0; i < dp; i += 32) {
        subnormal |= subnormal_lanes(_mm512_loadu_si512(q + r * dp + i));
      }
    }
    q_subnormal_ = subnormal != 0;
    parts_ = args.bf16_probabilities ? kRoundedParts : kSplitParts;
    defer_ = task.packed != nullptr;
    rows_ = rows.count;
    m_ = scratch.m;
    o_ = scratch.o;
    dv_pad_ = layout.dv_pad;
    column_groups_ = dv_vectors16(args.head_dim_v);
  }
  static void pack(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                   int64_t head_k, int64_t heads_k, int64_t block, float* panels, float* staging,
                   uint8_t* block_flags) {
    for (int64_t h = 0; h < heads_k; ++h) {
      pack_head_tiles(args, layout, seq, head_k + h, block, panels + h * layout.block_floats,
                      staging, block_flags + h);
    }
  }
  // S (raw q . k) for `rows` rows against the whole block (the tiles score all 64 keys, `keys` or
  // not); rows of s up to a multiple of 16 are written too. Notes the rows' maxima, which the
  // softmax that follows may move.
  void scores(const FwdArgs& args, const PackedLayout& /*layout*/, const float* q, int64_t rows,
              const float* kt, int64_t /*keys*/, uint8_t block_flags, float* s,
              const float* /*next_panel*/) {
    for (int64_t r = 0; r < rows_; ++r) max_before_[r] = m_[r];
    if (q_subnormal_ || (block_flags & kBlockSubnormal) != 0) {
      compute_scores_exact_tiles(args, q, rows, kt, s);
    } else {
      compute_scores_tiles(args, q, rows, kt, s);
    }
  }
  // O += P V for the rows of one kv head and the block at j0, now or gathered; P is overwritten.
  // From the first block with a subnormal on, the task's O may hold subnormals, which the tiles
  // would flush: the rest of its blocks take the f32 products.
  void pv(const FwdArgs& args, const SeqInfo& seq, const Mask& mask, const TaskRows& head_rows,
          int64_t j0, int64_t keys, bool crosses_boundary, uint8_t block_flags, float* p,
          const float* v, float* o, int64_t dv_pad) {
    rescale_gathered();
    int64_t row_keys[kMaxQBlockRows];
    if (crosses_boundary) boundary_row_keys(mask, head_rows, j0, row_keys);
    if (block_flags == 0 && !exact_pv_ && defer_) {
      SplitBlock& block = gathered_[gathered_count_];
      split_rows(p, head_rows.count, parts_, gathered_p_[gathered_count_]);
      block.p = reinterpret_cast<const char*>(gathered_p_[gathered_count_]);
      block.v = reinterpret_cast<const char*>(v);
      block_chunks(crosses_boundary ? row_keys : nullptr, head_rows.count, keys, block.chunks);
      if (++gathered_count_ == kMaxDeferredBlocks) finish();
      return;
    }
    finish();
    if ((block_flags & kBlockVNonfinite) != 0) {
      add_nonfinite_values(args, seq, mask, head_rows, j0, keys, p, o, dv_pad);
    }
    if ((block_flags & kBlockSubnormal) != 0) exact_pv_ = true;
    if (exact_pv_) {
      accumulate_pv_exact_tiles(mask, head_rows, j0, p, v, o, dv_pad, column_groups_);
    } else {
      accumulate_pv_tiles(p, head_rows.count, parts_, v, keys, o, dv_pad, column_groups_,
                          crosses_boundary ? row_keys : nullptr);
    }
  }
  // Runs the gathered P V; attend_blocks calls it before the task's rows are written.
  void finish() {
    if (gathered_count_ == 0) return;
    accumulate_split_blocks(gathered_, gathered_count_, rows_, parts_, o_, dv_pad_,
                            column_groups_);
    gathered_count_ = 0;
  }

 private:
  // The softmax of the block just scored rescaled O's row r by exp(old max - new max) where the
  // max moved (online_softmax_row): the gathered probabilities of row r, relative to the old max,
  // take the same factor.
  void rescale_gathered() {
    if (gathered_count_ == 0) return;
    for (int64_t r = 0; r < rows_; ++r) {
      if (m_[r] == max_before_[r]) continue;
      const float alpha = std::exp(max_before_[r] - m_[r]);
      for (int64_t b = 0; b < gathered_count_; ++b) {
        rescale_split_row(gathered_p_[b] + r * kKeyBlock * 2, alpha, parts_);
      }
    }
  }

  bool q_subnormal_ = false;
  int parts_ = kSplitParts;  // of P's split rows (kRoundedParts: bf16 probabilities allowed)
  bool exact_pv_ = false;
  bool defer_ = false;
  int64_t rows_ = 0;
  const float* m_ = nullptr;
  float* o_ = nullptr;
  int64_t dv_pad_ = 0;
  int64_t column_groups_ = 0;  // 16-column groups of Dv (dv_vectors16)
  float max_before_[kMaxQBlockRows];
  int64_t gathered_count_ = 0;
  SplitBlock gathered_[kMaxDeferredBlocks];
  alignas(64) uint16_t gathered_p_[kMaxDeferredBlocks][kMaxQBlockRows * kKeyBlock * 2];
};

// `staging` holds kLanes * round_up(D, 16) floats: pack_head_tiles' 8 * tile_head_dim(D) fit too.
void pack_block(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq, int64_t head_k,
                int64_t block, float* dst, uint8_t* block_flags, float* staging) {
  if (uses_tiles(args)) {
    pack_head_tiles(args, layout, seq, head_k, block, dst, staging, block_flags);
  } else {
    pack_block_heads(args, layout, seq, head_k, 1, block, dst, staging, block_flags);
  }
}

void attend(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
            const Scratch& scratch) {
  // Streaming tasks of several kv heads keep their rows back to back, not in 16-row groups.
  if (!uses_tiles(args) || (task.packed == nullptr && task.heads_k != 1)) {
    attend_blocks<VectorProducts>(args, layout, task, scratch);
    return;
  }
  configure_tiles();
  attend_blocks<TileProducts>(args, layout, task, scratch);
  _tile_release();
}
