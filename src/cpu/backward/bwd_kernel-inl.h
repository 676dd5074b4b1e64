// The backward block loops, written once against the Vec interface and compiled once per ISA.
//
// Included by bwd_<isa>.cc inside namespace anyattn::cpu::bwd_<isa> (inside that ISA's target
// region), after Vec (simd/vec_<isa>.h), exp2/tanh (simd/vec_math-inl.h) and the register tile
//   kGemmRows x kGemmVecs   rows x column vectors of the C += A B micro-kernel
// and dropout_row_factors(key, b, h, i, j0, threshold, keep_scale, z): that ISA's
// dropout_keep_factors64 (bwd_philox.h), the dropout factors of 64 keys of one row. The task loop
// (bwd_blocks) takes its five products from a policy class: VectorProducts below, or with
// ANYATTN_BWD_BF16_TILES (bwd_avx512_amx.cc, after amx_tiles-inl.h) TileProducts, which runs those
// of bf16 calls on AMX tiles (bwd_tiles_amx-inl.h), or with ANYATTN_BWD_NARROW_SCORES (bwd_neon.cc,
// bwd_avx512.cc) NarrowProducts, which runs S and dP of bf16 calls on pairwise dot products and,
// on neon, of f16 calls on FMLAL (bwd_narrow_scores-inl.h). Which keys a row sees, and the score
// modifiers, come from the sequence's Mask (common/mask.h).
//
// Math (docs/backward.md): with x = <q_i, k_j> * scale, t = tanh(x / softcap), s = softcap * t (or
// s = x), s += ALiBi, P = exp(s - lse_i), Z the dropout factors (0 or 1/(1-p); 1 without dropout)
// and delta_i = rowsum(dout_i * out_i):
//   dV_j += sum_i P_ij Z_ij dout_i        dP_ij = Z_ij <dout_i, v_j>
//   dS_ij = P_ij (dP_ij - delta_i)        dX_ij = dS_ij (1 - t_ij^2)   (dS_ij without softcap)
//   dQ_i  = scale sum_j dX_ij k_j          dK_j = scale sum_i dX_ij q_i
//
// One fused pass. A task is (sequence, kv head, range of the GQA group's query heads, key chunk of
// 64-key blocks) (bwd_layout.h):
//
//   1. Pack the chunk once, converting to f32: K transposed into 64-key panels kt[d][64], K rows
//      k[j][d], V transposed into panels vt[d][64]. Every query block of every query head of the
//      task reuses them; each K/V row is read from the caller's memory exactly once per task.
//   2. For each query head h of the task and each 64-row query block that sees the chunk: pack
//      its Q and dout rows (f32, row-major) once, then for each 64-key block it sees:
//        S  [rows][64] = Q    kt      depth D    A = Q (broadcast), B = kt panel
//        dP [rows][64] = dout vt      depth Dv   A = dout, B = vt panel
//        elementwise: S <- P Z, dP <- dX, in place (L1: three 16 KiB tiles)
//        dV [64][dv]  += (P Z)^T dout  depth rows   A = P read column-wise, B = dout rows
//        dK [64][d]   += dX^T Q        depth rows   A = dX read column-wise, B = Q rows
//        dQ [rows][d] += dX K          depth 64     A = dX, B = K rows
//      These are the five products of the backward and nothing is recomputed. The micro-kernel
//      broadcasts A, so A's transpose costs nothing: only its address arithmetic changes. For
//      bf16 calls on avx512_amx all five run on AMX tiles, from bf16 copies of the same operands
//      (P Z and dX transposed where needed and split into hi + lo; bwd_tiles_amx-inl.h).
//   3. dQ of a query block is complete after its key blocks: with one chunk per sequence it is
//      scaled and written to dq; with several, written unscaled to this chunk's f32 partial and
//      summed over the chunks, in chunk order, by reduce_dq. dK and dV (f32 accumulators for the
//      whole chunk) are written once when the task ends: to dk and dv when the task holds every
//      query head of the group, else unscaled to its head split's f32 partials, summed over the
//      splits, in split order, by reduce_dkv.
//
// Every micro-kernel call is C[M][N] (+)= A[M][K] B[K][N] with a kGemmRows x kGemmVecs register
// tile (6 x 64 floats on AVX-512): per k it loads kGemmVecs vectors of B's row k and broadcasts
// one A value per row, kGemmRows * kGemmVecs FMAs for kGemmRows + kGemmVecs loads; B panels
// (64 x 128 floats = 32 KiB at D = 128) stay in L1 while all row tiles pass over them.
//
// Memory traffic per task: the chunk's K and V once; per (query head, query block) the Q and dout
// rows once, and the chunk's packed panels and dK/dV accumulators once from L2 (L3 for long
// chunks: about 2.5 KiB per key at D = Dv = 128, against 5 * 64 * 64 * 2 * 128 flops per tile).
// Each output row (of dK, dV, dQ or a dQ partial) is produced by exactly one task, summing its
// terms in a fixed order (heads, then query blocks, then rows; or key blocks, then keys), and the
// partials are summed in chunk order, so results do not depend on the thread count.

constexpr int kLanes = Vec::kLanes;
constexpr int64_t kTile = kBwdBlock;
static_assert(kTile % kLanes == 0, "tiles must be whole vectors");
static_assert(16 % kLanes == 0, "padded head dims (multiples of 16) must be whole vectors");
constexpr float kLog2eF = 1.4426950408889634f;
constexpr float kInfinityF = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// C[M][N] (+)= A[M][K] B[K][N]
// ---------------------------------------------------------------------------------------------

