// S and dP of bf16 calls on pairwise dot products (BFDOT on the neon path, VDPBF16PS on the avx512
// path) and, on the neon path, of f16 calls on FMLAL (forward/fwd_narrow_scores.h): the path's
// bwd_task. Included at the end of bwd_kernel-inl.h when ANYATTN_BWD_NARROW_SCORES is defined (the
// path's traits, with ANYATTN_NARROW_BF16_KERNELS and ANYATTN_NARROW_F16 as for the forward),
// inside namespace anyattn::cpu::bwd_<id>. Calls that take them are those the forward scores the
// same way (narrow_scores_of); the driver then gives the scratch the 16-bit rows
// (BwdLayout::rows16).
//
// Design. S = Q K^T and dP = dout V^T read inputs that are bf16 (or f16) values converted exactly
// to f32, so they run on the forward's 16-bit score kernels from 16-bit copies:
//   key side, once per key block while the chunk is packed: K and V in the pairs (bf16) or f16
//     format, written over the block's f32 panels kt and vt, which nothing but S and dP reads;
//   query side, once per query block: the Q and dout rows' 16-bit values (q16, dout16).
// S is then the forward's bits: the same kernel on the same values, with the same f32 fallback
// (exact_pair_scores) for the bf16 rows the dot products would get wrong, decided row by row from
// the row's own values. So P = exp(s - lse) is the probability the forward normalised, as on the
// other paths. dP takes the same kernels and fallback (dout rows tested as q rows are); a key block
// whose bf16 V holds a subnormal, which the dot products would flush, takes the fallback for all
// its rows (noted in the word after its 16-bit panel, space the f32 panel leaves free). f16 S and
// dP are the FMA micro-kernel's bits. The other three products take P Z and dX, f32 results, and
// stay on the FMA micro-kernel (VectorProducts): in 16-bit instructions they would need hi + lo
// parts, two products where one FMA does the same work.
//
// bf16 calls that allow bf16 probabilities (FwdArgs::bf16_probabilities; takes_bf16_pairs) take
// those three on the dot products too, with P Z and dX rounded to bf16 (to nearest even), as
// flash-attn's GPU backward does (docs/backward.md). Each is the forward's P V kernel
// (block_pv: C[m][0, n) += sum_t A[m][2t, 2t + 1] . B[t][0, n), A rounded in f32 rows of 64,
// B in row pairs), from copies packed once:
//   dQ [rows][d]  += dX K          A = dX as it is          B = K in key pairs (k_pairs, per key
//                                                            block while the chunk is packed)
//   dK [keys][d]  += dX^T Q        A = dX transposed         B = Q in row pairs (q_pairs)
//   dV [keys][dv] += (P Z)^T dout  A = P Z transposed        B = dout in row pairs (dout_pairs)
// The transposes (staging, 16 KiB) cost 2 x 64 x 64 moves per tile against 3 x 64 x 64 x 128
// multiply-adds at D = Dv = 128; the query side's pairs are packed once per query block. The dot
// products flush subnormals: a key block whose K holds one (key_flags) takes dQ on the FMA
// micro-kernel, and a query block whose Q (dout) does, dK (dV). P Z is never subnormal (exp2
// gives 0 or a normal number); a subnormal dX, or a product or sum below 2^-126, is flushed: an
// absolute error under 2^-126 per term.

namespace narrow_bf16 = ::anyattn::cpu::ANYATTN_NARROW_BF16_KERNELS;

// Whether a call's dV, dK and dQ run on the bf16 dot products (BwdCopies::bf16_pairs): a bf16
// call with S and dP on them (format kBf16Pairs) that allows bf16 probabilities.
inline bool takes_bf16_pairs(const FwdArgs& f, NarrowScores format) {
#if defined(ANYATTN_NARROW_BF16_PV)
  return f.bf16_probabilities && format == NarrowScores::kBf16Pairs;
#else
  (void)f;
  (void)format;
  return false;
#endif
}

class NarrowProducts {
 public:
  NarrowProducts(const FwdArgs& f, const BwdLayout& layout, const BwdScratch& s)
      : vector_(f, layout, s),
        s_(s),
        format_(narrow_scores_of(f)),
        pairs_(layout.bf16_pairs),
        head_dim_(f.head_dim),
        head_dim_v_(f.head_dim_v),
        d_pad_(layout.d_pad),
        dv_pad_(layout.dv_pad) {}

