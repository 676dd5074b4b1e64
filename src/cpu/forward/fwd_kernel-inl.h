// The fused forward block loop, written once against the Vec interface and compiled once per ISA.
//
// Included by fwd_<isa>.cc inside namespace anyattn::cpu::<isa>, inside that ISA's target region,
// after Vec (simd/vec_<isa>.h), exp2/tanh (simd/vec_math-inl.h) and the tile shape:
//   kScoreRows x kScoreVecs  query rows x key vectors of the S = Q K^T register tile
//   kPvRows x kPvVecs        query rows x output-column vectors of the O += P V register tile
// With ANYATTN_FWD_LANE_PRODUCTS (simd/traits_neon.h), Vec also has fma_lane<L>(a, b, c) = c + a[L] * b,
// and both micro-kernels read the broadcast operand (q, P) kLanes values at a time.
//
// Design (one AttendTask = up to 64 query rows of one head against a range of 64-key blocks):
//
//   Q rows are converted to f32 once per task, unscaled. The softmax multiplies the raw scores by
//   softmax_scale as it reads them (scaling q instead rounds every element of q, which at large
//   scores gives about three times the naive error), and applies log2(e) inside the exponent,
//   (s - max) * log2(e), never to q or to a score: folding it in earlier overflows or underflows
//   f32 for extreme scales and softcaps.
//   K and V were packed by pack_block once per (batch, kv head) and are shared by every task of
//   that kv head, including all query heads of a GQA group.
//
//   Per key block (64 keys):
//     1. S[rows][64] = Q K^T with a kScoreRows x (kScoreVecs * lanes) register tile: per head-dim
//        index d the tile loads kScoreVecs key vectors from the transposed panel kt[d][*] and
//        broadcasts one q value per row, i.e. kScoreRows * kScoreVecs FMAs for
//        kScoreRows + kScoreVecs loads. The 64-key panel (D * 256 bytes) stays in L1/L2 while all
//        row tiles of the task pass over it; S (16 KiB for 64 rows) stays in L1. Each d step also
//        prefetches one line of the next block's panel into L2 (PanelPrefetch). A block at the end
//        of the keys is scored (and its K packed) only up to its last whole key vector.
//     2. Softcap (vector tanh), ALiBi and the mask, in place on S. The mask is applied only to
//        blocks that cross a row's window boundary or the end of the keys; blocks outside every
//        row's window were never visited (the block range is clipped first).
//     3. Online softmax per row: new max, P = 2^(S - max) in place, running sum; the output
//        accumulators are rescaled only when the row max moves, and the max moves only when a
//        block's scores rise more than 2^8 above it (kStaleMaxHeadroom). Steps 2 and 3 read
//        only the block's keys rounded up to a whole vector; P past them is set to 0.
//     4. O[rows][dv_pad] += P V with a kPvRows x (kPvVecs * lanes) register tile over the packed
//        V rows, over the vectors that hold Dv's columns (pv_columns; the zero padding up to
//        dv_pad is skipped). O (64 rows x dv_pad floats) stays in L1/L2 for the whole task. On
//        boundary blocks each row tile stops after the last key its rows may see: on a causal
//        diagonal block that skips about half of the products. A Dv below one vector has V
//        packed transposed and takes one dot product per row and column instead
//        (accumulate_pv_transposed).
//   Memory traffic per task: Q rows once, each visited K/V block once from L2/L3, out/lse once.
//   Nothing of size Sq x Sk exists anywhere.

constexpr int kLanes = Vec::kLanes;
constexpr int64_t kScoreKeys = kScoreVecs * kLanes;
constexpr int64_t kPvCols = kPvVecs * kLanes;
static_assert(kKeyBlock % kScoreKeys == 0, "score tiles must divide the key block");
static_assert(16 % kLanes == 0, "dv_pad (a multiple of 16) must be a whole number of vectors");
constexpr float kNegInfinity = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// S = Q K^T micro-kernel
// ---------------------------------------------------------------------------------------------

// Prefetch of the next key block's packed panel into L2, spread over the score loops of the current
// block: each iteration of a score tile's head-dim loop issues one prefetcht1, so the 4 * (D + Dv)
// lines of a panel go out one per 38 or so instructions instead of in a burst, and the next block
// is in L2 when its first row tile starts. Without it that first tile waits on L3 for K (and the
// first P V tile for V) in every block: a pair's packed K/V (2 MiB at S = 2048, D = 128) is
// usually larger than L2. One block ahead is enough; two ahead gain nothing (measured:
// bench/MEASUREMENTS.md, "Design constants").
struct PanelPrefetch {
  const char* line;  // prefetched on the first iteration, then advanced by `step`
  int64_t step;      // 64, or 0 to prefetch one cached line over and over (nothing left to fetch)
};

// Hands out windows of the next panel, one per score tile, in order; the last window is moved
// back to end at the panel's end (re-prefetching a few lines) so that no prefetch leaves the panel.
class NextPanelPrefetch {
 public:
  // `next` (or null when this is the task's last block): the next panel, `bytes` long;
  // `current`: any line of the current panel, prefetched when nothing else is left.
  NextPanelPrefetch(const void* next, int64_t bytes, const void* current)
      : next_(static_cast<const char*>(next)),
        bytes_(next == nullptr ? 0 : bytes),
        idle_{static_cast<const char*>(current), 0} {}

  // The window for a tile whose loop runs `iterations` times.
  PanelPrefetch window(int64_t iterations) {
    const int64_t window_bytes = iterations * 64;
    if (offset_ >= bytes_ || window_bytes > bytes_) return idle_;
    const int64_t start = std::min(offset_, bytes_ - window_bytes);
    offset_ += window_bytes;
    return {next_ + start, 64};
  }

 private:
  const char* next_;
  int64_t bytes_;
  int64_t offset_ = 0;
  PanelPrefetch idle_;
};

// s[r][0..NV * lanes) = sum_d q[r][d] * kt[d][0..NV * lanes) for R rows, prefetching one line of
// `ahead` per d. q: R rows, stride ldq. kt: head_dim rows of kKeyBlock floats. s: R rows, stride
// kKeyBlock. NV is kScoreVecs except for the last tile of a block with fewer keys.
#if defined(ANYATTN_FWD_LANE_PRODUCTS)
// Head-dim indices d0 + L .. d0 + kLanes - 1 of score_tile (their prefetches issued by the caller),
// with q[r][d0 .. d0 + kLanes) in q_rows[r]: per index, the NV key vectors times lane L of each row
// (fma_lane).
template <int R, int NV, int L>
__attribute__((always_inline)) inline void score_lanes(const Vec (&q_rows)[R], const float* kt_d0,
                                                       Vec (&acc)[R][NV]) {
  if constexpr (L < kLanes) {
    Vec keys[NV];
    for (int n = 0; n < NV; ++n) keys[n] = Vec::load(kt_d0 + L * kKeyBlock + n * kLanes);
    for (int r = 0; r < R; ++r) {
      for (int n = 0; n < NV; ++n) acc[r][n] = fma_lane<L>(q_rows[r], keys[n], acc[r][n]);
    }
    score_lanes<R, NV, L + 1>(q_rows, kt_d0, acc);
  }
}
#endif

template <int R, int NV>
inline void score_tile(const float* q, int64_t ldq, const float* kt, int64_t head_dim, float* s,
                       PanelPrefetch ahead) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = Vec::zero();
  }
  int64_t d = 0;