// A[r][k] lives at a[r * lda + k], or at a[k * lda + r] when kTransA (A stored transposed).
template <bool kTransA>
inline int64_t a_index(int64_t r, int64_t k, int64_t lda) {
  return kTransA ? k * lda + r : r * lda + k;
}

template <bool kTransA, int R, int NV>
inline void gemm_tile(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t depth,
                      float* c, int64_t ldc, bool accumulate) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) {
      acc[r][n] = accumulate ? Vec::load(c + r * ldc + n * kLanes) : Vec::zero();
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    Vec row[NV];
    for (int n = 0; n < NV; ++n) row[n] = Vec::load(b + k * ldb + n * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec a_rk = Vec::broadcast(a[a_index<kTransA>(r, k, lda)]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fma(a_rk, row[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n].store(c + r * ldc + n * kLanes);
  }
}

// All column vectors of R rows: whole kGemmVecs tiles, then one narrower tile for the rest.
template <bool kTransA, int R, int NV = kGemmVecs>
inline void gemm_columns(int64_t vectors, const float* a, int64_t lda, const float* b, int64_t ldb,
                         int64_t depth, float* c, int64_t ldc, bool accumulate) {
  if constexpr (NV == kGemmVecs) {
    for (; vectors >= NV; vectors -= NV, b += NV * kLanes, c += NV * kLanes) {
      gemm_tile<kTransA, R, NV>(a, lda, b, ldb, depth, c, ldc, accumulate);
    }
  }
  if constexpr (NV >= 1) {
    if (vectors == NV) {
      gemm_tile<kTransA, R, NV>(a, lda, b, ldb, depth, c, ldc, accumulate);
    } else if (vectors > 0) {
      gemm_columns<kTransA, R, NV - 1>(vectors, a, lda, b, ldb, depth, c, ldc, accumulate);
    }
  }
}

template <bool kTransA, int R>
inline void gemm_row_remainder(int64_t rows, int64_t vectors, const float* a, int64_t lda,
                               const float* b, int64_t ldb, int64_t depth, float* c, int64_t ldc,
                               bool accumulate) {
  if constexpr (R >= 1) {
    if (rows == R) {
      gemm_columns<kTransA, R>(vectors, a, lda, b, ldb, depth, c, ldc, accumulate);
    } else {
      gemm_row_remainder<kTransA, R - 1>(rows, vectors, a, lda, b, ldb, depth, c, ldc, accumulate);
    }
  }
}

// C[rows][cols] = (accumulate ? C : 0) + A[rows][depth] B[depth][cols]; cols a multiple of kLanes.
template <bool kTransA>
inline void gemm(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t vectors = cols / kLanes;
  int64_t r = 0;
  for (; r + kGemmRows <= rows; r += kGemmRows) {
    gemm_columns<kTransA, kGemmRows>(vectors, a + a_index<kTransA>(r, 0, lda), lda, b, ldb, depth,
                                     c + r * ldc, ldc, accumulate);
  }
  gemm_row_remainder<kTransA, kGemmRows - 1>(rows - r, vectors, a + a_index<kTransA>(r, 0, lda),
                                             lda, b, ldb, depth, c + r * ldc, ldc, accumulate);
}

// ---------------------------------------------------------------------------------------------
// Loading, transposing, storing
// ---------------------------------------------------------------------------------------------

// dst[0..n) = the n `dtype` values at src as f32; dst[n..n_pad) = 0.
inline void load_row(const void* src, DType dtype, int64_t n, int64_t n_pad, float* dst) {
  int64_t c = 0;
  if (dtype == DType::kF32) {
    const float* from = static_cast<const float*>(src);
    for (; c + kLanes <= n; c += kLanes) Vec::load(from + c).store(dst + c);
  } else if (dtype == DType::kBF16) {
    const uint16_t* from = static_cast<const uint16_t*>(src);
    for (; c + kLanes <= n; c += kLanes) Vec::load_bf16(from + c).store(dst + c);
  } else {
    const uint16_t* from = static_cast<const uint16_t*>(src);
    for (; c + kLanes <= n; c += kLanes) Vec::load_f16(from + c).store(dst + c);
  }
  for (; c < n; ++c) dst[c] = load_element(src, dtype, c);
  for (; c < n_pad; ++c) dst[c] = 0.f;
}

// Asks for the n `dtype` values at each of `rows` strided row addresses (row r at element offset
// first + r * row_stride) to be brought into cache: rows are often a page apart, where hardware
// prefetchers do not follow, and the conversion loop would stall on every row.
inline void prefetch_rows(const void* base, DType dtype, int64_t first, int64_t row_stride,
                          int64_t rows, int64_t n) {
  const int64_t bytes = n * element_size(dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const char* row =
        static_cast<const char*>(element_address(base, dtype, first + r * row_stride));
    prefetch_bytes(row, bytes);
  }
}

inline void zero_floats(float* dst, int64_t n) {
  for (int64_t c = 0; c < n; c += kLanes) Vec::zero().store(dst + c);
}

// dst[c][r] = src[r][c] for rows r < `rows` of a [kTile][cols] tile (rows and cols multiples of
// kLanes); dst stride kTile.
inline void transpose_to_columns(const float* src, int64_t cols, float* dst,
                                 int64_t rows = kTile) {
  for (int64_t r = 0; r < rows; r += kLanes) {
    for (int64_t c = 0; c < cols; c += kLanes) {
      transpose_tile(src + r * cols + c, cols, dst + c * kTile + r, kTile);
    }
  }
}

// dst[t][n] = the bf16 bits of rows[2t][n] (low half) and rows[2t + 1][n] (high half) for
// t < pairs and n < n_pad, from f32 rows n_pad floats apart that hold bf16 values exactly (the
// rows of a bf16 call); rows at or past `count` read as zero. True when a value is subnormal.
// The right operand of a product on bf16 pairs that sums over query rows (dK, dV: Q and dout) or
// keys (dQ: K). Rows up to 2 * pairs must be addressable.
inline bool pack_row_pairs(const float* rows, int64_t count, int64_t n_pad, int64_t pairs,
                           uint32_t* dst) {
  uint32_t subnormal = 0;
  for (int64_t t = 0; t < pairs; ++t) {
    const uint32_t even_mask = 2 * t < count ? 0xFFFF0000u : 0u;
    const uint32_t odd_mask = 2 * t + 1 < count ? 0xFFFF0000u : 0u;
    const float* even = rows + 2 * t * n_pad;
    const float* odd = even + n_pad;
    for (int64_t n = 0; n < n_pad; ++n) {
      uint32_t low, high;
      std::memcpy(&low, even + n, sizeof(low));
      std::memcpy(&high, odd + n, sizeof(high));
      low &= even_mask;
      high &= odd_mask;
      // A subnormal's magnitude bits (sign cleared) are 1 to 0x7F in the high half: one unsigned
      // range test, without a branch, so that the loop vectorises.
      subnormal |= static_cast<uint32_t>((low & 0x7FFF0000u) - 0x10000u < 0x7F0000u) |
                   static_cast<uint32_t>((high & 0x7FFF0000u) - 0x10000u < 0x7F0000u);
      dst[t * n_pad + n] = low >> 16 | high;
    }
  }
  return subnormal != 0;
}

// Writes n values of src times `scale` as `dtype` to dst (rounded to nearest even). f16 is
// narrowed a vector at a time by Vec::store_f16 (convert::f32_to_f16's bits, without the scalar
// conversion's branches), bf16 by the scalar conversion (integer operations only).
inline void store_row(const float* src, int64_t n, float scale, DType dtype, void* dst) {
  const Vec factor = Vec::broadcast(scale);
  int64_t c = 0;
  if (dtype == DType::kF32) {
    float* to = static_cast<float*>(dst);
    for (; c + kLanes <= n; c += kLanes) (Vec::load(src + c) * factor).store(to + c);
    for (; c < n; ++c) to[c] = src[c] * scale;
  } else if (dtype == DType::kBF16) {
    uint16_t* to = static_cast<uint16_t*>(dst);
    for (; c < n; ++c) to[c] = f32_to_bf16(src[c] * scale);
  } else {
    uint16_t* to = static_cast<uint16_t*>(dst);
    for (; c + kLanes <= n; c += kLanes) (Vec::load(src + c) * factor).store_f16(to + c);
    for (; c < n; ++c) to[c] = f32_to_f16(src[c] * scale);
  }
}

// ---------------------------------------------------------------------------------------------
// The elementwise step: probabilities and score gradients of one tile row
// ---------------------------------------------------------------------------------------------

// The probabilities of one tile row, kLanes columns at a time: P = exp(s - lse) of the raw scores
// x = <q, k> at column positions `position`, and *sech2 = 1 - t^2, the softcap's derivative (0
// without softcap). m: the call's score modifiers (common/mask.h); neg_lse is minus the row's LSE
// (-inf for a row that saw no key, so that its P is exactly 0); the ALiBi distance of column c is
// |alibi_base + c|. Each score is formed exactly as the forward's softmax formed it
// (transform_scores, online_softmax_row: the same factors, each product rounded once, no fused
// multiply-add), so P = exp(s - lse) sums to 1 over a row as the forward's probabilities did;
// s - lse is taken in natural-log units and only then scaled by log2(e) for exp2.
struct RowProbabilities {
  const ScoreModifiers& m;
  float neg_slope;
  float alibi_base;
  float neg_lse;

  Vec operator()(Vec x, Vec position, Vec* sech2) const {
    Vec t = Vec::zero(), factor, score;
    *sech2 = Vec::zero();
    if (m.softcap) {
      tanh_and_sech2(x * Vec::broadcast(m.tanh_scale_first) * Vec::broadcast(m.tanh_scale_second),
                     &t, sech2);
      score = t;
      factor = Vec::broadcast(m.cap);
    } else {
      score = x;
      factor = Vec::broadcast(m.scale);
    }
    Vec centered;  // s - lse
    if (m.alibi) {
      const Vec s = fma(Vec::broadcast(neg_slope), abs(Vec::broadcast(alibi_base) + position),
                        score * factor);
      centered = s + Vec::broadcast(neg_lse);
    } else {
      centered = score * factor + Vec::broadcast(neg_lse);
    }
    return exp2(centered * Vec::broadcast(kLog2eF));
  }
};

// One row of a tile, kTile columns (keys): s_row holds raw scores <q, k>, dp_row holds
// <dout, v>. On return s_row holds P Z and dp_row holds dX (the gradient of the pre-softcap
// score, unscaled). Columns outside [lo, hi) get 0 in both when `mask`. Each P is divided by
// `total` (1, or the sum short_row_delta found); delta is the row's sum_j P_ij Z_ij dP_ij;
// z_row holds the dropout factors, read only with `dropout`. A non-null `products_row` (kLanes
// floats) gets this tile's part of that sum added lane by lane, P_ij Z_ij dP_ij over the row's
// visible columns. A non-null `p_row` holds the row's P already (short_row_delta's; read only
// without softcap, whose derivative comes with P).
inline void tile_row_gradients(const RowProbabilities& probabilities, const float* p_row,
                               float total, bool dropout, float* s_row, float* dp_row,
                               const float* z_row, float delta_row, bool mask, float lo, float hi,
                               float* products_row) {
  if (probabilities.m.softcap) p_row = nullptr;
  const Vec iota = Vec::iota();
  const Vec zero = Vec::zero();
  const Vec delta = Vec::broadcast(delta_row);
  Vec products = zero;
  for (int64_t c = 0; c < kTile; c += kLanes) {
    const Vec position = iota + Vec::broadcast(static_cast<float>(c));
    Vec sech2 = Vec::zero();  // set by probabilities(), read only with softcap
    Vec p = p_row != nullptr ? Vec::load(p_row + c)
                             : probabilities(Vec::load(s_row + c), position, &sech2);
    if (total != 1.f) p = p / Vec::broadcast(total);
    Vec dp = Vec::load(dp_row + c);
    Vec kept = p;
    if (dropout) {
      const Vec z = Vec::load(z_row + c);
      kept = p * z;
      dp = dp * z;
    }
    if (products_row != nullptr) {
      const Vec product = p * dp;
      products = products + (mask ? select_in_range(product, position, lo, hi, zero) : product);
    }
    Vec ds = p * (dp - delta);
    if (probabilities.m.softcap) ds = ds * sech2;  // 1 - t^2, without its cancellation near t = +-1
    if (mask) {
      kept = select_in_range(kept, position, lo, hi, zero);
      ds = select_in_range(ds, position, lo, hi, zero);
    }
    kept.store(s_row + c);
    ds.store(dp_row + c);
  }
  if (products_row != nullptr) (Vec::load(products_row) + products).store(products_row);
}

// The normalisation of a row whose visible keys, columns [lo, hi) of this tile row (s_row, dp_row
// and z_row as tile_row_gradients takes them), are all its keys: total = the sum of its P and
// sink_probability, and delta = sum_j (P_ij / total) Z_ij dP_ij, from the same quotients
// tile_row_gradients forms (so a row of one key and no sink has P = 1 and dS = 0 exactly); p
// (kTile floats) gets the row's P, 0 outside [lo, hi). A total that is not positive and finite
// leaves the row as handed over.
struct ShortRow {
  float total = 1.f;
  float delta = 0.f;
};

inline ShortRow short_row_delta(const RowProbabilities& probabilities, bool dropout,
                                const float* s_row, const float* dp_row, const float* z_row,
                                int64_t lo, int64_t hi, float sink_probability,
                                ShortRow handed_over, float* p) {
  const Vec iota = Vec::iota();
  const int64_t first = lo / kLanes * kLanes;
  for (int64_t c = 0; c < kTile; c += kLanes) Vec::zero().store(p + c);
  Vec p_sum = Vec::zero();
  for (int64_t c = first; c < hi; c += kLanes) {
    const Vec position = iota + Vec::broadcast(static_cast<float>(c));
    Vec sech2;
    const Vec pc = select_in_range(probabilities(Vec::load(s_row + c), position, &sech2),
                                   position, static_cast<float>(lo), static_cast<float>(hi),
                                   Vec::zero());
    pc.store(p + c);
    p_sum = p_sum + pc;
  }
  ShortRow row;
  row.total = reduce_add(p_sum) + sink_probability;
  if (!(row.total > 0.f && row.total < kInfinityF)) return handed_over;
  const Vec total = Vec::broadcast(row.total);
  Vec p_dp_sum = Vec::zero();
  for (int64_t c = first; c < hi; c += kLanes) {
    Vec dp = Vec::load(dp_row + c);
    if (dropout) dp = dp * Vec::load(z_row + c);
    p_dp_sum = fma(Vec::load(p + c) / total, dp, p_dp_sum);
  }
  row.delta = reduce_add(p_dp_sum);
  return row;
}

// -lse of row i; -inf for a row that saw no key (lse = -inf), so that its P is exactly 0.
inline float neg_lse_of(const FwdArgs& f, const SeqInfo& seq, int64_t h, int64_t i) {
  const float lse = f.lse[seq.lse_offset + h * f.lse_head_stride + i * f.lse_row_stride];
  return lse == -kInfinityF ? -kInfinityF : -lse;
}

// The call's dropout, as the elementwise step applies it (off: every factor is 1).
struct TileDropout {
  bool on = false;
  PhiloxKey key;
  uint32_t threshold = 0;
  float keep_scale = 1.f;  // 1 / (1 - p)
};

inline TileDropout tile_dropout(const BwdArgs& args) {
  TileDropout dropout;
  dropout.on = args.dropout_p > 0.f;
  dropout.key = dropout_key(args.dropout_seed, args.dropout_offset);
  dropout.threshold = dropout_threshold(args.dropout_p);
  dropout.keep_scale = dropout.on ? 1.f / (1.f - args.dropout_p) : 1.f;
  return dropout;
}

// The elementwise step of the tile of query rows [i0, i0 + rows) of head h of sequence b and the
// keys from j0: s.s (S) becomes P Z and s.dp (dP) becomes dX, with the dropout factors of the
// tile in s.z and, on tiles that cross the mask's boundary, zeros outside each row's visible keys.
//
// Every row takes P = exp(s - lse) and delta_i = <dout_i, out_i> (s.delta, from row_dots), from
// the lse and out handed over. With `own.normalise_short_rows` (out and lse are this library's
// own forward results: BwdArgs::own_forward) a row whose visible keys all lie in this tile is
// normalised here instead, as the naive backward does (short_row_delta): its P are divided by
// their sum (with the sink's exp(sink - lse)), which removes the rounding of its f32 LSE, and its
// delta is sum_j P_ij Z_ij dP_ij of the tile, which removes the rounding of out's Dv elements;
// its dS then sum to 0 as the exact ones do (a row that sees one key gets dS = 0 exactly). Those
// two roundings are the largest errors left where a row sees few keys. The normalised rows are
// every row of a sequence of at most 64 keys and the first rows of a causal one; they take two
// more passes over their columns (with softcap they form their P twice).
//
// With `own.row_products` (own bf16 or f16 forward, sinks: dsinks from the tiles) every row also
// adds this tile's P_ij Z_ij dP_ij to its kLanes partial sums there: summed over every tile of
// the row that is delta_i without the rounding of out (add_sink_terms). A normalised row adds
// delta_i / total instead, as its sink probability is divided by the total too.
struct OwnForwardRows {
  bool normalise_short_rows = false;
  float* row_products = nullptr;  // kTile rows of kLanes floats, or null
};

inline void tile_gradients(const Mask& mask, const TileDropout& dropout, const OwnForwardRows& own,
                           int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                           const BwdScratch& s) {
  if (dropout.on) {
    for (int64_t r = 0; r < rows; ++r) {
      dropout_row_factors(dropout.key, b, h, i0 + r, j0, dropout.threshold,
                          dropout.keep_scale, s.z + r * kTile);
    }
  }
  const ScoreModifiers& m = mask.modifiers();
  const bool masked = mask.crosses_boundary(i0, i0 + rows, j0, kTile);
  const float slope = mask.neg_alibi_slope(h);
  const float sink = m.sinks ? m.sink(h) : -kInfinityF;
  alignas(64) float short_row_p[kTile];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float* s_row = s.s + r * kTile;
    float* dp_row = s.dp + r * kTile;
    const float* z_row = s.z + r * kTile;
    const KeyRange range = mask.row_keys_in_block(i, j0, kTile);
    const float lo = static_cast<float>(range.begin), hi = static_cast<float>(range.end);
    const RowProbabilities probabilities{m, slope, static_cast<float>(j0 - mask.diagonal(i)),
                                         s.neg_lse[r]};
    const ShortRow handed_over{1.f, s.delta[r]};
    ShortRow normalised = handed_over;
    const float* p_row = nullptr;
    const KeyRange keys = own.normalise_short_rows ? mask.visible_keys(i, i + 1) : KeyRange{};
    if (!keys.empty() && keys.begin >= j0 && keys.end <= j0 + kTile) {
      normalised = short_row_delta(probabilities, dropout.on, s_row, dp_row, z_row, range.begin,
                                   range.end, std::exp(sink + s.neg_lse[r]), handed_over,
                                   short_row_p);
      p_row = short_row_p;
    }
    float* products_row = own.row_products != nullptr ? own.row_products + r * kLanes : nullptr;
    if (products_row != nullptr && normalised.total != 1.f) {
      products_row[0] += normalised.delta / normalised.total;  // the row's only visible tile
      products_row = nullptr;
    }
    tile_row_gradients(probabilities, p_row, normalised.total, dropout.on, s_row, dp_row, z_row,
                       normalised.delta, masked, lo, hi, products_row);
  }
}

// The dsinks terms of a query block's rows [0, rows) of head h once all its tiles are done:
// *sink_terms += exp(sink_h - lse_i) times the row's sum in row_products (tile_gradients), in
// f64; the sums are zeroed for the next block.
inline void add_sink_terms(const Mask& mask, int64_t h, int64_t rows, const BwdScratch& s,
                           float* row_products, double* sink_terms) {
  const double sink = mask.modifiers().sink(h);
  for (int64_t r = 0; r < rows; ++r) {
    float* sums = row_products + r * kLanes;
    const double delta = reduce_add(Vec::load(sums));
    Vec::zero().store(sums);
    if (delta != 0.0) *sink_terms += std::exp(sink + s.neg_lse[r]) * delta;
  }
}

// ---------------------------------------------------------------------------------------------
// delta_i = rowsum(dout_i * out_i)
// ---------------------------------------------------------------------------------------------

// delta[i] for the seqlen_q rows of query head h of sequence `s`.
void row_dots(const BwdArgs& args, const BwdSeq& s, int64_t h, float* delta) {
  const FwdArgs& f = args.fwd;
  const int64_t dv = f.head_dim_v;
  const int64_t dv_pad = (dv + 15) / 16 * 16;
  alignas(64) float out_row[kMaxHeadDimV];  // dv_pad <= kMaxHeadDimV, a multiple of 16
  alignas(64) float dout_row[kMaxHeadDimV];
  for (int64_t i = 0; i < s.seq.seqlen_q; ++i) {
    load_row(element_address(f.out, f.dtype,
                             s.seq.out_offset + i * f.out_row_stride + h * f.out_head_stride),
             f.dtype, dv, dv_pad, out_row);
    load_row(element_address(args.dout, f.dtype,
                             s.dout_offset + i * args.dout_row_stride + h * args.dout_head_stride),
             f.dtype, dv, dv_pad, dout_row);
    Vec sum = Vec::zero();
    for (int64_t c = 0; c < dv_pad; c += kLanes) {
      sum = fma(Vec::load(out_row + c), Vec::load(dout_row + c), sum);
    }
    delta[i] = reduce_add(sum);
  }
}

// ---------------------------------------------------------------------------------------------
// The five products
// ---------------------------------------------------------------------------------------------

// The five products of a tile as the FMA micro-kernel computes them, from the f32 operands in
// BwdScratch (one object per task). bwd_blocks is written against this interface; a path with
// other products (bwd_tiles_amx-inl.h) supplies its own. In every call kb is the tile's key block
// within the task's chunk, `rows` its query rows and `keys` its keys (64 but at the end of the
// sequence); S and P Z live in s.s, dP and dX in s.dp.
class VectorProducts {
 public:
  VectorProducts(const FwdArgs& f, const BwdLayout& layout, const BwdScratch& s)
      : s_(s),
        head_dim_(f.head_dim),
        head_dim_v_(f.head_dim_v),
        d_pad_(layout.d_pad),
        dv_pad_(layout.dv_pad) {}

  // After key block kb's K rows (s.k) and V rows (s.rows) are loaded and its panels packed: the
  // micro-kernel needs nothing more.
  void pack_key_block(int64_t /*kb*/) {}
  // After a query block's Q and dout rows are loaded: nothing more either.
  void pack_query_block(int64_t /*rows*/) {}
  // S = Q K^T.
  void scores(int64_t kb, int64_t rows) const {
    gemm<false>(rows, kTile, head_dim_, s_.q, d_pad_, s_.kt + kb * d_pad_ * kTile, kTile, s_.s,
                kTile, false);
  }
  // dP = dout V^T.
  void value_scores(int64_t kb, int64_t rows) const {
    gemm<false>(rows, kTile, head_dim_v_, s_.dout, dv_pad_, s_.vt + kb * dv_pad_ * kTile, kTile,
                s_.dp, kTile, false);
  }
  // dV += (P Z)^T dout.
  void add_dv(int64_t kb, int64_t rows, int64_t keys) const {
    gemm<true>(keys, dv_pad_, rows, s_.s, kTile, s_.dout, dv_pad_, s_.dv + kb * kTile * dv_pad_,
               dv_pad_, true);
  }
  // dK += dX^T Q.
  void add_dk(int64_t kb, int64_t rows, int64_t keys) const {
    gemm<true>(keys, d_pad_, rows, s_.dp, kTile, s_.q, d_pad_, s_.dk + kb * kTile * d_pad_, d_pad_,
               true);
  }
  // dQ += dX K. The tile's last product: it may overwrite dX.
  void add_dq(int64_t kb, int64_t rows, int64_t keys) const {
    gemm<false>(rows, d_pad_, keys, s_.dp, kTile, s_.k + kb * kTile * d_pad_, d_pad_, s_.dq, d_pad_,
                true);
  }

 private:
  const BwdScratch& s_;
  int64_t head_dim_, head_dim_v_, d_pad_, dv_pad_;
};

// ---------------------------------------------------------------------------------------------
// The fused pass: dK, dV of one key chunk and its dQ contributions
// ---------------------------------------------------------------------------------------------

// Converts `count` (<= 64) key rows starting at key j0 of tensor `base` (k or v strides) into
// rows[64][n_pad] (zero rows beyond count), then transposes them into panel[n_pad][64].
inline void pack_key_block(const FwdArgs& f, const SeqInfo& seq, int64_t head_k, const void* base,
                           int64_t batch_stride, int64_t row_stride, int64_t head_stride, int64_t n,
                           int64_t n_pad, int64_t j0, int64_t count, float* rows, float* panel) {
  for (int64_t j = 0; j < kTile; ++j) {
    if (j < count) {
      load_row(element_address(
                   base, f.dtype,
                   key_row_offset(f, seq, j0 + j, head_k, batch_stride, row_stride, head_stride)),
               f.dtype, n, n_pad, rows + j * n_pad);
    } else {
      zero_floats(rows + j * n_pad, n_pad);
    }
  }
  transpose_to_columns(rows, n_pad, panel);
}

// Packs the task's key chunk once: per 64-key block the K rows (s.k), the K and V panels (s.kt,
// s.vt) and what `products` adds; then zeroes the chunk's dK and dV accumulators.
template <class Products>
void pack_chunk(const FwdArgs& f, const BwdLayout& layout, const BwdTask& task,
                const BwdScratch& s, Products& products) {
  const SeqInfo& seq = task.seq.seq;
  const int64_t d_pad = layout.d_pad, dv_pad = layout.dv_pad;
  const int64_t chunk_blocks = (task.key_end - task.key_begin + kTile - 1) / kTile;
  for (int64_t kb = 0; kb < chunk_blocks; ++kb) {
    const int64_t j0 = task.key_begin + kb * kTile;
    const int64_t keys = std::min(kTile, task.key_end - j0);
    pack_key_block(f, seq, task.head_k, f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride,
                   f.head_dim, d_pad, j0, keys, s.k + kb * kTile * d_pad,
                   s.kt + kb * d_pad * kTile);
    pack_key_block(f, seq, task.head_k, f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride,
                   f.head_dim_v, dv_pad, j0, keys, s.rows, s.vt + kb * dv_pad * kTile);
    products.pack_key_block(kb);
  }
  zero_floats(s.dk, chunk_blocks * kTile * d_pad);
  zero_floats(s.dv, chunk_blocks * kTile * dv_pad);
}

// Loads the Q and dout rows of query rows [i0, i0 + rows) of head h into s.q and s.dout (f32,
// zero-padded), with their -lse and delta (delta_head: the head's delta, by position).
inline void load_query_block(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task,
                             int64_t h, int64_t i0, int64_t rows, const float* delta_head,
                             const BwdScratch& s) {
  const FwdArgs& f = args.fwd;
  const SeqInfo& seq = task.seq.seq;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    load_row(element_address(f.q, f.dtype, seq.q_offset + i * f.q_row_stride + h * f.q_head_stride),
             f.dtype, f.head_dim, layout.d_pad, s.q + r * layout.d_pad);
    load_row(element_address(
                 args.dout, f.dtype,
                 task.seq.dout_offset + i * args.dout_row_stride + h * args.dout_head_stride),
             f.dtype, f.head_dim_v, layout.dv_pad, s.dout + r * layout.dv_pad);
    s.neg_lse[r] = neg_lse_of(f, seq, h, i);
    s.delta[r] = delta_head[i];
  }
}

