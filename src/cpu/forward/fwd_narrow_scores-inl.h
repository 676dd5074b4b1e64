// The packed forward's bf16 scores on pairwise dot products (BFDOT on the neon path, VDPBF16PS on
// the avx512 path) and, on the neon path, its f16 scores on FMLAL (forward/fwd_narrow_scores.h):
// the path's pack_block and attend.
//
// Included at the end of fwd_kernel-inl.h when ANYATTN_FWD_NARROW_SCORES is defined (the path's
// traits, which also name the namespace of its bf16 kernels, ANYATTN_NARROW_BF16_KERNELS, and
// define ANYATTN_NARROW_F16 where the f16 kernels exist), inside the path's namespace. A call
// takes them when narrow_scores_of says so: q, K and V bf16 on a CPU and call that take the dot
// products, or f16 where FMLAL exists, without rotary, with D >= 4. Every other call packs and
// attends as the f32 vector path does.
//
// Design (same tasks, key blocks, softmax, P V and output rows as the vector path; only S and the
// packed K differ):
//
//   Packed K: the 16-bit panels of fwd_narrow_scores.h, in the f32 panel's K region, which holds
//   them for D >= 4 (round_up(D, 8) * 32 floats <= D * 64). Per kLanes keys the rows are copied
//   bit for bit into staging (no widening), then transposed kLanes x kLanes as 32-bit pairs of
//   elements (the f32 path's transpose_tile); for f16 the neon path then splits each pair row
//   into its even and odd elements (fwd_narrow_scores_neon-inl.h). V is packed in f32, as on the
//   vector path (VPanelWriter), for the vector path's P V: keeping P V at f32 accuracy on the
//   16-bit instructions needs P in two parts (hi + lo, as on the AMX path), two dot products
//   where one FMA does the same work, so they would save no instructions.
//
//   q: the task's rows as their 16-bit bits, 2 * q_stride elements per row (the f32 rows' bytes),
//   zero from D on. For bf16 the rows with an element unfit for the dot products
//   (bf16_query_unfit_for_dot) are noted, and their dot-product scores are replaced by f32 ones
//   computed from the same panel (exact_pair_scores: the vector path's bits). The test is per row,
//   so a row's scores do not depend on which rows share its task.

namespace narrow_bf16 = ::anyattn::cpu::ANYATTN_NARROW_BF16_KERNELS;

// Copies n elements from element `offset` of a bf16 or 8-bit cache `tensor` to `dst` as bf16 bits:
// a bf16 cache's own, an 8-bit cache's values (exact; `codes` is kv8_bf16_codes of its dtype, null
// for bf16). dst is written with memcpy only (see stage_narrow_key_rows).
inline void copy_row_as_bf16(const void* tensor, const uint16_t* codes, int64_t offset, int64_t n,
                             void* dst) {
  if (codes == nullptr) {
    std::memcpy(dst, static_cast<const uint16_t*>(tensor) + offset, n * 2);
    return;
  }
  const uint8_t* stored = static_cast<const uint8_t*>(tensor) + offset;
  uint16_t widened[kMaxHeadDim];
  for (int64_t d = 0; d < n; ++d) widened[d] = codes[stored[d]];
  std::memcpy(dst, widened, n * 2);
}

// The kv8_bf16_codes table of a call's cache, or null for a bf16 cache.
inline const uint16_t* cache_bf16_codes(const FwdArgs& args) {
  return is_kv8(args.kv_dtype) ? kv8_bf16_codes(args.kv_dtype) : nullptr;
}