#if defined(ANYATTN_FWD_LANE_PRODUCTS)
  // kLanes indices per step: one vector load of q per row instead of kLanes broadcasts (the same
  // FMAs in the same order, so the same sums).
  for (; d + kLanes <= head_dim; d += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      prefetch_line_l2(ahead.line);
      ahead.line += ahead.step;
    }
    Vec q_rows[R];
    for (int r = 0; r < R; ++r) q_rows[r] = Vec::load(q + r * ldq + d);
    score_lanes<R, NV, 0>(q_rows, kt + d * kKeyBlock, acc);
  }
#endif
  for (; d < head_dim; ++d) {
    prefetch_line_l2(ahead.line);
    ahead.line += ahead.step;
    Vec keys[NV];
    for (int n = 0; n < NV; ++n) keys[n] = Vec::load(kt + d * kKeyBlock + n * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec q_rd = Vec::broadcast(q[r * ldq + d]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fma(q_rd, keys[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n].store(s + r * kKeyBlock + n * kLanes);
  }
}

// The last tile of a block with fewer keys than a whole tile: score_tile with the `vectors` key
// vectors (1 <= vectors <= NV) that hold them.
template <int R, int NV>
inline void score_narrow_tile(int64_t vectors, const float* q, int64_t ldq, const float* kt,
                              int64_t head_dim, float* s, PanelPrefetch ahead) {
  if constexpr (NV > 1) {
    if (vectors < NV) {
      score_narrow_tile<R, NV - 1>(vectors, q, ldq, kt, head_dim, s, ahead);
      return;
    }
  }
  score_tile<R, NV>(q, ldq, kt, head_dim, s, ahead);
}

// Scores of the block's first `keys` keys, whole key vectors (the columns from
// round_up(keys, lanes) on are left as they were).
template <int R>
inline void score_rows(const float* q, int64_t ldq, const float* kt, int64_t head_dim,
                       int64_t keys, float* s, NextPanelPrefetch* ahead) {
  int64_t c = 0;
  for (; c + kScoreKeys <= keys; c += kScoreKeys) {
    score_tile<R, kScoreVecs>(q, ldq, kt + c, head_dim, s + c, ahead->window(head_dim));
  }
  if (c < keys) {
    score_narrow_tile<R, kScoreVecs>((keys - c + kLanes - 1) / kLanes, q, ldq, kt + c, head_dim,
                                     s + c, ahead->window(head_dim));
  }
}

// Rows that do not fill a whole tile: dispatch the remaining count R = rows to a fixed-size tile.
template <int R>
inline void score_remainder(int64_t rows, const float* q, int64_t ldq, const float* kt,
                            int64_t head_dim, int64_t keys, float* s, NextPanelPrefetch* ahead) {
  if constexpr (R >= 1) {
    if (rows == R) {
      score_rows<R>(q, ldq, kt, head_dim, keys, s, ahead);
    } else {
      score_remainder<R - 1>(rows, q, ldq, kt, head_dim, keys, s, ahead);
    }
  }
}

// S for `rows` query rows (q stride ldq) against the first `keys` keys of one packed key block
// (whole key vectors; the other columns of s are left as they were, for the mask to overwrite),
// prefetching the next block's panel (`next`, `next_bytes`; null for none) into L2 on the way.
inline void compute_scores(const float* q, int64_t ldq, int64_t rows, const float* kt,
                           int64_t head_dim, int64_t keys, float* s, const float* next,
                           int64_t next_bytes) {
  NextPanelPrefetch ahead(next, next_bytes, kt);
  int64_t r = 0;
  for (; r + kScoreRows <= rows; r += kScoreRows) {
    score_rows<kScoreRows>(q + r * ldq, ldq, kt, head_dim, keys, s + r * kKeyBlock, &ahead);
  }
  score_remainder<kScoreRows - 1>(rows - r, q + r * ldq, ldq, kt, head_dim, keys,
                                  s + r * kKeyBlock, &ahead);
}

// ---------------------------------------------------------------------------------------------
// O += P V micro-kernel
// ---------------------------------------------------------------------------------------------

// o[r][0..NV*lanes) += sum_{j < keys} p[r][j] * v[j][0..NV*lanes) for R rows.
// p: R rows, stride kKeyBlock. v: keys rows, stride ldv. o: R rows, stride ldo.
// Always inlined: called from the templated block loop attend_blocks<Products>, GCC 12 does not
// inline the main 6 x 4 tile by itself, and the call costs the f32 forward a few percent.
#if defined(ANYATTN_FWD_LANE_PRODUCTS)
// Keys j0 + L .. j0 + kLanes - 1 of pv_tile, with p[r][j0 .. j0 + kLanes) in p_rows[r]: per key,
// its NV value vectors times lane L of each row (fma_lane).
template <int R, int NV, int L>
__attribute__((always_inline)) inline void pv_lanes(const Vec (&p_rows)[R], const float* v_j0,
                                                    int64_t ldv, Vec (&acc)[R][NV]) {
  if constexpr (L < kLanes) {
    Vec values[NV];
    for (int n = 0; n < NV; ++n) values[n] = Vec::load(v_j0 + L * ldv + n * kLanes);
    for (int r = 0; r < R; ++r) {
      for (int n = 0; n < NV; ++n) acc[r][n] = fma_lane<L>(p_rows[r], values[n], acc[r][n]);
    }
    pv_lanes<R, NV, L + 1>(p_rows, v_j0, ldv, acc);
  }
}
#endif

template <int R, int NV>
__attribute__((always_inline)) inline void pv_tile(const float* p, const float* v, int64_t ldv,
                                                   int64_t keys, float* o, int64_t ldo) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = Vec::load(o + r * ldo + n * kLanes);
  }
  int64_t j = 0;
#if defined(ANYATTN_FWD_LANE_PRODUCTS)
  // kLanes keys per step: one vector load of p per row instead of kLanes broadcasts (the same
  // FMAs in the same order, so the same sums).
  for (; j + kLanes <= keys; j += kLanes) {
    Vec p_rows[R];
    for (int r = 0; r < R; ++r) p_rows[r] = Vec::load(p + r * kKeyBlock + j);
    pv_lanes<R, NV, 0>(p_rows, v + j * ldv, ldv, acc);
  }
#endif
  for (; j < keys; ++j) {
    Vec values[NV];
    for (int n = 0; n < NV; ++n) values[n] = Vec::load(v + j * ldv + n * kLanes);
    for (int r = 0; r < R; ++r) {
      const Vec p_rj = Vec::broadcast(p[r * kKeyBlock + j]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fma(p_rj, values[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n].store(o + r * ldo + n * kLanes);
  }
}

// Column vectors that do not fill a whole tile: dispatch the remaining count to a fixed size.
template <int R, int NV>
inline void pv_column_remainder(int64_t vectors, const float* p, const float* v, int64_t ldv,
                                int64_t keys, float* o, int64_t ldo) {
  if constexpr (NV >= 1) {
    if (vectors == NV) {
      pv_tile<R, NV>(p, v, ldv, keys, o, ldo);
    } else {
      pv_column_remainder<R, NV - 1>(vectors, p, v, ldv, keys, o, ldo);
    }
  }
}

// Columns [0, columns) of R rows (columns: a multiple of kLanes, at most dv_pad, the rows'
// stride in V and O).
template <int R>
inline void pv_rows(const float* p, const float* v, int64_t keys, float* o, int64_t dv_pad,
                    int64_t columns) {
  int64_t c = 0;
  for (; c + kPvCols <= columns; c += kPvCols)
    pv_tile<R, kPvVecs>(p, v + c, dv_pad, keys, o + c, dv_pad);
  pv_column_remainder<R, kPvVecs - 1>((columns - c) / kLanes, p, v + c, dv_pad, keys, o + c,
                                      dv_pad);
}

template <int R>
inline void pv_remainder(int64_t rows, const float* p, const float* v, int64_t keys, float* o,
                         int64_t dv_pad, int64_t columns) {
  if constexpr (R >= 1) {
    if (rows == R) {
      pv_rows<R>(p, v, keys, o, dv_pad, columns);
    } else {
      pv_remainder<R - 1>(rows, p, v, keys, o, dv_pad, columns);
    }
  }
}

// The columns of O that P V must update: Dv rounded up to whole vectors. The rest of dv_pad
// (Dv rounded up to 16) holds zeros in V and stays 0 in O: on 8-lane paths a small Dv (1 to 8)
// costs one vector per key instead of two.
inline int64_t pv_columns(int64_t head_dim_v) {
  return (head_dim_v + kLanes - 1) / kLanes * kLanes;
}

// O[rows][0..columns) += P[rows][0..keys) V[0..keys)[0..columns) (rows of V and O dv_pad apart).
// row_keys (or null): per row, where its probabilities become zero for good (the mask's right
// edge in a boundary block); each row tile stops at the largest of its rows, which on a causal
// diagonal block halves the work.
inline void accumulate_pv(const float* p, int64_t rows, const float* v, int64_t keys, float* o,
                          int64_t dv_pad, int64_t columns, const int64_t* row_keys) {
  int64_t r = 0;
  for (; r + kPvRows <= rows; r += kPvRows) {
    pv_rows<kPvRows>(p + r * kKeyBlock, v, tile_keys(row_keys, r, kPvRows, keys), o + r * dv_pad,
                     dv_pad, columns);
  }
  pv_remainder<kPvRows - 1>(rows - r, p + r * kKeyBlock, v, tile_keys(row_keys, r, rows - r, keys),
                            o + r * dv_pad, dv_pad, columns);
}

// ---------------------------------------------------------------------------------------------
// Score transforms, mask, online softmax
// ---------------------------------------------------------------------------------------------

// The query rows of a task: row r is position q_begin + r % positions of query head
// head_begin + r / positions.
struct TaskRows {
  int64_t q_begin;
  int64_t positions;
  int64_t head_begin;
  int64_t count;
  int64_t position(int64_t r) const { return q_begin + r % positions; }
  int64_t head(int64_t r) const { return head_begin + r / positions; }
};

// How one task's scores become the softmax's inputs: the mask and modifiers of its sequence
// (common/mask.h, held by the task's loop). S is the raw q . k on every path: q is not scaled
// (rounding q * softmax_scale would round every element of q, which at large scores gave about
// three times the naive error).
struct ScoreTransform {
  const Mask& mask;
  const float* neg_slope = nullptr;  // per query head of the rows: -slope
};

// Applies softcap, ALiBi and (when `apply_mask`) the window/end-of-keys mask to the raw scores of
// the task's rows for the key block starting at j0, and returns the factor f left to the softmax:
// afterwards a row holds u with score = u * f (rounded once, as the softmax forms it). The split
// is the backward's (tile_row_gradients), so that both compute every score the same way, rounding
// for rounding; the backward's P = exp(score - lse) then sums to 1 over a row as the forward's
// probabilities did, which keeps its error near the naive one.
//   the mask alone:        u = q.k,                                   f = softmax_scale
//   softcap, no ALiBi:     u = tanh(q.k * softmax_scale / softcap),   f = softcap
//   ALiBi:                 u = (softcap ? softcap * that tanh : q.k * softmax_scale) + ALiBi, f = 1
// Masked keys get u = -inf, which stays -inf times a positive f; a softmax_scale <= 0 is therefore
// applied here too (f = 1). Only the first `columns` scores of each row (a multiple of kLanes) are
// transformed: the softmax reads no others.
inline float transform_scores(const ScoreTransform& transform, bool apply_mask,
                              const TaskRows& rows, int64_t j0, int64_t columns, float* s) {
  const Mask& mask = transform.mask;
  const ScoreModifiers& modifiers = mask.modifiers();
  const bool fold_scale = !modifiers.softcap && (modifiers.alibi || !(modifiers.scale > 0.f));
  const float factor = fold_scale || modifiers.alibi ? 1.f
                       : modifiers.softcap          ? modifiers.cap
                                                    : modifiers.scale;
  const Vec iota = Vec::iota();
  const Vec negative_infinity = Vec::broadcast(kNegInfinity);
  const Vec cap = Vec::broadcast(modifiers.cap);
  const Vec scale = Vec::broadcast(modifiers.scale);
  const Vec tanh_scale_first = Vec::broadcast(modifiers.tanh_scale_first);
  const Vec tanh_scale_second = Vec::broadcast(modifiers.tanh_scale_second);
  for (int64_t r = 0; r < rows.count; ++r) {
    float* s_row = s + r * kKeyBlock;
    const int64_t i = rows.position(r);
    const KeyRange range =
        apply_mask ? mask.row_keys_in_block(i, j0, kKeyBlock) : KeyRange{0, kKeyBlock};
    const float lo = static_cast<float>(range.begin);
    const float hi = static_cast<float>(range.end);
    const Vec slope =
        Vec::broadcast(modifiers.alibi ? transform.neg_slope[r / rows.positions] : 0.f);
    // Distance origin for ALiBi: key j is at |diagonal - (j - j0)| from the diagonal.
    const Vec diagonal = Vec::broadcast(static_cast<float>(mask.diagonal(i) - j0));
    for (int64_t c = 0; c < columns; c += kLanes) {
      Vec x = Vec::load(s_row + c);
      const Vec position = iota + Vec::broadcast(static_cast<float>(c));
      if (modifiers.softcap) {
        x = tanh(x * tanh_scale_first * tanh_scale_second);
        if (modifiers.alibi) x = cap * x;
      } else if (fold_scale) {
        x = x * scale;
      }
      if (modifiers.alibi) x = fma(slope, abs(diagonal - position), x);
      if (apply_mask) x = select_in_range(x, position, lo, hi, negative_infinity);
      x.store(s_row + c);
    }
  }
  return factor;
}

// How far (in log2 units) a block's scores may rise above a row's running max before the max is
// moved. Below it the block's probabilities are taken relative to the old max: they stay under
// 2^8, far inside the f32 range, and the block costs no horizontal max and no rescaling of o. The
// row's partial (o, m, l) stays consistent, l = sum_j 2^((s_j - m) log2 e) for whatever m it
// holds, so out and lse are the same up to rounding.
constexpr float kStaleMaxHeadroom = 8.f;

// One online-softmax step for one row and one key block: s_row holds 64 values u whose scores are
// u * factor (transform_scores; masked = -inf) and becomes their probabilities relative to the
// row's max *m, which moves to the block's max only when a score exceeds it by more than
// kStaleMaxHeadroom (log2 units) or when the row has no max yet; o_row and the row's lane sums
// l_lanes (kLanes partial denominators) are rescaled when it moves. NaN scores make the row NaN,
// and so does a +inf score (an infinite input, or a product beyond the f32 range), as in exact
// arithmetic (inf - inf). Only the first `columns` values (a multiple of kLanes: the block's keys
// rounded up, kKeyBlock when kWholeBlock) are read; the probabilities past them are set to 0, as
// a masked score's would be, without computing them: a block at the end of a short sequence
// holds few keys.
template <bool kWholeBlock>
inline void online_softmax_row(float* s_row, int64_t columns, float factor, float* m,
                               float* l_lanes, float* o_row, int64_t dv_pad) {
  constexpr int kVectors = static_cast<int>(kKeyBlock / kLanes);
  const int vectors = kWholeBlock ? kVectors : static_cast<int>(columns / kLanes);
  const int64_t used = int64_t{vectors} * kLanes;
  for (int64_t c = used; !kWholeBlock && c < kKeyBlock; c += kLanes) Vec::zero().store(s_row + c);
  const float old_max = *m;
  const Vec log2e = Vec::broadcast(kLog2e);
  const Vec f = Vec::broadcast(factor);
  // The score u * f, rounded before the max is subtracted, as in the backward's s - lse (the
  // kernels are compiled without contraction, so the product is never fused into the
  // subtraction): the max key's exponent is exactly 0 at any magnitude.
  auto score = [&](int64_t c) { return Vec::load(s_row + c) * f; };
  if (std::isfinite(old_max)) {
    const Vec shift = Vec::broadcast(old_max);
    Vec exponents[kVectors];
    Vec highest = Vec::broadcast(kNegInfinity);
    for (int c = 0; c < vectors; ++c) {
      exponents[c] = (score(c * kLanes) - shift) * log2e;
      highest = max_keep_b_nan(exponents[c], highest);
    }
    if (!any_above(highest, kStaleMaxHeadroom)) {
      // Every exponent is <= 8 or NaN (`highest` skips NaN lanes but never becomes NaN itself);
      // a NaN makes the row NaN through l.
      Vec sum = Vec::zero();
      for (int c = 0; c < vectors; ++c) {
        const Vec p = exp2_not_above_128(exponents[c]);
        p.store(s_row + c * kLanes);
        sum = sum + p;
      }
      (Vec::load(l_lanes) + sum).store(l_lanes);
      return;
    }
  }
  Vec block_max_vec = score(0);
  for (int64_t c = kLanes; c < used; c += kLanes) {
    block_max_vec = max_keep_b_nan(score(c), block_max_vec);
  }
  float block_max = reduce_max(block_max_vec);
  if (block_max == kNegInfinity) {
    // Every lane is -inf or NaN; the vector max may have dropped a NaN, so look.
    for (int64_t j = 0; j < used; ++j) {
      if (std::isnan(s_row[j] * factor)) block_max = s_row[j] * factor;
    }
  }
  const float new_max = std::isnan(block_max) || block_max > old_max ? block_max : old_max;
  if (new_max == kNegInfinity) {
    for (int64_t c = 0; c < used; c += kLanes) Vec::zero().store(s_row + c);
    return;
  }
  const Vec shift = Vec::broadcast(new_max);
  Vec sum = Vec::zero();
  for (int64_t c = 0; c < used; c += kLanes) {
    // score - max is at most 0, but a NaN lane can hide a larger score from the vector max above
    // (the row is NaN then, through that NaN's probability): the exponent is clamped at 0.
    const Vec p = exp2_not_above_128(min_keep_b_nan(Vec::zero(), (score(c) - shift) * log2e));
    p.store(s_row + c);
    sum = sum + p;
  }
  Vec lanes = Vec::load(l_lanes);
  // A row with no max yet has l = 0 and o = 0 (or NaN, which a factor of 0 keeps): nothing to
  // rescale.
  if (!(new_max == old_max) && old_max != kNegInfinity) {
    const float alpha = std::exp(old_max - new_max);
    const Vec scale = Vec::broadcast(alpha);
    lanes = lanes * scale;
    for (int64_t c = 0; c < dv_pad; c += kLanes) (Vec::load(o_row + c) * scale).store(o_row + c);
  }
  (lanes + sum).store(l_lanes);
  *m = new_max;
}

// The denominator of a row whose lane sums are at l_lanes.
inline float row_denominator(const float* l_lanes) {
  return reduce_add(Vec::load(l_lanes));
}

// Dropout on one block of probabilities, after the softmax update (the denominator keeps every
// probability): P_ij becomes P_ij / (1 - p) where kept and 0 where dropped. The keep mask comes
// from common/philox.h, a pure function of (seed, offset, b, h, i, j) shared with the backward.
inline void apply_dropout(const FwdArgs& args, const SeqInfo& seq, const TaskRows& rows, int64_t j0,
                          float* s) {
  for (int64_t r = 0; r < rows.count; ++r) {
    float* p_row = s + r * kKeyBlock;
    for (int64_t c = 0; c < kKeyBlock; c += 16) {
      const uint32_t keep = dropout_keep_bits16(args.dropout_key, seq.batch, rows.head(r),
                                                rows.position(r), j0 + c, args.dropout_threshold);
      for (int t = 0; t < 16; ++t) {
        p_row[c + t] = (keep >> t) & 1u ? p_row[c + t] * args.dropout_scale : 0.f;
      }
    }
  }
}

// O += P V restricted, per row, to the keys the row may see. Used for boundary blocks whose V
// holds NaN or infinity, where 0 * inf from a masked key would otherwise leak NaN into the row.
inline void accumulate_pv_visible_only(const Mask& mask, const TaskRows& rows, int64_t j0,
                                       const float* p, const float* v, float* o, int64_t dv_pad,
                                       int64_t columns) {
  for (int64_t r = 0; r < rows.count; ++r) {
    const KeyRange range = mask.row_keys_in_block(rows.position(r), j0, kKeyBlock);
    for (int64_t j = range.begin; j < range.end; ++j) {
      const Vec p_rj = Vec::broadcast(p[r * kKeyBlock + j]);
      for (int64_t c = 0; c < columns; c += kLanes) {
        fma(p_rj, Vec::load(v + j * dv_pad + c), Vec::load(o + r * dv_pad + c))
            .store(o + r * dv_pad + c);
      }
    }
  }
}

// O[r][c] += sum_j P[r][j] V[j][c], c < Dv, from a transposed V panel (vt[c][64],
// v_panel_transposed): per row and column one dot product over the block's 64 keys, in four
// partial sums (P is 0 past the keys a row may see, and the panel 0 past the block's last key).
// With `visible` (boundary blocks whose V holds NaN or infinity) V counts as 0 outside each row's
// visible keys, so that a masked key's 0 * inf cannot reach the row; every row that sees no such
// value gets the bits of the plain loop (its masked terms are +0 either way).
inline void accumulate_pv_transposed(const float* p, const TaskRows& rows, const float* vt,
                                     float* o, int64_t dv_pad, int64_t head_dim_v,
                                     const Mask* visible, int64_t j0) {
  constexpr int kSums = 4;
  static_assert(kKeyBlock % (kSums * kLanes) == 0, "the partial sums must tile the block");
  const Vec iota = Vec::iota();
  for (int64_t r = 0; r < rows.count; ++r) {
    const float* p_row = p + r * kKeyBlock;
    KeyRange range{0, kKeyBlock};
    if (visible != nullptr) range = visible->row_keys_in_block(rows.position(r), j0, kKeyBlock);
    for (int64_t c = 0; c < head_dim_v; ++c) {
      const float* v_column = vt + c * kKeyBlock;
      Vec sums[kSums];
      for (int k = 0; k < kSums; ++k) sums[k] = Vec::zero();
      for (int64_t j = 0; j < kKeyBlock; j += kSums * kLanes) {
        for (int k = 0; k < kSums; ++k) {
          const int64_t key = j + k * kLanes;
          Vec v = Vec::load(v_column + key);
          if (visible != nullptr) {
            v = select_in_range(v, iota + Vec::broadcast(static_cast<float>(key)),
                                static_cast<float>(range.begin), static_cast<float>(range.end),
                                Vec::zero());
          }
          sums[k] = fma(Vec::load(p_row + key), v, sums[k]);
        }
      }
      o[r * dv_pad + c] += reduce_add((sums[0] + sums[1]) + (sums[2] + sums[3]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------------------------

// dst[0..n) = the n elements of `dtype` at src, as f32.
inline void convert_row(const void* src, DType dtype, int64_t n, float* dst) {
  int64_t i = 0;
  if (dtype == DType::kF32) {
    const float* from = static_cast<const float*>(src);
    for (; i + kLanes <= n; i += kLanes) Vec::load(from + i).store(dst + i);
  } else if (dtype == DType::kBF16) {
    const uint16_t* from = static_cast<const uint16_t*>(src);
    for (; i + kLanes <= n; i += kLanes) Vec::load_bf16(from + i).store(dst + i);
  } else {
    const uint16_t* from = static_cast<const uint16_t*>(src);
    for (; i + kLanes <= n; i += kLanes) Vec::load_f16(from + i).store(dst + i);
  }
  for (; i < n; ++i) dst[i] = load_element(src, dtype, i);
}

// A row of an 8-bit cache (kv_dtype), as f32: n stored values at element `offset` of `tensor`,
// each times `scale` (its descale times its token scale); other dtypes as convert_row (scale 1).
inline void convert_kv_row(const void* tensor, DType kv_dtype, int64_t offset, int64_t n,
                           float scale, float* dst) {
  const void* src = element_address(tensor, kv_dtype, offset);
  if (!is_kv8(kv_dtype)) {
    convert_row(src, kv_dtype, n, dst);
    return;
  }
  const uint8_t* from = static_cast<const uint8_t*>(src);
  const float load_scale = kv_load_scale(kv_dtype);
  const Vec factor = Vec::broadcast(scale * load_scale);
  int64_t i = 0;
  if (kv_dtype == DType::kI8) {
    for (; i + kLanes <= n; i += kLanes) (Vec::load_i8(from + i) * factor).store(dst + i);
  } else if (kv_dtype == DType::kFp8E5M2) {
    for (; i + kLanes <= n; i += kLanes) (Vec::load_fp8_e5m2(from + i) * factor).store(dst + i);
  } else if (std::isfinite(scale * load_scale)) {
    for (; i + kLanes <= n; i += kLanes) (Vec::load_fp8_e4m3(from + i) * factor).store(dst + i);
  } else {
    // A descale from 2^120 on: scale * 2^8 overflows, so the read's 2^-8 is undone first (exact).
    const Vec unload = Vec::broadcast(load_scale);
    const Vec scale_only = Vec::broadcast(scale);
    for (; i + kLanes <= n; i += kLanes) {
      (Vec::load_fp8_e4m3(from + i) * unload * scale_only).store(dst + i);
    }
  }
  for (; i < n; ++i) dst[i] = load_element(src, kv_dtype, i) * scale;
}

// Keys ahead of the row being converted whose rows are prefetched into L1 (kPrefetchKeys) and,
// earlier, into L2 (kPrefetchKeysL2): the hardware prefetchers stop at every 4 KiB page, and with
// all heads of a key row contiguous a page holds only one or two rows, so without this the core
// waits on memory at almost every row. The L2 step keeps the L1 fill buffers from waiting a whole
// trip to memory (as in the direct decode loop; docs/design.md, section 6); 24 to 64 keys ahead
// perform alike (measured: bench/MEASUREMENTS.md, "Design constants").
constexpr int64_t kPrefetchKeys = 8;
constexpr int64_t kPrefetchKeysL2 = 32;

// Prefetches the row of key `key` (absolute, within `seq`) of kv head `head` of `tensor` (k or v,
// with its strides, `bytes` per row) kPrefetchKeys keys ahead into L1 and kPrefetchKeysL2 keys
// ahead into L2, wherever those keys exist.
inline void prefetch_rows_ahead(const FwdArgs& args, const SeqInfo& seq, const void* tensor,
                                int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                                int64_t key, int64_t head, int64_t bytes) {
  if (key + kPrefetchKeys < seq.seqlen_k) {
    const int64_t ahead =
        key_row_offset(args, seq, key + kPrefetchKeys, head, batch_stride, row_stride, head_stride);
    prefetch_bytes(element_address(tensor, args.kv_dtype, ahead), bytes);
  }
  if (key + kPrefetchKeysL2 < seq.seqlen_k) {
    const int64_t ahead = key_row_offset(args, seq, key + kPrefetchKeysL2, head, batch_stride,
                                         row_stride, head_stride);
    prefetch_bytes_l2(element_address(tensor, args.kv_dtype, ahead), bytes);
  }
}

// Whether the V panels of a call hold V transposed, vt[c][64] for c < Dv, instead of its rows: for
// Dv below one vector. P V then takes, per row and column, one dot product over the block's keys
// (64 / kLanes FMAs and a reduction; accumulate_pv_transposed), where the row tiles would do one
// broadcast FMA per key for a vector of which only Dv lanes count.
inline bool v_panel_transposed(int64_t head_dim_v) {
  return head_dim_v < kLanes;
}

// Writes the f32 V rows of a key block into the V region of `heads_k` consecutive panels: each row
// zero from Dv to dv_pad (or, for a transposed panel, each column zero past the block's last key),
// and per head a running check for NaN and infinity.
class VPanelWriter {
 public:
  VPanelWriter(const FwdArgs& args, const PackedLayout& layout, float* panels, int64_t heads_k)
      : args_(args),
        layout_(layout),
        panels_(panels),
        heads_k_(heads_k),
        transposed_(v_panel_transposed(args.head_dim_v)) {
    for (int64_t h = 0; h < heads_k; ++h) finite_check_[h] = Vec::zero();
  }
  // Where row j of head h's V goes: its panel row, or for a transposed panel a buffer that
  // finish_row scatters into the columns.
  float* row(int64_t h, int64_t j) {
    if (transposed_) return transposed_row_;
    return v_region(h) + j * layout_.dv_pad;
  }
  // Completes row j of head h once its Dv values are written: zeroes it past Dv (or scatters it
  // into the columns) and checks it.
  void finish_row(int64_t h, int64_t j) {
    // Every product x * 0 is 0 for finite x and NaN for NaN or +-inf.
    if (transposed_) {
      float check = 0.f;
      for (int64_t c = 0; c < args_.head_dim_v; ++c) {
        v_region(h)[c * kKeyBlock + j] = transposed_row_[c];
        check += transposed_row_[c] * 0.f;
      }
      finite_check_[h] = finite_check_[h] + Vec::broadcast(check);
      return;
    }
    float* v_row = row(h, j);
    for (int64_t c = args_.head_dim_v; c < layout_.dv_pad; ++c) v_row[c] = 0.f;
    for (int64_t c = 0; c < layout_.dv_pad; c += kLanes) {
      finite_check_[h] = finite_check_[h] + Vec::load(v_row + c) * Vec::zero();
    }
  }
  // Converts the block's `keys` V rows from args.v (key row j0 + j of kv head head_k + h), row by
  // row for all heads (the rows of all heads are contiguous), prefetching ahead as it goes.
  void convert_rows(const SeqInfo& seq, int64_t head_k, int64_t j0, int64_t keys) {
    const FwdArgs& args = args_;
    for (int64_t j = 0; j < keys; ++j) {
      for (int64_t h = 0; h < heads_k_; ++h) {
        prefetch_rows_ahead(args, seq, args.v, args.v_batch_stride, args.v_row_stride,
                            args.v_head_stride, j0 + j, head_k + h,
                            args.head_dim_v * element_size(args.kv_dtype));
        const int64_t offset = key_row_offset(args, seq, j0 + j, head_k + h, args.v_batch_stride,
                                              args.v_row_stride, args.v_head_stride);
        convert_kv_row(args.v, args.kv_dtype, offset, args.head_dim_v,
                       key_scale(args, seq, j0 + j, head_k + h, KvStream::kV), row(h, j));
        finish_row(h, j);
      }
    }
  }
  // Once the block's `keys` rows are finished: zeroes a transposed panel's columns past them
  // (P V reads all 64), and sets block_flags[h] = kBlockVNonfinite if head h's V holds a NaN or
  // an infinity, else 0.
  void finish(int64_t keys, uint8_t* block_flags) {
    for (int64_t h = 0; h < heads_k_; ++h) {
      for (int64_t c = 0; transposed_ && c < args_.head_dim_v; ++c) {
        std::fill(v_region(h) + c * kKeyBlock + keys, v_region(h) + (c + 1) * kKeyBlock, 0.f);
      }
      block_flags[h] = std::isnan(reduce_add(finite_check_[h])) ? kBlockVNonfinite : 0;
    }
  }

 private:
  float* v_region(int64_t h) const {
    return panels_ + h * layout_.block_floats + layout_.kt_floats;
  }

  const FwdArgs& args_;
  const PackedLayout& layout_;
  float* panels_;
  int64_t heads_k_;
  bool transposed_;
  float transposed_row_[kLanes] = {};
  Vec finite_check_[kMaxQBlockRows];
};

// Packs key block `block` of kv heads [head_k, head_k + heads_k) of sequence `seq` into
// `heads_k` consecutive panels of PackedLayout::block_floats floats, and sets block_flags[h] to
// kBlockVNonfinite if head h's packed V holds a NaN or infinity, else 0.
//
// Memory order: each key row is read for all heads before the next row (rows of one head are
// Hk * D elements apart, rows of all heads are contiguous), so a multi-head call sweeps memory
// sequentially. K rows are converted into `staging` (heads_k * lanes rows of round_up(D, 16)
// floats) one chunk of `lanes` keys at a time and transposed tile by tile into kt[d][j]. A block
// at the end of the keys fills kt only up to its last whole key vector (zeros past its last key):
// the score tiles read no further. V gets the block's rows only: P V stops at its last key, so
// the rows past it are never read (nor written: a 16-key call would otherwise zero 48 rows).
//
// A shared latent cache (FwdArgs::v_is_k_prefix: absorbed MLA) has V row j at the start of K row
// j: V is then copied from the staged K rows, so the block's rows are read from memory once.
void pack_block_heads(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                      int64_t head_k, int64_t heads_k, int64_t block, float* panels, float* staging,
                      uint8_t* block_flags) {
  const int64_t j0 = block * kKeyBlock;
  const int64_t keys = std::min(kKeyBlock, seq.seqlen_k - j0);
  const int64_t head_dim = args.head_dim;
  const int64_t head_dim_v = args.head_dim_v;
  const int64_t d_pad = round_up(head_dim, kLanes);
  const int64_t stage_stride = round_up(head_dim, 16);

  VPanelWriter v_panels(args, layout, panels, heads_k);
  const bool v_from_k = args.v_is_k_prefix();

  alignas(64) float transposed[kLanes * kLanes];
  const int64_t staged_keys = round_up(keys, kLanes);
  for (int64_t chunk = 0; chunk < staged_keys; chunk += kLanes) {
    for (int64_t jj = 0; jj < kLanes; ++jj) {
      const int64_t j = chunk + jj;
      for (int64_t h = 0; h < heads_k; ++h) {
        float* staged = staging + (h * kLanes + jj) * stage_stride;
        prefetch_rows_ahead(args, seq, args.k, args.k_batch_stride, args.k_row_stride,
                            args.k_head_stride, j0 + j, head_k + h,
                            head_dim * element_size(args.kv_dtype));
        if (j < keys) {
          const int64_t offset = key_row_offset(args, seq, j0 + j, head_k + h, args.k_batch_stride,
                                                args.k_row_stride, args.k_head_stride);
          convert_kv_row(args.k, args.kv_dtype, offset, head_dim,
                         key_scale(args, seq, j0 + j, head_k + h, KvStream::kK), staged);
          for (int64_t d = head_dim; d < d_pad; ++d) staged[d] = 0.f;
        } else {
          for (int64_t d = 0; d < d_pad; d += kLanes) Vec::zero().store(staged + d);
        }
        if (v_from_k && j < keys) {
          std::copy(staged, staged + head_dim_v, v_panels.row(h, j));
          v_panels.finish_row(h, j);
        }
      }
    }
    for (int64_t h = 0; h < heads_k; ++h) {
      const float* stage = staging + h * kLanes * stage_stride;
      float* kt = panels + h * layout.block_floats;
      for (int64_t d0 = 0; d0 < d_pad; d0 += kLanes) {
        if (d0 + kLanes <= head_dim) {
          transpose_tile(stage + d0, stage_stride, kt + d0 * kKeyBlock + chunk, kKeyBlock);
        } else {
          transpose_tile(stage + d0, stage_stride, transposed, kLanes);
          for (int64_t d = d0; d < head_dim; ++d) {
            Vec::load(transposed + (d - d0) * kLanes).store(kt + d * kKeyBlock + chunk);
          }
        }
      }
    }
  }

  if (!v_from_k) v_panels.convert_rows(seq, head_k, j0, keys);
  v_panels.finish(keys, block_flags);
}

// ---------------------------------------------------------------------------------------------
// The task
// ---------------------------------------------------------------------------------------------

// Turns the scores of the rows of one kv head for the key block at j0 into probabilities, in
// place: softcap, ALiBi and (on boundary blocks) the mask, the online softmax (which rescales the
// rows of o whose max moved) and dropout. neg_slopes: the negated ALiBi slope of each query head
// of head_rows; keys: the block's keys (its columns from round_up(keys, kLanes) on are set to 0
// without being read); m, l, o: the rows' running max, denominator and output.
inline void scores_to_probabilities(const FwdArgs& args, const SeqInfo& seq,
                                    ScoreTransform transform, const float* neg_slopes,
                                    bool crosses_boundary, const TaskRows& head_rows, int64_t j0,
                                    int64_t keys, float* s, float* m, float* l, float* o,
                                    int64_t dv_pad) {
  const ScoreModifiers& modifiers = transform.mask.modifiers();
  float factor = modifiers.scale;  // S is the raw q . k
  const int64_t columns = round_up(keys, kLanes);
  if (modifiers.softcap || modifiers.alibi || crosses_boundary) {
    transform.neg_slope = neg_slopes;
    factor = transform_scores(transform, crosses_boundary, head_rows, j0, columns, s);
  }
  for (int64_t r = 0; r < head_rows.count; ++r) {
    float* const s_row = s + r * kKeyBlock;
    if (columns == kKeyBlock) {
      online_softmax_row<true>(s_row, columns, factor, m + r, l + r * kRowSumSlots,
                               o + r * dv_pad, dv_pad);
    } else {
      online_softmax_row<false>(s_row, columns, factor, m + r, l + r * kRowSumSlots,
                                o + r * dv_pad, dv_pad);
    }
  }
  if (args.dropout_threshold != 0) apply_dropout(args, seq, head_rows, j0, s);
}

// The rows of a task.
inline TaskRows task_rows(const AttendTask& task) {
  const int64_t positions = task.q_end - task.q_begin;
  return TaskRows{task.q_begin, positions, task.head_q_begin, positions * task.heads};
}

// The transform of a task whose sequence's mask is `mask`; neg_slopes (room for kMaxQBlockRows
// heads) receives the negated ALiBi slope of each of the task's query heads.
inline ScoreTransform task_transform(const Mask& mask, const AttendTask& task, float* neg_slopes) {
  for (int64_t h = 0; mask.modifiers().alibi && h < task.heads; ++h) {
    neg_slopes[h] = mask.neg_alibi_slope(task.head_q_begin + h);
  }
  return ScoreTransform{mask, neg_slopes};
}

// Loads the task's query rows into scratch.q (converted to f32, rotated for a KV cache with rotary,
// zero from D to q_stride; not scaled).
inline void load_query_rows(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                            const TaskRows& rows, const Scratch& scratch) {
  const SeqInfo& seq = task.seq;
  const int64_t head_dim = args.head_dim;
  for (int64_t r = 0; r < rows.count; ++r) {
    const int64_t offset =
        seq.q_offset + rows.position(r) * args.q_row_stride + rows.head(r) * args.q_head_stride;
    float* q_row = scratch.q + r * layout.q_stride;
    convert_row(element_address(args.q, args.dtype, offset), args.dtype, head_dim, q_row);
    if (args.rotary_cos != nullptr) {
      const int64_t position =
          args.q_position[seq.batch] + (args.rotary_q_per_row ? rows.position(r) : 0);
      apply_rotary(args.rotary_cos + position * args.rotary_stride,
                   args.rotary_sin + position * args.rotary_stride, args.rotary_dim,
                   args.rotary_interleaved, q_row);
    }
    for (int64_t d = head_dim; d < layout.q_stride; ++d) q_row[d] = 0.f;
  }
}

// Resets the running max, denominator and output of the task's rows.
inline void reset_rows(const PackedLayout& layout, const TaskRows& rows, const Scratch& scratch) {
  const int64_t dv_pad = layout.dv_pad;  // held in a register: the stores below are floats
  for (int64_t r = 0; r < rows.count; ++r) {
    scratch.m[r] = kNegInfinity;
    Vec::zero().store(scratch.l + r * kRowSumSlots);
    for (int64_t c = 0; c < dv_pad; c += kLanes) Vec::zero().store(scratch.o + r * dv_pad + c);
  }
}

// dst[0, n) = src[0, n) narrowed to f16, a vector at a time (Vec::store_f16) and the tail with
// the scalar conversion that gives the same bits.
inline void store_f16_row(const float* src, int64_t n, uint16_t* dst) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) Vec::load(src + c).store_f16(dst + c);
  for (; c < n; ++c) dst[c] = f32_to_f16(src[c]);
}

// Writes the task's rows: its partial (o, m, l) when the key range is split, else the final out
// and lse rows.
inline void finish_task(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                        const TaskRows& rows, const Scratch& scratch) {
  const int64_t dv_pad = layout.dv_pad;
  if (task.partial.o != nullptr) {
    for (int64_t r = 0; r < rows.count; ++r) {
      const float* o_row = scratch.o + r * dv_pad;
      float* partial_o = task.partial.o + r * task.partial.o_row_stride;
      for (int64_t c = 0; c < dv_pad; c += kLanes) Vec::load(o_row + c).store(partial_o + c);
      task.partial.m[r * task.partial.ml_row_stride] = scratch.m[r];
      task.partial.l[r * task.partial.ml_row_stride] =
          row_denominator(scratch.l + r * kRowSumSlots);
    }
    return;
  }
  const SeqInfo& seq = task.seq;
  const ScoreModifiers modifiers = ScoreModifiers::of(args);
  for (int64_t r = 0; r < rows.count; ++r) {
    const int64_t i = rows.position(r);
    const int64_t head_q = rows.head(r);
    const float denominator = row_denominator(scratch.l + r * kRowSumSlots);
    RowPartials parts;
    parts.o = scratch.o + r * dv_pad;
    parts.m = scratch.m + r;
    parts.l = &denominator;
    void* out_row =
        element_address(args.out, args.dtype,
                        seq.out_offset + i * args.out_row_stride + head_q * args.out_head_stride);
    float* lse = args.lse == nullptr ? nullptr
                                     : args.lse + seq.lse_offset + head_q * args.lse_head_stride +
                                           i * args.lse_row_stride;
    if (args.dtype == DType::kF16) {
      // Narrowed with the path's vector conversion: the bits of convert::f32_to_f16, whose
      // scalar branches took 40% of a 16-key f16 call.
      alignas(64) float staged[kMaxStagedColumns];
      combine_and_store_row(parts, modifiers.sinks, modifiers.sink(head_q), args.head_dim_v,
                            DType::kF32, staged, lse);
      store_f16_row(staged, args.head_dim_v, static_cast<uint16_t*>(out_row));
    } else {
      combine_and_store_row(parts, modifiers.sinks, modifiers.sink(head_q), args.head_dim_v,
                            args.dtype, out_row, lse);
    }
  }
}

// The key blocks a task visits: those any of its rows may see, clipped to its split.
inline KeyRange task_blocks(const Mask& mask, const AttendTask& task) {
  const KeyRange visible = mask.visible_blocks(task.q_begin, task.q_end, kKeyBlock);
  return {std::max(task.block_begin, visible.begin), std::min(task.block_end, visible.end)};
}

// True when the block at j0 holds a key some row of the task may not see (it needs the mask).
inline bool block_crosses_boundary(const Mask& mask, const AttendTask& task, int64_t j0) {
  return mask.crosses_boundary(task.q_begin, task.q_end, j0, kKeyBlock);
}

// The rows' visible key ends in the block at j0 (Mask::row_keys_in_block's end), for
// accumulate_pv.
inline void boundary_row_keys(const Mask& mask, const TaskRows& rows, int64_t j0,
                              int64_t* row_keys) {
  for (int64_t r = 0; r < rows.count; ++r) {
    row_keys[r] = mask.row_keys_in_block(rows.position(r), j0, kKeyBlock).end;
  }
}

// o[r][c] += p[r][j] * v[j][c] in f32 for the NaN and infinite entries of V (as convert_kv_row
// reads it) in the block at j0, read from the source where a packed 16-bit block holds 0
// (amx/fwd_tiles_amx-inl.h, and the value pairs of forward/fwd_narrow_scores-inl.h), and the rows
// that see key j.
inline void add_nonfinite_values(const FwdArgs& args, const SeqInfo& seq, const Mask& mask,
                                 const TaskRows& rows, int64_t j0, int64_t keys, const float* p,
                                 float* o, int64_t dv_pad) {
  const int64_t head_k = rows.head_begin / args.group_size();
  float v_row[kMaxHeadDimV];
  for (int64_t j = 0; j < keys; ++j) {
    const int64_t offset = key_row_offset(args, seq, j0 + j, head_k, args.v_batch_stride,
                                          args.v_row_stride, args.v_head_stride);
    convert_kv_row(args.v, args.kv_dtype, offset, args.head_dim_v,
                   key_scale(args, seq, j0 + j, head_k, KvStream::kV), v_row);
    for (int64_t c = 0; c < args.head_dim_v; ++c) {
      if (std::isfinite(v_row[c])) continue;
      for (int64_t r = 0; r < rows.count; ++r) {
        const KeyRange range = mask.row_keys_in_block(rows.position(r), j0, kKeyBlock);
        if (j >= range.begin && j < range.end) o[r * dv_pad + c] += p[r * kKeyBlock + j] * v_row[c];
      }
    }
  }
}

// The two block products and what they need, as the vector micro-kernels above compute them: q in
// f32, K and V packed as f32 panels (fwd_layout.h). attend_blocks is written against
// this interface (one object per task); a path with other products (fwd_tiles_amx-inl.h) supplies
// its own.
struct VectorProducts {
  void load_queries(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                    const TaskRows& rows, const Scratch& scratch) {
    load_query_rows(args, layout, task, rows, scratch);
  }
  static void pack(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                   int64_t head_k, int64_t heads_k, int64_t block, float* panels, float* staging,
                   uint8_t* block_flags) {
    pack_block_heads(args, layout, seq, head_k, heads_k, block, panels, staging, block_flags);
  }
  // S for `rows` rows (q at q) against the first `keys` keys of the packed block kt; the columns
  // past them (a block at the end of the keys) are left for the mask.
  void scores(const FwdArgs& args, const PackedLayout& layout, const float* q, int64_t rows,
              const float* kt, int64_t keys, uint8_t /*block_flags*/, float* s,
              const float* next_panel) {
    compute_scores(q, layout.q_stride, rows, kt, args.head_dim, keys, s, next_panel,
                   layout.block_floats * 4);
  }
  // O += P V for the rows of one kv head (head_rows) and the block at j0 (`keys` keys). On
  // boundary blocks each row tile stops after its rows' last visible key; boundary blocks whose
  // V holds NaN or infinity take the visible keys only (a masked key's P = 0 times infinity would
  // be NaN); elsewhere every probability multiplied belongs to a visible key. A Dv below one
  // vector takes the transposed panel's dot products instead.
  void pv(const FwdArgs& args, const SeqInfo& /*seq*/, const Mask& mask,
          const TaskRows& head_rows, int64_t j0, int64_t keys, bool crosses_boundary,
          uint8_t block_flags, float* p, const float* v, float* o, int64_t dv_pad) const {
    const bool nonfinite_boundary = crosses_boundary && (block_flags & kBlockVNonfinite) != 0;
    if (v_panel_transposed(args.head_dim_v)) {
      accumulate_pv_transposed(p, head_rows, v, o, dv_pad, args.head_dim_v,
                               nonfinite_boundary ? &mask : nullptr, j0);
      return;
    }
    const int64_t columns = pv_columns(args.head_dim_v);
    if (nonfinite_boundary) {
      accumulate_pv_visible_only(mask, head_rows, j0, p, v, o, dv_pad, columns);
    } else if (crosses_boundary) {
      int64_t row_keys[kMaxQBlockRows];
      boundary_row_keys(mask, head_rows, j0, row_keys);
      accumulate_pv(p, head_rows.count, v, keys, o, dv_pad, columns, row_keys);
    } else {
      accumulate_pv(p, head_rows.count, v, keys, o, dv_pad, columns, nullptr);
    }
  }
  // Nothing is deferred: every pv call has updated O when it returns.
  void finish() {}
};

// One AttendTask with the block products of `Products`.
template <class Products>
void attend_blocks(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch) {
  const TaskRows rows = task_rows(task);
  const int64_t dv_pad = layout.dv_pad;
  const int64_t head_k = task.head_q_begin / args.group_size();
  const SeqInfo& seq = task.seq;
  const Mask mask(args, seq);
  float neg_slopes[kMaxQBlockRows];
  const ScoreTransform transform = task_transform(mask, task, neg_slopes);
  Products products;
  products.load_queries(args, layout, task, rows, scratch);
  reset_rows(layout, rows, scratch);

  const KeyRange blocks = task_blocks(mask, task);
  // Rows of kv head h of the task: [h * rows_per_kv, (h + 1) * rows_per_kv).
  const int64_t rows_per_kv = rows.count / task.heads_k;
  const int64_t heads_per_kv = task.heads / task.heads_k;
  uint8_t stream_flags[kMaxQBlockRows];
  for (int64_t block = blocks.begin; block < blocks.end; ++block) {
    const int64_t j0 = block * kKeyBlock;
    const bool streaming = task.packed == nullptr;
    if (streaming) {
      Products::pack(args, layout, seq, head_k, task.heads_k, block, scratch.panel, scratch.staging,
                     stream_flags);
    }
    const bool crosses_boundary = block_crosses_boundary(mask, task, j0);
    const int64_t keys = std::min(kKeyBlock, seq.seqlen_k - j0);
    for (int64_t h = 0; h < task.heads_k; ++h) {
      const float* kt = streaming ? scratch.panel + h * layout.block_floats
                                  : task.packed + (block - task.block_begin) * layout.block_floats;
      const uint8_t block_flags =
          streaming ? stream_flags[h] : task.block_flags[block - task.block_begin];
      const float* v_panel = kt + layout.kt_floats;
      const int64_t r0 = h * rows_per_kv;
      const TaskRows head_rows{rows.q_begin, rows.positions, rows.head_begin + h * heads_per_kv,
                               rows_per_kv};
      float* s = scratch.s + r0 * kKeyBlock;
      float* o = scratch.o + r0 * dv_pad;
      // The packed panels of a (batch, kv head) are consecutive; streamed panels are built here.
      const float* next_panel =
          !streaming && block + 1 < blocks.end ? kt + layout.block_floats : nullptr;
      products.scores(args, layout, scratch.q + r0 * layout.q_stride, rows_per_kv, kt, keys,
                      block_flags, s, next_panel);
      scores_to_probabilities(args, seq, transform, neg_slopes + h * heads_per_kv, crosses_boundary,
                              head_rows, j0, keys, s, scratch.m + r0,
                              scratch.l + r0 * kRowSumSlots, o, dv_pad);
      products.pv(args, seq, mask, head_rows, j0, keys, crosses_boundary, block_flags, s,
                  v_panel, o, dv_pad);
    }
  }

  products.finish();
  finish_task(args, layout, task, rows, scratch);
}

#if defined(ANYATTN_FWD_BF16_TILES)
// This path packs and attends bf16 calls with tile products, and everything else as above.
#include "cpu/amx/fwd_tiles_amx-inl.h"
#elif defined(ANYATTN_FWD_NARROW_SCORES)
// This path scores bf16 calls on pairwise dot products (and, on the neon path, f16 calls on FMLAL)
// where the CPU has them.
#include "cpu/forward/fwd_narrow_scores-inl.h"
#else
void pack_block(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq, int64_t head_k,
                int64_t block, float* dst, uint8_t* block_flags, float* staging) {
  pack_block_heads(args, layout, seq, head_k, 1, block, dst, staging, block_flags);
}

void attend(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
            const Scratch& scratch) {
  attend_blocks<VectorProducts>(args, layout, task, scratch);
}
#endif
