// bf16 and f16 scores on BFDOT and FMLAL (forward/fwd_narrow_scores.h): the neon path's pack_block
// and attend.
//
// Included at the end of fwd_kernel-inl.h when ANYATTN_FWD_NARROW_SCORES is defined (traits_neon.h,
// in builds that compile the Arm feature units), inside namespace anyattn::cpu::neon. A call takes
// them when its q, K and V are bf16 (on a CPU with FEAT_BF16, and within the dot products' bounds)
// or f16 (FEAT_FHM), without rotary, with D >= 4; every other call packs and attends as the f32
// vector path does.
//
// Design (same tasks, key blocks, softmax, P V and output rows as the vector path; only S and the
// packed K differ):
//
//   Packed K: the 16-bit panels of fwd_narrow_scores.h, in the f32 panel's K region, which holds
//   them for D >= 4 (round_up(D, 8) * 32 floats <= D * 64). Per 8 keys the rows are copied bit for
//   bit into staging (no widening), then transposed 4 x 4 as 32-bit pairs of elements (the f32
//   path's transpose_tile); for f16 each pair row is then split into its even and odd elements
//   (UZP1/UZP2), one f16 row per head-dim element. V is packed in f32, as on the vector path
//   (VPanelWriter), for the vector path's P V: keeping P V at f32 accuracy on the 16-bit
//   instructions needs P in two parts (hi + lo, as on the AMX path), two BFDOTs where one FMLA
//   does the same work, so they would save no instructions.
//
//   q: the task's rows as their 16-bit bits, 2 * q_stride elements per row (the f32 rows' bytes),
//   zero from D on. For bf16 the rows with an element unfit for the dot products
//   (bf16_query_unfit_for_dot) are noted, and their BFDOT scores are replaced by f32 ones computed
//   from the same panel (exact_pair_scores: the vector path's bits). The test is per row, so a
//   row's scores do not depend on which rows share its task.

// Packs key block `block` of kv head `head_k` into `panel`: K in `format` (pairs or f16), V as the
// vector path packs it, and sets *block_flags (kBlockVNonfinite). `staging`: 4 * round_up(D, 8)
// floats.
inline void pack_narrow_head(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                             int64_t head_k, int64_t block, NarrowScores format, float* panel,
                             float* staging, uint8_t* block_flags) {
  constexpr int64_t kChunkKeys = 8;
  const int64_t j0 = block * kKeyBlock;
  const int64_t keys = std::min(kKeyBlock, seq.seqlen_k - j0);
  const int64_t head_dim = args.head_dim;
  const int64_t depth = narrow_depth(head_dim);
  const int64_t pair_rows = depth / 2;  // 32-bit words per staged row
  // The staged rows are written with memcpy and memset only: the transposes read them as floats
  // (32-bit pairs), and typed 16-bit stores would let the compiler move those reads before them.
  char* staged = reinterpret_cast<char*>(staging);
  const int64_t row_bytes = head_dim * 2;
  const int64_t staged_row_bytes = depth * 2;
  for (int64_t chunk = 0; chunk < round_up(keys, kChunkKeys); chunk += kChunkKeys) {
    for (int64_t jj = 0; jj < kChunkKeys; ++jj) {
      const int64_t j = chunk + jj;
      char* row = staged + jj * staged_row_bytes;
      prefetch_rows_ahead(args, seq, args.k, args.k_batch_stride, args.k_row_stride,
                          args.k_head_stride, j0 + j, head_k, row_bytes);
      int64_t copied = 0;
      if (j < keys) {
        const int64_t offset = key_row_offset(args, seq, j0 + j, head_k, args.k_batch_stride,
                                              args.k_row_stride, args.k_head_stride);
        std::memcpy(row, static_cast<const uint16_t*>(args.k) + offset, row_bytes);
        copied = row_bytes;
      }
      std::memset(row + copied, 0, staged_row_bytes - copied);
    }
    // Staged row jj holds key chunk + jj as pair_rows 32-bit words (element pairs).
    const float* words = staging;
    if (format == NarrowScores::kBf16Pairs) {
      for (int64_t half = 0; half < kChunkKeys; half += kLanes) {
        for (int64_t w = 0; w < pair_rows; w += kLanes) {
          transpose_tile(words + half * pair_rows + w, pair_rows,
                         panel + w * kKeyBlock + chunk + half, kKeyBlock);
        }
      }
      continue;
    }
    uint16_t* kt = reinterpret_cast<uint16_t*>(panel);
    alignas(16) float pairs[2][kLanes * kLanes];  // [keys 0-3, keys 4-7][pair row][key]
    for (int64_t w = 0; w < pair_rows; w += kLanes) {
      transpose_tile(words + w, pair_rows, pairs[0], kLanes);
      transpose_tile(words + kLanes * pair_rows + w, pair_rows, pairs[1], kLanes);
      for (int64_t i = 0; i < kLanes; ++i) {
        // (even, odd) elements of keys 0-3, then of keys 4-7.
        const uint16x8_t low = vreinterpretq_u16_f32(vld1q_f32(pairs[0] + i * kLanes));
        const uint16x8_t high = vreinterpretq_u16_f32(vld1q_f32(pairs[1] + i * kLanes));
        vst1q_u16(kt + 2 * (w + i) * kKeyBlock + chunk, vuzp1q_u16(low, high));
        vst1q_u16(kt + (2 * (w + i) + 1) * kKeyBlock + chunk, vuzp2q_u16(low, high));
      }
    }
  }
  VPanelWriter v_panel(args, layout, panel, 1);
  v_panel.convert_rows(seq, head_k, j0, keys);
  v_panel.finish(keys, block_flags);
}