// Copies the K rows of keys j0 + jj, jj < `present`, of kv head head_k into staging rows
// `staged_row_bytes` apart as 16-bit values (a 16-bit cache's bits; an 8-bit cache's values as
// bf16, kv8_bf16_codes), zero from D on; rows present .. slots - 1 are zero. Prefetches the rows
// ahead. The rows are written with memcpy and memset only: the transposes read them as floats
// (32-bit pairs), and typed 16-bit stores would let the compiler move those reads before them.
inline void stage_narrow_key_rows(const FwdArgs& args, const SeqInfo& seq, int64_t head_k,
                                  int64_t j0, int64_t present, int64_t slots,
                                  int64_t staged_row_bytes, float* staging) {
  char* staged = reinterpret_cast<char*>(staging);
  const int64_t head_dim = args.head_dim;
  const int64_t row_bytes = head_dim * 2;
  const uint16_t* codes = cache_bf16_codes(args);
  for (int64_t jj = 0; jj < slots; ++jj) {
    char* row = staged + jj * staged_row_bytes;
    prefetch_rows_ahead(args, seq, args.k, args.k_batch_stride, args.k_row_stride,
                        args.k_head_stride, j0 + jj, head_k,
                        head_dim * element_size(args.kv_dtype));
    int64_t copied = 0;
    if (jj < present) {
      const int64_t offset = key_row_offset(args, seq, j0 + jj, head_k, args.k_batch_stride,
                                            args.k_row_stride, args.k_head_stride);
      copy_row_as_bf16(args.k, codes, offset, head_dim, row);
      copied = row_bytes;
    }
    std::memset(row + copied, 0, staged_row_bytes - copied);
  }
}

// K of one block in the pairs format: `keys` keys from j0, zero up to round_up(keys, kLanes).
// staging: kLanes * round_up(pair_rows, kLanes) floats.
inline void pack_pair_keys(const FwdArgs& args, const SeqInfo& seq, int64_t head_k, int64_t j0,
                           int64_t keys, float* panel, float* staging) {
  const int64_t pair_rows = narrow_depth(args.head_dim) / 2;
  const int64_t staged_words = round_up(pair_rows, kLanes);
  alignas(64) float transposed[kLanes * kLanes];
  for (int64_t chunk = 0; chunk < keys; chunk += kLanes) {
    stage_narrow_key_rows(args, seq, head_k, j0 + chunk, std::min<int64_t>(kLanes, keys - chunk),
                          kLanes, staged_words * 4, staging);
    // Staged row jj holds key chunk + jj as 32-bit words (element pairs).
    for (int64_t w = 0; w < pair_rows; w += kLanes) {
      if (w + kLanes <= pair_rows) {
        transpose_tile(staging + w, staged_words, panel + w * kKeyBlock + chunk, kKeyBlock);
        continue;
      }
      transpose_tile(staging + w, staged_words, transposed, kLanes);
      for (int64_t row = w; row < pair_rows; ++row) {
        Vec::load(transposed + (row - w) * kLanes).store(panel + row * kKeyBlock + chunk);
      }
    }
  }
}

// For an 8-bit cache: the factors of the block's `keys` keys from j0 (descale times token scale)
// at narrow_key_factors_offset of the panel, 1 for the keys past them up to a whole vector.
inline void store_key_factors(const FwdArgs& args, const SeqInfo& seq, int64_t head_k, int64_t j0,
                              int64_t keys, float* panel) {
  float* factors = panel + narrow_key_factors_offset(args.head_dim);
  for (int64_t j = 0; j < keys; ++j) {
    factors[j] = key_scale(args, seq, j0 + j, head_k, KvStream::kK);
  }
  for (int64_t j = keys; j < round_up(keys, kLanes); ++j) factors[j] = 1.f;
}

#if defined(ANYATTN_NARROW_F16)
// pack_f16_keys: the f16 format's K.
#include "cpu/forward/fwd_narrow_scores_neon-inl.h"
#endif

#if defined(ANYATTN_NARROW_BF16_PV)
// Whether a call's V is packed in the value-pairs format (fwd_narrow_scores.h) where its values
// allow: a bf16 call that allows bf16 probabilities, with K in the pairs format (a bf16 or 8-bit
// cache) and V rows of at least one vector (narrower ones are packed transposed for their own
// P V).
inline bool packs_value_pairs(const FwdArgs& args, NarrowScores format) {
  return args.bf16_probabilities && format == NarrowScores::kBf16Pairs &&
         !v_panel_transposed(args.head_dim_v);
}

// Whether an 8-bit cache's V factor (descale times token scale) lets the value pairs take the
// key's probability times it: 0, or within [2^-60, 2^60], where p * factor (p <= 2^8) times any
// stored value stays finite and a product that falls below 2^-126, which the dot products flush,
// belongs to a key whose weight is under 2^-66 of the row's largest.
inline bool value_factor_fits_pairs(float factor) {
  return factor == 0.f || (factor >= 0x1.0p-60f && factor <= 0x1.0p60f);
}