// Prefetches the Q and dout rows of head h's query block after the one at i0, if there is one.
inline void prefetch_next_query_block(const BwdArgs& args, const BwdTask& task, int64_t h,
                                      int64_t i0) {
  const FwdArgs& f = args.fwd;
  const SeqInfo& seq = task.seq.seq;
  if (i0 + kTile >= seq.seqlen_q) return;
  const int64_t next_rows = std::min(kTile, seq.seqlen_q - i0 - kTile);
  prefetch_rows(f.q, f.dtype, seq.q_offset + (i0 + kTile) * f.q_row_stride + h * f.q_head_stride,
                f.q_row_stride, next_rows, f.head_dim);
  prefetch_rows(args.dout, f.dtype,
                task.seq.dout_offset + (i0 + kTile) * args.dout_row_stride +
                    h * args.dout_head_stride,
                args.dout_row_stride, next_rows, f.head_dim_v);
}

// Writes the dQ rows of query rows [i0, i0 + rows) of head h (s.dq, unscaled): scaled to dq when
// the sequence has one chunk, else unscaled to this chunk's f32 partial.
inline void store_query_gradients(const BwdArgs& args, const BwdLayout& layout,
                                  const BwdTask& task, int64_t h, int64_t i0, int64_t rows,
                                  const BwdScratch& s) {
  const FwdArgs& f = args.fwd;
  const int64_t d_pad = layout.d_pad;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    if (task.dq_partial == nullptr) {
      store_row(s.dq + r * d_pad, f.head_dim, f.softmax_scale, f.dtype,
                element_address(args.dq, f.dtype,
                                 task.seq.dq_offset + i * args.dq_row_stride +
                                     h * args.dq_head_stride));
    } else {
      float* partial =
          task.dq_partial + (task.seq.row_first + h * task.seq.seq.seqlen_q + i) * d_pad;
      for (int64_t c = 0; c < d_pad; c += kLanes) Vec::load(s.dq + r * d_pad + c).store(partial + c);
    }
  }
}

