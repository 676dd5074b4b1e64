// The backward block loops, written once against the Vec interface and compiled once per ISA.
//
// Included by bwd_<isa>.cc inside namespace anyattn::cpu::bwd_<isa> (inside that ISA's target
// region), after Vec (simd/vec_<isa>.h), exp2/tanh (simd/vec_math-inl.h) and the register tile
//   kGemmRows x kGemmVecs   rows x column vectors of the C += A B micro-kernel.
//
// Math (docs/backward.md): with x = <q_i, k_j> * scale, t = tanh(x / softcap), s = softcap * t (or
// s = x), s += ALiBi, P = exp(s - lse_i), Z the dropout factors (0 or 1/(1-p); 1 without dropout)
// and delta_i = rowsum(dout_i * out_i):
//   dV_j += sum_i P_ij Z_ij dout_i        dP_ij = Z_ij <dout_i, v_j>
//   dS_ij = P_ij (dP_ij - delta_i)        dX_ij = dS_ij (1 - t_ij^2)   (dS_ij without softcap)
//   dQ_i  = scale sum_j dX_ij k_j          dK_j = scale sum_i dX_ij q_i
//
// Every product is one register-blocked micro-kernel, C[M][N] (+)= A[M][K] B[K][N]: per k it loads
// kGemmVecs vectors of B's row k and broadcasts one A value per row, kGemmRows * kGemmVecs FMAs for
// kGemmRows + kGemmVecs loads. A and B are row-major f32 in per-thread scratch (L1/L2).
//
// Pass 1, dK and dV. A task is (batch, kv head, key block of 64 keys). It converts its K and V rows
// to f32 once, then for every query head of the GQA group and every 64-row query block that sees
// the keys, works in the TRANSPOSED domain (rows = keys, vectors along queries):
//     S^T  = K  Q^T          [keys][64]   (Q^T: the query tile transposed once per tile)
//     dP^T = V  dout^T       [keys][64]
//     elementwise: P^T Z^T into S^T, dS^T (dX^T) into dP^T
//     dV  += (P Z)^T dout     [keys][dv_pad]
//     dK  += dX^T Q           [keys][d_pad]
//   so no P tile is ever transposed, and dK, dV stay in scratch until the task writes them once.
//   Per tile: 4 products of 64 x 64 x D-ish FMAs against two 64 x D transposes.
//
// Pass 2, dQ. A task is (batch, query head, query block of 64 rows); per visible key block it
// converts K (row-major, and transposed) and V (transposed) to f32, then
//     S = Q K^T, dP = dout V^T, elementwise dX into dP, dQ += dX K.
//   dQ stays in scratch until the task writes it once.
//
// Each output row (of dK, dV or dQ) is produced by exactly one task, summing its terms in a fixed
// order (query heads, then query blocks, then rows; or key blocks, then keys), so results do not
// depend on the thread count. Recomputing S and dP in pass 2 costs 2 of the 7 tile products; it
// buys a dQ without atomics, without a dQ workspace per key block and without any memory that
// grows with Sq x Sk. Traffic: pass 1 reads Q and dout once per (key block, head), pass 2 reads K
// and V once per (query block, head); both from L2/L3 for the shapes of interest.

constexpr int kLanes = Vec::kLanes;
constexpr int64_t kTile = kBwdBlock;
static_assert(kTile % kLanes == 0, "tiles must be whole vectors");
static_assert(16 % kLanes == 0, "padded head dims (multiples of 16) must be whole vectors");
constexpr float kLog2eF = 1.4426950408889634f;
constexpr float kInfinityF = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// C[M][N] (+)= A[M][K] B[K][N]
// ---------------------------------------------------------------------------------------------

template <int R, int NV>
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
      const Vec a_rk = Vec::broadcast(a[r * lda + k]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fma(a_rk, row[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n].store(c + r * ldc + n * kLanes);
  }
}