// What a bf16 value adds to a value-pairs block's flags: kBlockSubnormal for a subnormal (which
// the block cannot take), kBlockVNonfinite for a NaN or an infinity (packed as 0), else 0.
inline uint8_t bf16_value_flags(uint16_t bits) {
  const uint16_t exponent = bits & 0x7F80u;
  return static_cast<uint8_t>((exponent == 0 && (bits & 0x7Fu) != 0 ? kBlockSubnormal : 0) |
                              (exponent == 0x7F80u ? kBlockVNonfinite : 0));
}

// The bits a value-pairs panel holds for bf16 `bits`: 0 for a NaN or an infinity, whose products
// add_nonfinite_values adds for the rows that see its key (a masked key's P = 0 times infinity
// would be NaN in the others).
inline uint32_t packed_value_bits(uint16_t bits) {
  return (bits & 0x7F80u) == 0x7F80u ? 0u : bits;
}

// V of the block's `keys` keys from j0 in the value-pairs format, at `pairs` (rows dv_pad words
// apart), and for an 8-bit cache the keys' V factors at value_pair_factors (0 past `keys`).
// Returns kBlockValuePairs, with kBlockVNonfinite if a value is a NaN or an infinity; or
// kBlockSubnormal (and maybe kBlockVNonfinite) if one is subnormal or a factor does not fit
// (value_factor_fits_pairs): the block cannot take the format then, and its rows are partly
// written. Prefetches ahead.
inline uint8_t pack_value_pairs(const FwdArgs& args, const PackedLayout& layout,
                                const SeqInfo& seq, int64_t head_k, int64_t j0, int64_t keys,
                                uint32_t* pairs) {
  const int64_t head_dim_v = args.head_dim_v;
  const uint16_t* codes = cache_bf16_codes(args);
  uint8_t flags = 0;
  uint16_t rows[2][kMaxHeadDimV];
  for (int64_t t = 0; 2 * t < keys; ++t) {
    const bool odd_key = 2 * t + 1 < keys;
    for (int64_t half = 0; half < 1 + odd_key; ++half) {
      const int64_t key = j0 + 2 * t + half;
      prefetch_rows_ahead(args, seq, args.v, args.v_batch_stride, args.v_row_stride,
                          args.v_head_stride, key, head_k,
                          head_dim_v * element_size(args.kv_dtype));
      copy_row_as_bf16(args.v, codes,
                       key_row_offset(args, seq, key, head_k, args.v_batch_stride,
                                      args.v_row_stride, args.v_head_stride),
                       head_dim_v, rows[half]);
    }
    if (!odd_key) std::fill(rows[1], rows[1] + head_dim_v, uint16_t{0});
    uint32_t* row = pairs + t * layout.dv_pad;
    // OR-ed over the row with no early exit, so that the loop vectorises.
    for (int64_t c = 0; c < head_dim_v; ++c) {
      row[c] = packed_value_bits(rows[0][c]) | packed_value_bits(rows[1][c]) << 16;
      flags |= bf16_value_flags(rows[0][c]) | bf16_value_flags(rows[1][c]);
    }
    for (int64_t c = head_dim_v; c < layout.dv_pad; ++c) row[c] = 0;
  }
  if (is_kv8(args.kv_dtype)) {
    float* factors = value_pair_factors(pairs, layout.dv_pad);
    for (int64_t j = 0; j < kKeyBlock; ++j) {
      factors[j] = j < keys ? key_scale(args, seq, j0 + j, head_k, KvStream::kV) : 0.f;
      if (!value_factor_fits_pairs(factors[j])) flags |= kBlockSubnormal;
    }
  }
  return (flags & kBlockSubnormal) != 0 ? flags : flags | kBlockValuePairs;
}
#endif