// Writes the chunk's dK (scaled) and dV rows from their accumulators, or with a head split's
// partials both unscaled to the partial rows.
inline void store_key_gradients(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task,
                                const BwdScratch& s) {
  const FwdArgs& f = args.fwd;
  const SeqInfo& seq = task.seq.seq;
  for (int64_t j = 0; j < task.key_end - task.key_begin; ++j) {
    const int64_t key = task.key_begin + j;
    if (task.dkv_partial != nullptr) {
      float* partial = task.dkv_partial + (task.seq.key_row_first + task.head_k * seq.seqlen_k +
                                           key) * layout.dkv_row_floats();
      for (int64_t c = 0; c < layout.d_pad; c += kLanes) {
        Vec::load(s.dk + j * layout.d_pad + c).store(partial + c);
      }
      for (int64_t c = 0; c < layout.dv_pad; c += kLanes) {
        Vec::load(s.dv + j * layout.dv_pad + c).store(partial + layout.d_pad + c);
      }
      continue;
    }
    store_row(s.dk + j * layout.d_pad, f.head_dim, f.softmax_scale, f.dtype,
              element_address(args.dk, f.dtype,
                              key_row_offset(f, seq, key, task.head_k, args.dk_batch_stride,
                                             args.dk_row_stride, args.dk_head_stride)));
    store_row(s.dv + j * layout.dv_pad, f.head_dim_v, 1.f, f.dtype,
              element_address(args.dv, f.dtype,
                              key_row_offset(f, seq, key, task.head_k, args.dv_batch_stride,
                                             args.dv_row_stride, args.dv_head_stride)));
  }
}