// All column vectors of R rows: whole kGemmVecs tiles, then one narrower tile for the rest.
template <int R, int NV = kGemmVecs>
inline void gemm_columns(int64_t vectors, const float* a, int64_t lda, const float* b, int64_t ldb,
                         int64_t depth, float* c, int64_t ldc, bool accumulate) {
  if constexpr (NV == kGemmVecs) {
    for (; vectors >= NV; vectors -= NV, b += NV * kLanes, c += NV * kLanes) {
      gemm_tile<R, NV>(a, lda, b, ldb, depth, c, ldc, accumulate);
    }
  }
  if constexpr (NV >= 1) {
    if (vectors == NV) {
      gemm_tile<R, NV>(a, lda, b, ldb, depth, c, ldc, accumulate);
    } else if (vectors > 0) {
      gemm_columns<R, NV - 1>(vectors, a, lda, b, ldb, depth, c, ldc, accumulate);
    }
  }
}

template <int R>
inline void gemm_row_remainder(int64_t rows, int64_t vectors, const float* a, int64_t lda,
                               const float* b, int64_t ldb, int64_t depth, float* c, int64_t ldc,
                               bool accumulate) {
  if constexpr (R >= 1) {
    if (rows == R) {
      gemm_columns<R>(vectors, a, lda, b, ldb, depth, c, ldc, accumulate);
    } else {
      gemm_row_remainder<R - 1>(rows, vectors, a, lda, b, ldb, depth, c, ldc, accumulate);
    }
  }
}

