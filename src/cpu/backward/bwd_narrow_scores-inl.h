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

namespace narrow_bf16 = ::anyattn::cpu::ANYATTN_NARROW_BF16_KERNELS;

class NarrowProducts {
 public:
  NarrowProducts(const FwdArgs& f, const BwdLayout& layout, const BwdScratch& s)
      : vector_(f, layout, s),
        s_(s),
        format_(narrow_scores_of(f)),
        head_dim_(f.head_dim),
        head_dim_v_(f.head_dim_v),
        d_pad_(layout.d_pad),
        dv_pad_(layout.dv_pad) {}

  // After key block kb's K rows (s.k) and V rows (s.rows) are loaded and its f32 panels packed:
  // the 16-bit panels over them.
  void pack_key_block(int64_t kb) {
    pack_panel(s_.k + kb * kTile * d_pad_, d_pad_, head_dim_, s_.kt + kb * d_pad_ * kTile);
    const bool subnormal = pack_panel(s_.rows, dv_pad_, head_dim_v_, s_.vt + kb * dv_pad_ * kTile);
    const uint32_t flag = subnormal ? 1u : 0u;
    std::memcpy(s_.vt + kb * dv_pad_ * kTile + panel_floats(head_dim_v_), &flag, sizeof(flag));
  }
  // After a query block's Q and dout rows are loaded: their 16-bit copies.
  void pack_query_block(int64_t rows) {
    narrow_rows(s_.q, d_pad_, rows, s_.q16, q_unfit_);
    narrow_rows(s_.dout, dv_pad_, rows, s_.dout16, dout_unfit_);
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
  void add_dv(int64_t kb, int64_t rows, int64_t keys) const { vector_.add_dv(kb, rows, keys); }
  void add_dk(int64_t kb, int64_t rows, int64_t keys) const { vector_.add_dk(kb, rows, keys); }
  void add_dq(int64_t kb, int64_t rows, int64_t keys) const { vector_.add_dq(kb, rows, keys); }

 private:
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
  // the head dim); unfit[r]: a bf16 row with an element the dot products would get wrong.
  void narrow_rows(const float* src, int64_t n_pad, int64_t rows, uint16_t* dst,
                   bool* unfit) const {
    for (int64_t r = 0; r < rows; ++r) {
      uint16_t flagged = 0;
      for (int64_t c = 0; c < n_pad; ++c) {
        const uint16_t bits = narrow(src[r * n_pad + c]);
        dst[r * n_pad + c] = bits;
        flagged |= static_cast<uint16_t>(bf16_query_unfit_for_dot(bits));
      }
      unfit[r] = format_ == NarrowScores::kBf16Pairs && flagged != 0;
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
  int64_t head_dim_, head_dim_v_, d_pad_, dv_pad_;
  bool q_unfit_[kTile] = {};
  bool dout_unfit_[kTile] = {};
};

void bwd_task(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task, const float* delta,
              float* scratch) {
  // The layout has the 16-bit rows only when the driver found the call takes the kernels; the
  // format is asked again in case a test switched them off in between.
  if (layout.rows16 && narrow_scores_of(args.fwd) != NarrowScores::kNone) {
    bwd_blocks<NarrowProducts>(args, layout, task, delta, scratch);
  } else {
    bwd_blocks<VectorProducts>(args, layout, task, delta, scratch);
  }
}