// The products for attend_blocks of a call whose K panels are 16-bit (narrow_scores_of): S on the
// narrow kernels, P V as on the vector path.
class NarrowScoreProducts {
 public:
  void load_queries(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                    const TaskRows& rows, const Scratch& scratch) {
    format_ = narrow_scores_of(args);
    q_ = reinterpret_cast<uint16_t*>(scratch.q);
    ldq_ = 2 * layout.q_stride;
    for (int64_t r = 0; r < rows.count; ++r) {
      const int64_t offset = task.seq.q_offset + rows.position(r) * args.q_row_stride +
                             rows.head(r) * args.q_head_stride;
      const uint16_t* source = static_cast<const uint16_t*>(args.q) + offset;
      uint16_t* row = q_ + r * ldq_;
      // OR-ed over the row with no early exit, so that the loop vectorises.
      uint16_t unfit = 0;
      for (int64_t d = 0; d < args.head_dim; ++d) {
        row[d] = source[d];
        unfit |= static_cast<uint16_t>(bf16_query_unfit_for_dot(source[d]));
      }
      for (int64_t d = args.head_dim; d < ldq_; ++d) row[d] = 0;
      unfit_row_[r] = format_ == NarrowScores::kBf16Pairs && unfit != 0;
    }
  }
  static void pack(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                   int64_t head_k, int64_t heads_k, int64_t block, float* panels, float* staging,
                   uint8_t* block_flags) {
    const NarrowScores format = narrow_scores_of(args);
    for (int64_t h = 0; h < heads_k; ++h) {
      pack_narrow_head(args, layout, seq, head_k + h, block, format,
                       panels + h * layout.block_floats, staging, block_flags + h);
    }
  }
  // S (raw q . k) for `rows` rows (from q, a row of this task's q) against the first `keys` keys
  // of the packed block kt, and up to 7 zero keys past them; the columns past those are left for
  // the mask.
  void scores(const FwdArgs& args, const PackedLayout& layout, const float* q, int64_t rows,
              const float* kt, int64_t keys, uint8_t /*block_flags*/, float* s,
              const float* next_panel) {
    const int64_t depth = narrow_depth(args.head_dim);
    const char* next = reinterpret_cast<const char*>(next_panel);
    const NextPanelLines next_lines{next, depth * kKeyBlock * 2,
                                    next == nullptr ? nullptr : next + layout.kt_floats * 4,
                                    kKeyBlock * layout.dv_pad * 4};
    const uint16_t* q_rows = reinterpret_cast<const uint16_t*>(q);
    if (format_ == NarrowScores::kF16) {
      neon_f16::block_scores(q_rows, ldq_, rows, reinterpret_cast<const uint16_t*>(kt), depth,
                             keys, next_lines, s);
      return;
    }
    const uint32_t* k_pairs = reinterpret_cast<const uint32_t*>(kt);
    neon_bf16::block_scores(q_rows, ldq_, rows, k_pairs, depth, keys, next_lines, s);
    const int64_t r0 = (q_rows - q_) / ldq_;
    for (int64_t r = 0; r < rows; ++r) {
      if (unfit_row_[r0 + r]) {
        exact_pair_scores(q_rows + r * ldq_, k_pairs, depth / 2, keys, s + r * kKeyBlock);
      }
    }
  }
  void pv(const FwdArgs& args, const SeqInfo& seq, const Mask& mask, const TaskRows& head_rows,
          int64_t j0, int64_t keys, bool crosses_boundary, uint8_t block_flags, float* p,
          const float* v, float* o, int64_t dv_pad) const {
    vector_.pv(args, seq, mask, head_rows, j0, keys, crosses_boundary, block_flags, p, v, o,
               dv_pad);
  }
  void finish() {}

 private:
  NarrowScores format_ = NarrowScores::kNone;
  uint16_t* q_ = nullptr;
  int64_t ldq_ = 0;
  bool unfit_row_[kMaxQBlockRows] = {};
  VectorProducts vector_;
};

void pack_block(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq, int64_t head_k,
                int64_t block, float* dst, uint8_t* block_flags, float* staging) {
  const NarrowScores format = narrow_scores_of(args);
  if (format == NarrowScores::kNone) {
    pack_block_heads(args, layout, seq, head_k, 1, block, dst, staging, block_flags);
  } else {
    pack_narrow_head(args, layout, seq, head_k, block, format, dst, staging, block_flags);
  }
}

void attend(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
            const Scratch& scratch) {
  if (narrow_scores_of(args) == NarrowScores::kNone) {
    attend_blocks<VectorProducts>(args, layout, task, scratch);
  } else {
    attend_blocks<NarrowScoreProducts>(args, layout, task, scratch);
  }
}