// C[rows][cols] = (accumulate ? C : 0) + A[rows][depth] B[depth][cols]; cols a multiple of kLanes.
inline void gemm(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const int64_t vectors = cols / kLanes;
  int64_t r = 0;
  for (; r + kGemmRows <= rows; r += kGemmRows) {
    gemm_columns<kGemmRows>(vectors, a + r * lda, lda, b, ldb, depth, c + r * ldc, ldc, accumulate);
  }
  gemm_row_remainder<kGemmRows - 1>(rows - r, vectors, a + r * lda, lda, b, ldb, depth, c + r * ldc,
                                    ldc, accumulate);
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

// Asks for `rows` rows of n `dtype` values (row r at element offset first + r * row_stride) to be
// brought into cache: the next tile's rows are strided (often a page apart), so hardware
// prefetchers miss them and the conversion loop would stall on every row.
inline void prefetch_rows(const void* base, DType dtype, int64_t first, int64_t row_stride,
                          int64_t rows, int64_t n) {
  const int64_t bytes = n * element_size(dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const char* row =
        static_cast<const char*>(element_address(base, dtype, first + r * row_stride));
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch(row + at);
  }
}

inline void zero_floats(float* dst, int64_t n) {
  for (int64_t c = 0; c < n; c += kLanes) Vec::zero().store(dst + c);
}

// dst[c][r] = src[r][c] for a [kTile][cols] tile (cols a multiple of kLanes); dst stride kTile.
inline void transpose_to_columns(const float* src, int64_t cols, float* dst) {
  for (int64_t r = 0; r < kTile; r += kLanes) {
    for (int64_t c = 0; c < cols; c += kLanes) {
      transpose_tile(src + r * cols + c, cols, dst + c * kTile + r, kTile);
    }
  }
}

// Writes n values of src times `scale` as `dtype` to dst.
inline void store_row(const float* src, int64_t n, float scale, DType dtype, void* dst) {
  for (int64_t c = 0; c < n; ++c) store_element(dst, dtype, c, src[c] * scale);
}

// ---------------------------------------------------------------------------------------------
// The elementwise step: probabilities and score gradients of one tile row
// ---------------------------------------------------------------------------------------------

struct TileMath {
  float scale_log2 = 0.f;      // softmax_scale * log2(e), without softcap
  float scale_over_cap = 0.f;  // softmax_scale / softcap, with softcap
  float cap_log2 = 0.f;        // softcap * log2(e)
  bool softcap = false;
  bool alibi = false;
  bool dropout = false;
};

// One row of a tile, kTile columns: s_row holds raw scores <q, k>, dp_row holds <dout, v>. On
// return s_row holds P Z and dp_row holds dX (the gradient of the pre-softcap score, unscaled).
// Columns outside [lo, hi) get 0 in both when `mask`. Per-column statistics (pass 1: columns are
// queries) come from lse2_cols / delta_cols; otherwise the row's own lse2_row / delta_row
// (pass 2). ALiBi distance of column c is |alibi_base + c|; z_row holds dropout factors.
template <bool kColumnStats>
inline void tile_row_gradients(const TileMath& m, float neg_slope_log2, float* s_row, float* dp_row,
                               const float* z_row, const float* lse2_cols, const float* delta_cols,
                               float lse2_row, float delta_row, float alibi_base, bool mask,
                               float lo, float hi) {
  const Vec iota = Vec::iota();
  const Vec zero = Vec::zero();
  const Vec one = Vec::broadcast(1.f);
  for (int64_t c = 0; c < kTile; c += kLanes) {
    const Vec position = iota + Vec::broadcast(static_cast<float>(c));
    const Vec x = Vec::load(s_row + c);
    Vec t = zero, s2;
    if (m.softcap) {
      t = tanh(x * Vec::broadcast(m.scale_over_cap));
      s2 = t * Vec::broadcast(m.cap_log2);
    } else {
      s2 = x * Vec::broadcast(m.scale_log2);
    }
    if (m.alibi) {
      s2 = fma(Vec::broadcast(neg_slope_log2), abs(Vec::broadcast(alibi_base) + position), s2);
    }
    const Vec lse2 = kColumnStats ? Vec::load(lse2_cols + c) : Vec::broadcast(lse2_row);
    const Vec delta = kColumnStats ? Vec::load(delta_cols + c) : Vec::broadcast(delta_row);
    const Vec p = exp2(s2 - lse2);
    Vec dp = Vec::load(dp_row + c);
    Vec kept = p;
    if (m.dropout) {
      const Vec z = Vec::load(z_row + c);
      kept = p * z;
      dp = dp * z;
    }
    Vec ds = p * (dp - delta);
    if (m.softcap) ds = ds * (one - t * t);
    if (mask) {
      kept = select_in_range(kept, position, lo, hi, zero);
      ds = select_in_range(ds, position, lo, hi, zero);
    }
    kept.store(s_row + c);
    ds.store(dp_row + c);
  }
}

inline TileMath tile_math(const BwdArgs& args) {
  const FwdArgs& f = args.fwd;
  TileMath m;
  m.softcap = f.softcap > 0.f;
  m.scale_log2 = f.softmax_scale * kLog2eF;
  m.scale_over_cap = m.softcap ? f.softmax_scale / f.softcap : 0.f;
  m.cap_log2 = f.softcap * kLog2eF;
  m.alibi = f.alibi_slopes != nullptr;
  m.dropout = args.dropout_p > 0.f;
  return m;
}

inline float neg_slope_log2(const FwdArgs& f, int64_t b, int64_t h) {
  if (f.alibi_slopes == nullptr) return 0.f;
  return -f.alibi_slopes[b * f.alibi_batch_stride + h * f.alibi_head_stride] * kLog2eF;
}

// lse in log2 units; a row that saw no key (lse = -inf) gets +inf so that its P is exactly 0.
inline float lse_log2(const FwdArgs& f, int64_t b, int64_t h, int64_t i) {
  const float lse = f.lse[b * f.lse_batch_stride + h * f.lse_head_stride + i * f.lse_row_stride];
  return lse == -kInfinityF ? kInfinityF : lse * kLog2eF;
}

// True when every (query, key) pair of rows [i0, i1) x keys [j0, j1) is inside the window.
inline bool tile_fully_visible(const FwdArgs& f, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t offset = f.seqlen_k - f.seqlen_q;
  return j0 >= i1 - 1 + offset - f.window_left && j1 - 1 <= i0 + offset + f.window_right;
}

// [lo, hi) clipped to [0, kTile), as floats for select_in_range.
struct ColumnRange {
  float lo;
  float hi;
};
inline ColumnRange clip_columns(int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, 0);
  hi = std::min<int64_t>(hi, kTile);
  return {static_cast<float>(lo), static_cast<float>(std::max(lo, hi))};
}

// ---------------------------------------------------------------------------------------------
// delta_i = rowsum(dout_i * out_i)
// ---------------------------------------------------------------------------------------------