// One task (bwd_layout.h) with the products of `Products`: pack the chunk, then for every query
// head of the task and every query block, the tiles of the key blocks that block sees.
// sink_terms: null, or the task's dsinks terms (tile_gradients), one per query head g of the
// kv head's group at sink_terms[g].
template <class Products>
void bwd_blocks(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task,
                const float* delta_all, double* sink_terms, float* scratch_base) {
  const FwdArgs& f = args.fwd;
  const SeqInfo& seq = task.seq.seq;
  const BwdScratch s = BwdScratch::carve(scratch_base, layout);
  const Mask mask(f, seq);
  const TileDropout dropout = tile_dropout(args);
  OwnForwardRows own;
  own.normalise_short_rows = args.own_forward;
  alignas(64) float row_products[kTile * kLanes];
  if (sink_terms != nullptr) {
    zero_floats(row_products, kTile * kLanes);
    own.row_products = row_products;
  }
  Products products(f, layout, s);
  pack_chunk(f, layout, task, s, products);

  for (int64_t g = task.group_begin; g < task.group_end; ++g) {
    const int64_t h = task.head_k * f.group_size() + g;
    const float* delta_head = delta_all + task.seq.row_first + h * seq.seqlen_q;
    for (int64_t i0 = 0; i0 < seq.seqlen_q; i0 += kTile) {
      const int64_t rows = std::min(kTile, seq.seqlen_q - i0);
      const KeyRange blocks = chunk_blocks_seen(mask, task, i0, rows);
      zero_floats(s.dq, (rows + 15) / 16 * 16 * layout.d_pad);
      if (!blocks.empty()) {
        load_query_block(args, layout, task, h, i0, rows, delta_head, s);
        products.pack_query_block(rows);
        prefetch_next_query_block(args, task, h, i0);
        for (int64_t kb = blocks.begin; kb < blocks.end; ++kb) {
          const int64_t j0 = task.key_begin + kb * kTile;
          const int64_t keys = std::min(kTile, task.key_end - j0);
          products.scores(kb, rows);
          products.value_scores(kb, rows);
          tile_gradients(mask, dropout, own, seq.batch, h, i0, rows, j0, s);
          products.add_dv(kb, rows, keys);
          products.add_dk(kb, rows, keys);
          products.add_dq(kb, rows, keys);
        }
        if (sink_terms != nullptr) {
          add_sink_terms(mask, h, rows, s, row_products, sink_terms + g);
        }
      }
      store_query_gradients(args, layout, task, h, i0, rows, s);
    }
  }
  store_key_gradients(args, layout, task, s);
}