  // After key block kb's K rows (s.k) and V rows (s.rows) are loaded and its f32 panels packed:
  // the 16-bit panels over them, and with pairs K in key pairs (the block's rows past its keys
  // are zero).
  void pack_key_block(int64_t kb) {
    const float* k_rows = s_.k + kb * kTile * d_pad_;
    pack_panel(k_rows, d_pad_, head_dim_, s_.kt + kb * d_pad_ * kTile);
    const bool subnormal = pack_panel(s_.rows, dv_pad_, head_dim_v_, s_.vt + kb * dv_pad_ * kTile);
    const uint32_t flag = subnormal ? 1u : 0u;
    std::memcpy(s_.vt + kb * dv_pad_ * kTile + panel_floats(head_dim_v_), &flag, sizeof(flag));
    if (pairs_) {
      s_.key_flags[kb] =
          pack_row_pairs(k_rows, kTile, d_pad_, kTile / 2, s_.k_pairs + kb * kTile / 2 * d_pad_)
              ? 1
              : 0;
    }
  }
  // After a query block's Q and dout rows are loaded: their 16-bit copies, and with pairs Q and
  // dout in row pairs (a last odd row paired with zeros).
  void pack_query_block(int64_t rows) {
    narrow_rows(s_.q, d_pad_, rows, s_.q16, q_unfit_);
    narrow_rows(s_.dout, dv_pad_, rows, s_.dout16, dout_unfit_);
    if (pairs_) {
      q_subnormal_ = pack_row_pairs(s_.q, rows, d_pad_, (rows + 1) / 2, s_.q_pairs);
      dout_subnormal_ = pack_row_pairs(s_.dout, rows, dv_pad_, (rows + 1) / 2, s_.dout_pairs);
    }
  }
  // S = Q K^T.
  void scores(int64_t kb, int64_t rows) const {
    block_products(s_.q16, d_pad_, rows, s_.kt + kb * d_pad_ * kTile, head_dim_, q_unfit_, false,
                   s_.s);
  }
  // dP = dout V^T.
  void value_scores(int64_t kb, int64_t rows) const {
    const float* panel = s_.vt + kb * dv_pad_ * kTile;
    uint32_t subnormal;
    std::memcpy(&subnormal, panel + panel_floats(head_dim_v_), sizeof(subnormal));
    block_products(s_.dout16, dv_pad_, rows, panel, head_dim_v_, dout_unfit_, subnormal != 0,
                   s_.dp);
  }
  // dV += (P Z)^T dout.
  void add_dv(int64_t kb, int64_t rows, int64_t keys) const {
    if (!pairs_ || dout_subnormal_) {
      vector_.add_dv(kb, rows, keys);
      return;
    }
    transposed_pair_products(s_.s, rows, keys, s_.dout_pairs, dv_pad_,
                             s_.dv + kb * kTile * dv_pad_);
  }
  // dK += dX^T Q.
  void add_dk(int64_t kb, int64_t rows, int64_t keys) const {
    if (!pairs_ || q_subnormal_) {
      vector_.add_dk(kb, rows, keys);
      return;
    }
    transposed_pair_products(s_.dp, rows, keys, s_.q_pairs, d_pad_, s_.dk + kb * kTile * d_pad_);
  }
  // dQ += dX K. A block of fewer than 64 keys ends the sequence, so tile_gradients zeroed dX past
  // them (the column a last odd key's pair reads), and K's rows past them are zero.
  void add_dq(int64_t kb, int64_t rows, int64_t keys) const {
    if (!pairs_ || s_.key_flags[kb] != 0) {
      vector_.add_dq(kb, rows, keys);
      return;
    }
    narrow_bf16::block_pv(s_.dp, rows, s_.k_pairs + kb * kTile / 2 * d_pad_, nullptr, keys,
                          nullptr, s_.dq, d_pad_, d_pad_);
  }

 private:
  // c[j][0, cols) += sum_r bf16(tile[r][j]) b[r][0, cols) for the tile's keys j < `keys`, over its
  // query rows r < `rows` (tile: P Z or dX, [64][64] f32; b: the rows in pairs, cols words each;
  // c: f32 rows cols apart). The tile's rows from `rows` to the next multiple of the vector are
  // zeroed first, so that a last odd row's pair reads a zero.
  void transposed_pair_products(float* tile, int64_t rows, int64_t keys, const uint32_t* b,
                                int64_t cols, float* c) const {
    const int64_t rows_padded = (rows + kLanes - 1) / kLanes * kLanes;
    zero_floats(tile + rows * kTile, (rows_padded - rows) * kTile);
    transpose_to_columns(tile, kTile, s_.staging, rows_padded);
    narrow_bf16::block_pv(s_.staging, keys, b, nullptr, rows, nullptr, c, cols, cols);
  }

  // The 16-bit bits of a float that holds a bf16 (its high half) or an f16 value exactly.
  uint16_t narrow(float x) const {
    if (format_ == NarrowScores::kF16) return f32_to_f16(x);
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return static_cast<uint16_t>(bits >> 16);
  }

  // Floats of a 16-bit panel n elements deep: round_up(n, 8) * 64 16-bit values, at most half
  // of the f32 panel it replaces (n_pad * 64 floats, n_pad >= round_up(n, 8)).
  static int64_t panel_floats(int64_t n) { return narrow_depth(n) * kTile / 2; }