void row_dots(const BwdArgs& args, int64_t b, int64_t h, float* delta) {
  const FwdArgs& f = args.fwd;
  const int64_t dv = f.head_dim_v;
  const int64_t dv_pad = (dv + 15) / 16 * 16;
  alignas(64) float out_row[256];
  alignas(64) float dout_row[256];
  for (int64_t i = 0; i < f.seqlen_q; ++i) {
    load_row(element_address(f.out, f.dtype,
                             b * f.out_batch_stride + i * f.out_row_stride + h * f.out_head_stride),
             f.dtype, dv, dv_pad, out_row);
    load_row(element_address(
                 args.dout, f.dtype,
                 b * args.dout_batch_stride + i * args.dout_row_stride + h * args.dout_head_stride),
             f.dtype, dv, dv_pad, dout_row);
    Vec sum = Vec::zero();
    for (int64_t c = 0; c < dv_pad; c += kLanes) {
      sum = fma(Vec::load(out_row + c), Vec::load(dout_row + c), sum);
    }
    delta[i] = reduce_add(sum);
  }
}

// ---------------------------------------------------------------------------------------------
// Pass 1: dK, dV of one key block
// ---------------------------------------------------------------------------------------------

void dkdv_task(const BwdArgs& args, const BwdLayout& layout, const float* delta_all, int64_t b,
               int64_t head_k, int64_t key_block, float* scratch_base) {
  const FwdArgs& f = args.fwd;
  const BwdScratch s = BwdScratch::carve(scratch_base, layout);
  const int64_t d_pad = layout.d_pad, dv_pad = layout.dv_pad;
  const int64_t j0 = key_block * kTile;
  const int64_t keys = std::min(kTile, f.seqlen_k - j0);
  const int64_t offset = f.seqlen_k - f.seqlen_q;
  const int64_t group = f.group_size();
  const TileMath m = tile_math(args);
  const PhiloxKey dropout_rng = dropout_key(args.dropout_seed, args.dropout_offset);
  const uint32_t threshold = dropout_threshold(args.dropout_p);
  const float keep_scale = m.dropout ? 1.f / (1.f - args.dropout_p) : 1.f;
  float* dk = s.key_acc_or_kt;
  float* dv = s.value_acc_or_vt;
  float* qt = s.qt_or_dq;

  for (int64_t j = 0; j < keys; ++j) {
    load_row(element_address(
                 f.k, f.dtype,
                 b * f.k_batch_stride + (j0 + j) * f.k_row_stride + head_k * f.k_head_stride),
             f.dtype, f.head_dim, d_pad, s.k + j * d_pad);
    load_row(element_address(
                 f.v, f.dtype,
                 b * f.v_batch_stride + (j0 + j) * f.v_row_stride + head_k * f.v_head_stride),
             f.dtype, f.head_dim_v, dv_pad, s.v + j * dv_pad);
  }
  zero_floats(dk, keys * d_pad);
  zero_floats(dv, keys * dv_pad);

  // Query rows that see at least one key of the block.
  const int64_t i_first = std::max<int64_t>(0, j0 - offset - f.window_right);
  const int64_t i_last = std::min(f.seqlen_q - 1, j0 + keys - 1 - offset + f.window_left);
  for (int64_t g = 0; g < group && i_first <= i_last; ++g) {
    const int64_t h = head_k * group + g;
    const float slope = neg_slope_log2(f, b, h);
    for (int64_t i0 = i_first / kTile * kTile; i0 <= i_last; i0 += kTile) {
      const int64_t rows = std::min(kTile, f.seqlen_q - i0);
      for (int64_t r = 0; r < kTile; ++r) {
        if (r < rows) {
          const int64_t i = i0 + r;
          load_row(element_address(f.q, f.dtype,
                                   b * f.q_batch_stride + i * f.q_row_stride + h * f.q_head_stride),
                   f.dtype, f.head_dim, d_pad, s.q + r * d_pad);
          load_row(element_address(args.dout, f.dtype,
                                   b * args.dout_batch_stride + i * args.dout_row_stride +
                                       h * args.dout_head_stride),
                   f.dtype, f.head_dim_v, dv_pad, s.dout + r * dv_pad);
          s.lse2[r] = lse_log2(f, b, h, i);
          s.delta[r] = delta_all[(b * f.heads_q + h) * f.seqlen_q + i];
        } else {
          zero_floats(s.q + r * d_pad, d_pad);
          zero_floats(s.dout + r * dv_pad, dv_pad);
          s.lse2[r] = kInfinityF;  // P = 0 in padding columns
          s.delta[r] = 0.f;
        }
      }
      if (i0 + kTile <= i_last) {
        const int64_t next_rows = std::min(kTile, f.seqlen_q - i0 - kTile);
        prefetch_rows(f.q, f.dtype,
                      b * f.q_batch_stride + (i0 + kTile) * f.q_row_stride + h * f.q_head_stride,
                      f.q_row_stride, next_rows, f.head_dim);
        prefetch_rows(args.dout, f.dtype,
                      b * args.dout_batch_stride + (i0 + kTile) * args.dout_row_stride +
                          h * args.dout_head_stride,
                      args.dout_row_stride, next_rows, f.head_dim_v);
      }
      transpose_to_columns(s.q, d_pad, qt);
      transpose_to_columns(s.dout, dv_pad, s.doutt);
      gemm(keys, kTile, f.head_dim, s.k, d_pad, qt, kTile, s.s, kTile, false);
      gemm(keys, kTile, f.head_dim_v, s.v, dv_pad, s.doutt, kTile, s.dp, kTile, false);
      if (m.dropout) {
        for (int64_t r = 0; r < kTile; ++r) {
          for (int64_t jg = 0; jg < kTile; jg += 16) {
            const uint32_t bits =
                r < rows ? dropout_keep_bits16(dropout_rng, b, h, i0 + r, j0 + jg, threshold) : 0u;
            for (int64_t t = 0; t < 16 && jg + t < keys; ++t) {
              s.z[(jg + t) * kTile + r] = (bits >> t) & 1u ? keep_scale : 0.f;
            }
          }
        }
      }
      const bool mask = !tile_fully_visible(f, i0, i0 + rows, j0, j0 + keys);
      for (int64_t j = 0; j < keys; ++j) {
        const int64_t key = j0 + j;
        // Query i sees key j iff j - offset - window_right <= i <= j - offset + window_left.
        const ColumnRange range =
            clip_columns(key - offset - f.window_right - i0, key - offset + f.window_left - i0 + 1);
        tile_row_gradients<true>(m, slope, s.s + j * kTile, s.dp + j * kTile, s.z + j * kTile,
                                 s.lse2, s.delta, 0.f, 0.f, static_cast<float>(i0 + offset - key),
                                 mask, range.lo, range.hi);
      }
      gemm(keys, dv_pad, rows, s.s, kTile, s.dout, dv_pad, dv, dv_pad, true);
      gemm(keys, d_pad, rows, s.dp, kTile, s.q, d_pad, dk, d_pad, true);
    }
  }

  for (int64_t j = 0; j < keys; ++j) {
    const int64_t key = j0 + j;
    store_row(dk + j * d_pad, f.head_dim, f.softmax_scale, f.dtype,
              element_address(args.dk, f.dtype,
                              b * args.dk_batch_stride + key * args.dk_row_stride +
                                  head_k * args.dk_head_stride));
    store_row(dv + j * dv_pad, f.head_dim_v, 1.f, f.dtype,
              element_address(args.dv, f.dtype,
                              b * args.dv_batch_stride + key * args.dv_row_stride +
                                  head_k * args.dv_head_stride));
  }
}