// ---------------------------------------------------------------------------------------------
// Gradients from the partials of chunks and head splits
// ---------------------------------------------------------------------------------------------

// sum[0 .. n_pad) = the sum over p < parts of partials[p * stride + offset + c], in order of p
// (n_pad a multiple of 16). parts == 0 gives zeros without touching `partials` (null then).
inline void sum_partial_row(const float* partials, int64_t offset, int64_t stride, int64_t parts,
                            int64_t n_pad, float* sum) {
  for (int64_t c = 0; c < n_pad; c += kLanes) {
    Vec acc = Vec::zero();
    for (int64_t p = 0; p < parts; ++p) acc = acc + Vec::load(partials + p * stride + offset + c);
    acc.store(sum + c);
  }
}

// dq of query head h of sequence `s` = softmax_scale * sum over c < chunks of the partial rows
// partials + c * chunk_stride (floats), summed in chunk order. chunks == 0 writes zeros.
void reduce_dq(const BwdArgs& args, const BwdLayout& layout, const BwdSeq& s, int64_t h,
               const float* partials, int64_t chunk_stride, int64_t chunks) {
  const FwdArgs& f = args.fwd;
  const int64_t d_pad = layout.d_pad;
  alignas(64) float sum[kMaxHeadDim];  // d_pad <= kMaxHeadDim, a multiple of 16
  for (int64_t i = 0; i < s.seq.seqlen_q; ++i) {
    const int64_t row = (s.row_first + h * s.seq.seqlen_q + i) * d_pad;
    sum_partial_row(partials, row, chunk_stride, chunks, d_pad, sum);
    store_row(sum, f.head_dim, f.softmax_scale, f.dtype,
              element_address(args.dq, f.dtype,
                              s.dq_offset + i * args.dq_row_stride + h * args.dq_head_stride));
  }
}