  // The 16-bit panel (pairs or f16, round_up(n, 8) elements deep) of one 64-key block from its
  // f32 rows (n_pad floats apart, zero past n and in the rows past the block's keys), written
  // over `panel` a panel row at a time with memcpy (the panel's f32 values were stored as
  // floats). True when a bf16 value is subnormal.
  bool pack_panel(const float* rows, int64_t n_pad, int64_t n, float* panel) const {
    const int64_t depth = narrow_depth(n);
    char* out = reinterpret_cast<char*>(panel);
    if (format_ == NarrowScores::kF16) {
      uint16_t line[kTile];
      for (int64_t d = 0; d < depth; ++d) {
        for (int64_t j = 0; j < kTile; ++j) line[j] = narrow(rows[j * n_pad + d]);
        std::memcpy(out + d * sizeof(line), line, sizeof(line));
      }
      return false;
    }
    uint32_t line[kTile];
    uint32_t subnormal = 0;
    for (int64_t w = 0; w < depth / 2; ++w) {
      for (int64_t j = 0; j < kTile; ++j) {
        const uint16_t even = narrow(rows[j * n_pad + 2 * w]);
        const uint16_t odd = narrow(rows[j * n_pad + 2 * w + 1]);
        // Exponent bits 0 and mantissa bits not: a subnormal.
        subnormal |= ((even & 0x7F80u) == 0 && (even & 0x7Fu) != 0) |
                     ((odd & 0x7F80u) == 0 && (odd & 0x7Fu) != 0);
        line[j] = even | static_cast<uint32_t>(odd) << 16;
      }
      std::memcpy(out + w * sizeof(line), line, sizeof(line));
    }
    return subnormal != 0;
  }

  // dst[r][0 .. n_pad) = the 16-bit values of rows [0, rows) of src (n_pad floats each, zero past
  // the head dim); unfit[r]: a bf16 row with an element the dot products would get wrong. The
  // bf16 loop has no branch and no call, so that it vectorises.
  void narrow_rows(const float* src, int64_t n_pad, int64_t rows, uint16_t* dst,
                   bool* unfit) const {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = src + r * n_pad;
      uint16_t* out = dst + r * n_pad;
      if (format_ == NarrowScores::kF16) {
        for (int64_t c = 0; c < n_pad; ++c) out[c] = f32_to_f16(row[c]);
        unfit[r] = false;
        continue;
      }
      uint16_t flagged = 0;
      for (int64_t c = 0; c < n_pad; ++c) {
        uint32_t word;
        std::memcpy(&word, row + c, sizeof(word));
        const uint16_t bits = static_cast<uint16_t>(word >> 16);
        out[c] = bits;
        flagged |= static_cast<uint16_t>(bf16_query_unfit_for_dot(bits));
      }
      unfit[r] = flagged != 0;
    }
  }

  // out[r][j] = a_r . b_j for `rows` rows of `a` (16-bit, lda apart) and the 64 keys of the
  // 16-bit panel at `panel` (n elements deep); bf16 rows that are unfit (or all rows, with
  // all_unfit) in f32 from the same panel.
  void block_products(const uint16_t* a, int64_t lda, int64_t rows, const float* panel, int64_t n,
                      const bool* unfit, bool all_unfit, float* out) const {
    const int64_t depth = narrow_depth(n);
    const NextPanelLines none{nullptr, 0, nullptr, 0};
#if defined(ANYATTN_NARROW_F16)
    if (format_ == NarrowScores::kF16) {
      neon_f16::block_scores(a, lda, rows, reinterpret_cast<const uint16_t*>(panel), depth, kTile,
                             none, out);
      return;
    }
#endif
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(panel);
    narrow_bf16::block_scores(a, lda, rows, pairs, depth, kTile, none, out);
    for (int64_t r = 0; r < rows; ++r) {
      if (all_unfit || unfit[r]) {
        narrow_bf16::exact_pair_scores(a + r * lda, pairs, depth / 2, kTile, out + r * kTile);
      }
    }
  }

  VectorProducts vector_;
  const BwdScratch& s_;
  NarrowScores format_;
  bool pairs_;  // dV, dK and dQ on the dot products (BwdCopies::bf16_pairs)
  int64_t head_dim_, head_dim_v_, d_pad_, dv_pad_;
  bool q_unfit_[kTile] = {};
  bool dout_unfit_[kTile] = {};
  bool q_subnormal_ = true;
  bool dout_subnormal_ = true;
};

void bwd_task(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task, const float* delta,
              double* sink_terms, float* scratch) {
  // The layout has the 16-bit rows only when the driver found the call takes the kernels; the
  // format is asked again in case a test switched them off in between.
  if (layout.rows16 && narrow_scores_of(args.fwd) != NarrowScores::kNone) {
    bwd_blocks<NarrowProducts>(args, layout, task, delta, sink_terms, scratch);
  } else {
    bwd_blocks<VectorProducts>(args, layout, task, delta, sink_terms, scratch);
  }
}