// ---------------------------------------------------------------------------------------------
// Pass 2: dQ of one query block of one head
// ---------------------------------------------------------------------------------------------

void dq_task(const BwdArgs& args, const BwdLayout& layout, const float* delta_all, int64_t b,
             int64_t h, int64_t q_block, float* scratch_base) {
  const FwdArgs& f = args.fwd;
  const BwdScratch s = BwdScratch::carve(scratch_base, layout);
  const int64_t d_pad = layout.d_pad, dv_pad = layout.dv_pad;
  const int64_t i0 = q_block * kTile;
  const int64_t rows = std::min(kTile, f.seqlen_q - i0);
  const int64_t offset = f.seqlen_k - f.seqlen_q;
  const int64_t head_k = h / f.group_size();
  const TileMath m = tile_math(args);
  const float slope = neg_slope_log2(f, b, h);
  const PhiloxKey dropout_rng = dropout_key(args.dropout_seed, args.dropout_offset);
  const uint32_t threshold = dropout_threshold(args.dropout_p);
  const float keep_scale = m.dropout ? 1.f / (1.f - args.dropout_p) : 1.f;
  float* kt = s.key_acc_or_kt;
  float* vt = s.value_acc_or_vt;
  float* dq = s.qt_or_dq;

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    load_row(element_address(f.q, f.dtype,
                             b * f.q_batch_stride + i * f.q_row_stride + h * f.q_head_stride),
             f.dtype, f.head_dim, d_pad, s.q + r * d_pad);
    load_row(element_address(
                 args.dout, f.dtype,
                 b * args.dout_batch_stride + i * args.dout_row_stride + h * args.dout_head_stride),
             f.dtype, f.head_dim_v, dv_pad, s.dout + r * dv_pad);
    s.lse2[r] = lse_log2(f, b, h, i);
    s.delta[r] = delta_all[(b * f.heads_q + h) * f.seqlen_q + i];
  }
  zero_floats(dq, rows * d_pad);

  // Keys that at least one row of the block sees.
  const int64_t j_first = std::max<int64_t>(0, i0 + offset - f.window_left);
  const int64_t j_last = std::min(f.seqlen_k - 1, i0 + rows - 1 + offset + f.window_right);
  for (int64_t j0 = j_first / kTile * kTile; j0 <= j_last; j0 += kTile) {
    const int64_t keys = std::min(kTile, f.seqlen_k - j0);
    for (int64_t j = 0; j < kTile; ++j) {
      if (j < keys) {
        load_row(element_address(
                     f.k, f.dtype,
                     b * f.k_batch_stride + (j0 + j) * f.k_row_stride + head_k * f.k_head_stride),
                 f.dtype, f.head_dim, d_pad, s.k + j * d_pad);
        load_row(element_address(
                     f.v, f.dtype,
                     b * f.v_batch_stride + (j0 + j) * f.v_row_stride + head_k * f.v_head_stride),
                 f.dtype, f.head_dim_v, dv_pad, s.v + j * dv_pad);
      } else {
        zero_floats(s.k + j * d_pad, d_pad);
        zero_floats(s.v + j * dv_pad, dv_pad);
      }
    }
    if (j0 + kTile <= j_last) {
      const int64_t next_keys = std::min(kTile, f.seqlen_k - j0 - kTile);
      prefetch_rows(f.k, f.dtype,
                    b * f.k_batch_stride + (j0 + kTile) * f.k_row_stride + head_k * f.k_head_stride,
                    f.k_row_stride, next_keys, f.head_dim);
      prefetch_rows(f.v, f.dtype,
                    b * f.v_batch_stride + (j0 + kTile) * f.v_row_stride + head_k * f.v_head_stride,
                    f.v_row_stride, next_keys, f.head_dim_v);
    }
    transpose_to_columns(s.k, d_pad, kt);
    transpose_to_columns(s.v, dv_pad, vt);
    gemm(rows, kTile, f.head_dim, s.q, d_pad, kt, kTile, s.s, kTile, false);
    gemm(rows, kTile, f.head_dim_v, s.dout, dv_pad, vt, kTile, s.dp, kTile, false);
    if (m.dropout) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t jg = 0; jg < kTile; jg += 16) {
          const uint32_t bits = dropout_keep_bits16(dropout_rng, b, h, i0 + r, j0 + jg, threshold);
          for (int64_t t = 0; t < 16; ++t) {
            s.z[r * kTile + jg + t] = (bits >> t) & 1u ? keep_scale : 0.f;
          }
        }
      }
    }
    const bool mask = keys < kTile || !tile_fully_visible(f, i0, i0 + rows, j0, j0 + keys);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      // Key j is visible iff i + offset - window_left <= j <= i + offset + window_right, j < Sk.
      const ColumnRange range =
          clip_columns(i + offset - f.window_left - j0,
                       std::min(i + offset + f.window_right + 1, f.seqlen_k) - j0);
      tile_row_gradients<false>(m, slope, s.s + r * kTile, s.dp + r * kTile, s.z + r * kTile,
                                nullptr, nullptr, s.lse2[r], s.delta[r],
                                static_cast<float>(j0 - i - offset), mask, range.lo, range.hi);
    }
    gemm(rows, d_pad, keys, s.dp, kTile, s.k, d_pad, dq, d_pad, true);
  }

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    store_row(dq + r * d_pad, f.head_dim, f.softmax_scale, f.dtype,
              element_address(
                  args.dq, f.dtype,
                  b * args.dq_batch_stride + i * args.dq_row_stride + h * args.dq_head_stride));
  }
}