// dk (times softmax_scale) and dv of kv head head_k of sequence `s` = the sums over the
// layout's head splits of their partial rows (partials + split * split_stride floats), in split
// order.
void reduce_dkv(const BwdArgs& args, const BwdLayout& layout, const BwdSeq& s, int64_t head_k,
                const float* partials, int64_t split_stride) {
  const FwdArgs& f = args.fwd;
  const SeqInfo& seq = s.seq;
  alignas(64) float sum[kMaxHeadDim];  // d_pad, dv_pad <= kMaxHeadDim, multiples of 16
  for (int64_t j = 0; j < seq.seqlen_k; ++j) {
    const int64_t row = (s.key_row_first + head_k * seq.seqlen_k + j) * layout.dkv_row_floats();
    sum_partial_row(partials, row, split_stride, layout.head_splits, layout.d_pad, sum);
    store_row(sum, f.head_dim, f.softmax_scale, f.dtype,
              element_address(args.dk, f.dtype,
                              key_row_offset(f, seq, j, head_k, args.dk_batch_stride,
                                             args.dk_row_stride, args.dk_head_stride)));
    sum_partial_row(partials, row + layout.d_pad, split_stride, layout.head_splits, layout.dv_pad,
                    sum);
    store_row(sum, f.head_dim_v, 1.f, f.dtype,
              element_address(args.dv, f.dtype,
                              key_row_offset(f, seq, j, head_k, args.dv_batch_stride,
                                             args.dv_row_stride, args.dv_head_stride)));
  }
}

#if defined(ANYATTN_BWD_BF16_TILES)
// This path runs the products of bf16 calls on AMX tiles, and everything else as above.
#include "cpu/amx/bwd_tiles_amx-inl.h"
#elif defined(ANYATTN_BWD_NARROW_SCORES)
// This path runs S and dP of bf16 calls on pairwise dot products (and, on the neon path, of f16
// calls on FMLAL) where the CPU has them.
#include "cpu/backward/bwd_narrow_scores-inl.h"
#else
void bwd_task(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task, const float* delta,
              double* sink_terms, float* scratch) {
  bwd_blocks<VectorProducts>(args, layout, task, delta, sink_terms, scratch);
}
#endif