// Packs key block `block` of kv head `head_k` into `panel`: K in `format` (pairs or f16), V in the
// value-pairs format where the call and the values allow (kBlockValuePairs), else as the vector
// path packs it, and sets *block_flags (kBlockValuePairs, kBlockVNonfinite; kBlockSubnormal for
// a V the value pairs cannot take because of a subnormal). `staging`: the f32
// path's (16 rows of round_up(D, 16) floats), which holds the staged 16-bit rows of either
// format.
inline void pack_narrow_head(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                             int64_t head_k, int64_t block, NarrowScores format, float* panel,
                             float* staging, uint8_t* block_flags) {
  const int64_t j0 = block * kKeyBlock;
  const int64_t keys = std::min(kKeyBlock, seq.seqlen_k - j0);
#if defined(ANYATTN_NARROW_F16)
  if (format == NarrowScores::kF16) {
    pack_f16_keys(args, seq, head_k, j0, keys, panel, staging);
  } else {
    pack_pair_keys(args, seq, head_k, j0, keys, panel, staging);
  }
#else
  (void)format;
  pack_pair_keys(args, seq, head_k, j0, keys, panel, staging);
#endif
  if (is_kv8(args.kv_dtype)) store_key_factors(args, seq, head_k, j0, keys, panel);
  uint8_t unfit_for_pairs = 0;
#if defined(ANYATTN_NARROW_BF16_PV)
  if (packs_value_pairs(args, format)) {
    const uint8_t packed = pack_value_pairs(args, layout, seq, head_k, j0, keys,
                                            reinterpret_cast<uint32_t*>(panel + layout.kt_floats));
    if ((packed & kBlockValuePairs) != 0) {
      *block_flags = packed;
      return;
    }
    unfit_for_pairs = kBlockSubnormal;
  }
#endif
  VPanelWriter v_panel(args, layout, panel, 1);
  v_panel.convert_rows(seq, head_k, j0, keys);
  v_panel.finish(keys, block_flags);
  *block_flags |= unfit_for_pairs;
}

// The products for attend_blocks of a call whose K panels are 16-bit (narrow_scores_of): S on the
// narrow kernels, P V as on the vector path.
class NarrowScoreProducts {
 public:
  void load_queries(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                    const TaskRows& rows, const Scratch& scratch) {
    format_ = narrow_scores_of(args);
    kv8_ = is_kv8(args.kv_dtype);
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
        unfit |= static_cast<uint16_t>(kv8_ ? kv8_query_unfit_for_dot(source[d])
                                            : bf16_query_unfit_for_dot(source[d]));
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
  // of the packed block kt, and the zero keys past them up to a whole vector; the columns past
  // those are left for the mask.
  void scores(const FwdArgs& args, const PackedLayout& layout, const float* q, int64_t rows,
              const float* kt, int64_t keys, uint8_t /*block_flags*/, float* s,
              const float* next_panel) {
    const int64_t depth = narrow_depth(args.head_dim);
    const char* next = reinterpret_cast<const char*>(next_panel);
    const NextPanelLines next_lines{next, depth * kKeyBlock * 2,
                                    next == nullptr ? nullptr : next + layout.kt_floats * 4,
                                    kKeyBlock * layout.dv_pad * 4};
    const uint16_t* q_rows = reinterpret_cast<const uint16_t*>(q);
#if defined(ANYATTN_NARROW_F16)
    if (format_ == NarrowScores::kF16) {
      neon_f16::block_scores(q_rows, ldq_, rows, reinterpret_cast<const uint16_t*>(kt), depth,
                             keys, next_lines, s);
      return;
    }
#endif
    const uint32_t* k_pairs = reinterpret_cast<const uint32_t*>(kt);
    narrow_bf16::block_scores(q_rows, ldq_, rows, k_pairs, depth, keys, next_lines, s);
    const float* factors = kt + narrow_key_factors_offset(args.head_dim);
    if (kv8_) scale_key_columns(factors, rows, round_up(keys, kLanes), s);
    const int64_t r0 = (q_rows - q_) / ldq_;
    for (int64_t r = 0; r < rows; ++r) {
      if (!unfit_row_[r0 + r]) continue;
      if (kv8_) {
        exact_kv8_scores(q_rows + r * ldq_, k_pairs, depth / 2, keys, factors, s + r * kKeyBlock);
      } else {
        narrow_bf16::exact_pair_scores(q_rows + r * ldq_, k_pairs, depth / 2, keys,
                                       s + r * kKeyBlock);
      }
    }
  }
  // O += P V: on the narrow kernel over value pairs where the block was packed so, else as on the
  // vector path. From a block the value pairs could not take (kBlockSubnormal: a subnormal value,
  // or an 8-bit factor out of range) on, O may hold subnormals: the task's later value-pairs
  // blocks take the f32 products (exact_pair_pv).
  void pv(const FwdArgs& args, const SeqInfo& seq, const Mask& mask, const TaskRows& head_rows,
          int64_t j0, int64_t keys, bool crosses_boundary, uint8_t block_flags, float* p,
          const float* v, float* o, int64_t dv_pad) {
#if defined(ANYATTN_NARROW_BF16_PV)
    if ((block_flags & kBlockSubnormal) != 0) o_may_hold_subnormals_ = true;
    if ((block_flags & (kBlockValuePairs | kBlockVNonfinite)) ==
        (kBlockValuePairs | kBlockVNonfinite)) {
      add_nonfinite_values(args, seq, mask, head_rows, j0, keys, p, o, dv_pad);
    }
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(v);
    const float* factors = kv8_ ? value_pair_factors(pairs, dv_pad) : nullptr;
    if ((block_flags & kBlockValuePairs) != 0 && o_may_hold_subnormals_) {
      narrow_bf16::exact_pair_pv(p, head_rows.count, pairs, factors, keys, o, dv_pad,
                                 pv_columns(args.head_dim_v));
      return;
    }
    if ((block_flags & kBlockValuePairs) != 0) {
      int64_t row_keys[kMaxQBlockRows];
      if (crosses_boundary) boundary_row_keys(mask, head_rows, j0, row_keys);
      narrow_bf16::block_pv(p, head_rows.count, pairs, factors, keys,
                            crosses_boundary ? row_keys : nullptr, o, dv_pad,
                            pv_columns(args.head_dim_v));
      return;
    }
#endif
    vector_.pv(args, seq, mask, head_rows, j0, keys, crosses_boundary, block_flags, p, v, o,
               dv_pad);
  }
  void finish() {}

 private:
  // s[r][j] *= factors[j] for r < rows, j < columns (a multiple of kLanes).
  static void scale_key_columns(const float* factors, int64_t rows, int64_t columns, float* s) {
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * kKeyBlock;
      for (int64_t c = 0; c < columns; c += kLanes) {
        (Vec::load(row + c) * Vec::load(factors + c)).store(row + c);
      }
    }
  }

  // s_row[j] = sum_d q_d * (k_jd * factors[j]) for j < round_up(keys, kLanes): the vector path's
  // arithmetic on the dequantized values (each value times its factor rounded once, FMAs in
  // ascending d), for a row unfit for the dot products. q_row: bf16, zero from D to
  // 2 * pair_rows; k_pairs: a pairs panel of an 8-bit cache's values.
  static void exact_kv8_scores(const uint16_t* q_row, const uint32_t* k_pairs, int64_t pair_rows,
                               int64_t keys, const float* factors, float* s_row) {
    for (int64_t j = 0; j < round_up(keys, kLanes); ++j) {
      float sum = 0.f;
      for (int64_t w = 0; w < pair_rows; ++w) {
        const uint32_t word = k_pairs[w * kKeyBlock + j];
        const float even = bf16_to_f32(static_cast<uint16_t>(word & 0xFFFFu));
        const float odd = bf16_to_f32(static_cast<uint16_t>(word >> 16));
        sum = std::fma(bf16_to_f32(q_row[2 * w]), even * factors[j], sum);
        sum = std::fma(bf16_to_f32(q_row[2 * w + 1]), odd * factors[j], sum);
      }
      s_row[j] = sum;
    }
  }

  NarrowScores format_ = NarrowScores::kNone;
  bool kv8_ = false;
  uint16_t* q_ = nullptr;
  int64_t ldq_ = 0;
  bool unfit_row_[kMaxQBlockRows] = {};
#if defined(ANYATTN_NARROW_BF16_PV)
  bool o_may_hold_subnormals_ = false;  // from a block flagged kBlockSubnormal on
#endif
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
