// The direct decode block loop: attention for streaming tasks with at most kDirectMaxRows query
// rows per kv head (decode: Sq = 1 or a few positions, times the GQA group), reading K and V rows
// where they lie instead of packing them. Compiled once per ISA, included by fwd_<isa>.cc right
// after fwd_kernel-inl.h, whose helpers (task set-up, transforms, online softmax, dropout) it
// shares.
//
// Design. With R <= 12 query rows per kv head every K/V element is used only R times, so the
// packed path's conversion, transpose and copy of each block cost more than the products, and the
// memory stream idles while they run. Per block of 64 keys and per kv head of the task:
//   1. Scores. Each K row is converted to f32 one vector at a time (a shift for bf16) and
//      multiplied into R accumulator vectors, one per query row, whose q vectors come from L1:
//      R * D / lanes FMAs per key. The accumulators of `lanes` consecutive keys are then reduced
//      together by lane_sums, one vector of scores in about three instructions per score.
//   2. Softcap, ALiBi, mask, online softmax and dropout exactly as in the packed path, on the same
//      S rows (64 floats per row, in L1).
//   3. O += P V with R x kPvVecs accumulator tiles, V rows converted on load: the first column
//      tile reads the block's V rows from memory, the others find them in L1 (64 rows of at most
//      1 KiB).
// Rows of more than kDirectTileRows queries per kv head run the tiles once per group of rows; the
// later groups find K and V in L1.
//
// Memory traffic: each K and V row is read from memory once per task; q, S and O stay in L1.
// Rows are visited head by head, so consecutive reads of one head are a whole K/V row of every
// head apart and the hardware prefetchers, which stop at each 4 KiB page, see no stream. So while
// block b is computed, the loop prefetches block b + 1 into L2 (prefetcht1), one (row, head)
// piece per key computed, in memory order: rows ascending, heads inner, each unit of block b
// taking the next run of pieces. The next block is then swept front to back, as a streaming read
// would, about 16 KiB per kv head ahead of its use. Measured on the 2-core development VM
// (B8 Sk32768 bf16): 30 GB/s with the arithmetic removed, the machine's streaming-read rate; the
// arithmetic (about 100 vector instructions per key and head for 4 rows, D = 128) only partly
// overlaps it.

constexpr int kDirectTileRows = 4;
static_assert(kDirectMaxRows <= kMaxQBlockRows, "direct tasks must fit the scratch rows");
static_assert(kDirectTileRows == 4, "direct_scores and direct_pv dispatch tiles of 1 to 4 rows");

// Vector `index / lanes` of a row of kDtype values, as f32.
template <DType kDtype>
inline Vec load_converted(const void* row, int64_t index) {
  if constexpr (kDtype == DType::kF32) {
    return Vec::load(static_cast<const float*>(row) + index);
  } else if constexpr (kDtype == DType::kBF16) {
    return Vec::load_bf16(static_cast<const uint16_t*>(row) + index);
  } else {
    return Vec::load_f16(static_cast<const uint16_t*>(row) + index);
  }
}

// Elements [index, count) of a row of kDtype values as f32, zero in the lanes past `count`; never
// reads past element count - 1.
template <DType kDtype>
inline Vec load_converted_tail(const void* row, int64_t index, int64_t count) {
  alignas(64) float lanes[kLanes] = {};
  for (int64_t i = index; i < count; ++i) lanes[i - index] = load_element(row, kDtype, i);
  return Vec::load(lanes);
}

// Byte offsets, from k and v, of the rows of one key block for the task's first kv head; head h
// of the task adds h times the head stride.
struct BlockRows {
  int64_t keys = 0;  // keys of the block that exist
  int64_t k[kKeyBlock];
  int64_t v[kKeyBlock];
};

inline void locate_block(const FwdArgs& args, const SeqInfo& seq, int64_t head_k, int64_t block,
                         BlockRows* rows) {
  const int64_t j0 = block * kKeyBlock;
  const int64_t element_bytes = element_size(args.dtype);
  rows->keys = std::min(kKeyBlock, seq.seqlen_k - j0);
  key_row_offsets(args, seq, j0, rows->keys, head_k, args.k_batch_stride, args.k_row_stride,
                  args.k_head_stride, rows->k);
  key_row_offsets(args, seq, j0, rows->keys, head_k, args.v_batch_stride, args.v_row_stride,
                  args.v_head_stride, rows->v);
  for (int64_t j = 0; j < rows->keys; ++j) {
    rows->k[j] *= element_bytes;
    rows->v[j] *= element_bytes;
  }
}

// Where the rows of one (key block, kv head) are.
struct DirectUnit {
  int64_t keys = 0;
  const void* k_rows[kKeyBlock];
  const void* v_rows[kKeyBlock];
};

inline void locate_unit(const FwdArgs& args, const BlockRows& block, int64_t head,
                        DirectUnit* unit) {
  const char* k =
      static_cast<const char*>(args.k) + head * args.k_head_stride * element_size(args.dtype);
  const char* v =
      static_cast<const char*>(args.v) + head * args.v_head_stride * element_size(args.dtype);
  unit->keys = block.keys;
  for (int64_t j = 0; j < block.keys; ++j) {
    unit->k_rows[j] = k + block.k[j];
    unit->v_rows[j] = v + block.v[j];
  }
}

// Prefetches, one step per key a unit computes, a run of the next block's (row, head) pieces of K
// or V in memory order: rows ascending, the task's heads inner (all heads of a row are adjacent
// in the usual layouts, so the whole block is swept front to back across the units of a block).
class PrefetchCursor {
 public:
  PrefetchCursor() = default;
  // Pieces [first, first + count) of the block whose rows start at base + row_offsets[r], heads
  // head_stride_bytes apart, `bytes` each.
  PrefetchCursor(const char* base, const int64_t* row_offsets, int64_t heads,
                 int64_t head_stride_bytes, int64_t bytes, int64_t first, int64_t count)
      : base_(base),
        row_offsets_(row_offsets),
        heads_(heads),
        head_stride_bytes_(head_stride_bytes),
        bytes_(bytes),
        row_(first / heads),
        head_(first % heads),
        remaining_(count) {}

  void step() {
    if (remaining_ == 0) return;
    prefetch_bytes<true>(base_ + row_offsets_[row_] + head_ * head_stride_bytes_, bytes_);
    --remaining_;
    if (++head_ == heads_) {
      head_ = 0;
      ++row_;
    }
  }

 private:
  const char* base_ = nullptr;
  const int64_t* row_offsets_ = nullptr;
  int64_t heads_ = 1;
  int64_t head_stride_bytes_ = 0;
  int64_t bytes_ = 0;
  int64_t row_ = 0;
  int64_t head_ = 0;
  int64_t remaining_ = 0;
};

// s[r][j] = q_r . k_j for R query rows (stride ldq, zero from D to ldq) and the 64 keys of a block;
// keys past `keys` score 0 (the mask hides them).
template <DType kDtype, int R>
inline void direct_score_rows(const float* q, int64_t ldq, const void* const* k_rows, int64_t keys,
                              int64_t head_dim, PrefetchCursor* prefetch, float* s) {
  const int64_t full = head_dim / kLanes * kLanes;
  for (int64_t chunk = 0; chunk < kKeyBlock; chunk += kLanes) {
    Vec partial[R][kLanes];
    for (int64_t jj = 0; jj < kLanes; ++jj) {
      const int64_t j = chunk + jj;
      Vec acc[R];
      for (int r = 0; r < R; ++r) acc[r] = Vec::zero();
      if (j < keys) {
        if (prefetch != nullptr) prefetch->step();
        const void* k_row = k_rows[j];
        int64_t c = 0;
        for (; c < full; c += kLanes) {
          const Vec key = load_converted<kDtype>(k_row, c);
          for (int r = 0; r < R; ++r) acc[r] = fma(Vec::load(q + r * ldq + c), key, acc[r]);
        }
        if (c < head_dim) {
          const Vec key = load_converted_tail<kDtype>(k_row, c, head_dim);
          for (int r = 0; r < R; ++r) acc[r] = fma(Vec::load(q + r * ldq + c), key, acc[r]);
        }
      }
      for (int r = 0; r < R; ++r) partial[r][jj] = acc[r];
    }
    for (int r = 0; r < R; ++r) lane_sums(partial[r]).store(s + r * kKeyBlock + chunk);
  }
}

// o[r][col .. col + NV * lanes) += sum_{j < keys} p[r][j] v_j[col ..] for R rows (p stride 64,
// o stride ldo). kTail: one vector whose columns end at head_dim_v (read no further).
template <DType kDtype, int R, int NV, bool kTail>
inline void direct_pv_tile(const float* p, const void* const* v_rows, int64_t keys, int64_t col,
                           int64_t head_dim_v, PrefetchCursor* prefetch, float* o, int64_t ldo) {
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = Vec::load(o + r * ldo + col + n * kLanes);
  }
  for (int64_t j = 0; j < keys; ++j) {
    if (prefetch != nullptr) prefetch->step();
    Vec values[NV];
    for (int n = 0; n < NV; ++n) {
      values[n] = kTail ? load_converted_tail<kDtype>(v_rows[j], col, head_dim_v)
                        : load_converted<kDtype>(v_rows[j], col + n * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const Vec p_rj = Vec::broadcast(p[r * kKeyBlock + j]);
      for (int n = 0; n < NV; ++n) acc[r][n] = fma(p_rj, values[n], acc[r][n]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n].store(o + r * ldo + col + n * kLanes);
  }
}

// o[r][0 .. head_dim_v) += sum_{j < keys} p[r][j] v_j for R rows; the first column tile issues
// the prefetches.
template <DType kDtype, int R>
inline void direct_pv_rows(const float* p, const void* const* v_rows, int64_t keys,
                           int64_t head_dim_v, PrefetchCursor* prefetch, float* o, int64_t ldo) {
  const int64_t full = head_dim_v / kLanes * kLanes;
  int64_t c = 0;
  for (; c + kPvCols <= full; c += kPvCols) {
    direct_pv_tile<kDtype, R, kPvVecs, false>(p, v_rows, keys, c, head_dim_v,
                                              c == 0 ? prefetch : nullptr, o, ldo);
  }
  for (; c < full; c += kLanes) {
    direct_pv_tile<kDtype, R, 1, false>(p, v_rows, keys, c, head_dim_v, c == 0 ? prefetch : nullptr,
                                        o, ldo);
  }
  if (c < head_dim_v) {
    direct_pv_tile<kDtype, R, 1, true>(p, v_rows, keys, c, head_dim_v, c == 0 ? prefetch : nullptr,
                                       o, ldo);
  }
}

// S rows for `rows` query rows in tiles of kDirectTileRows; the first tile issues the prefetches.
template <DType kDtype>
inline void direct_scores(const float* q, int64_t ldq, int64_t rows, const DirectUnit& unit,
                          int64_t head_dim, PrefetchCursor* prefetch, float* s) {
  for (int64_t r = 0; r < rows; r += kDirectTileRows) {
    PrefetchCursor* tile_prefetch = r == 0 ? prefetch : nullptr;
    const float* q_tile = q + r * ldq;
    float* s_tile = s + r * kKeyBlock;
    switch (std::min<int64_t>(rows - r, kDirectTileRows)) {
      case 1:
        direct_score_rows<kDtype, 1>(q_tile, ldq, unit.k_rows, unit.keys, head_dim, tile_prefetch,
                                     s_tile);
        break;
      case 2:
        direct_score_rows<kDtype, 2>(q_tile, ldq, unit.k_rows, unit.keys, head_dim, tile_prefetch,
                                     s_tile);
        break;
      case 3:
        direct_score_rows<kDtype, 3>(q_tile, ldq, unit.k_rows, unit.keys, head_dim, tile_prefetch,
                                     s_tile);
        break;
      default:
        direct_score_rows<kDtype, 4>(q_tile, ldq, unit.k_rows, unit.keys, head_dim, tile_prefetch,
                                     s_tile);
        break;
    }
  }
}

// O rows += P V for `rows` query rows in tiles of kDirectTileRows; the first tile issues the
// prefetches.
template <DType kDtype>
inline void direct_pv(const float* p, int64_t rows, const DirectUnit& unit, int64_t head_dim_v,
                      PrefetchCursor* prefetch, float* o, int64_t ldo) {
  for (int64_t r = 0; r < rows; r += kDirectTileRows) {
    PrefetchCursor* tile_prefetch = r == 0 ? prefetch : nullptr;
    const float* p_tile = p + r * kKeyBlock;
    float* o_tile = o + r * ldo;
    switch (std::min<int64_t>(rows - r, kDirectTileRows)) {
      case 1:
        direct_pv_rows<kDtype, 1>(p_tile, unit.v_rows, unit.keys, head_dim_v, tile_prefetch, o_tile,
                                  ldo);
        break;
      case 2:
        direct_pv_rows<kDtype, 2>(p_tile, unit.v_rows, unit.keys, head_dim_v, tile_prefetch, o_tile,
                                  ldo);
        break;
      case 3:
        direct_pv_rows<kDtype, 3>(p_tile, unit.v_rows, unit.keys, head_dim_v, tile_prefetch, o_tile,
                                  ldo);
        break;
      default:
        direct_pv_rows<kDtype, 4>(p_tile, unit.v_rows, unit.keys, head_dim_v, tile_prefetch, o_tile,
                                  ldo);
        break;
    }
  }
}

template <DType kDtype>
void attend_direct_typed(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                         const Scratch& scratch) {
  const TaskRows rows = task_rows(task);
  const SeqInfo& seq = task.seq;
  const int64_t head_k = task.head_q_begin / args.group_size();
  const int64_t dv_pad = layout.dv_pad;
  float neg_slopes[kMaxQBlockRows];
  const ScoreTransform transform = task_transform(args, task, neg_slopes);
  begin_task(args, layout, task, rows, scratch);

  const TaskBlocks blocks = task_blocks(args, task);
  const int64_t rows_per_kv = rows.count / task.heads_k;
  const int64_t heads_per_kv = task.heads / task.heads_k;
  const int64_t k_row_bytes = args.head_dim * element_size(args.dtype);
  const int64_t v_row_bytes = args.head_dim_v * element_size(args.dtype);

  const int64_t k_head_stride_bytes = args.k_head_stride * element_size(args.dtype);
  const int64_t v_head_stride_bytes = args.v_head_stride * element_size(args.dtype);

  // Units in task order: block by block, the task's kv heads within a block. While block b is
  // computed, unit h prefetches the h-th of heads_k equal runs of block b + 1's pieces.
  BlockRows block_rows[2];
  int current = 0;
  if (blocks.begin < blocks.end) locate_block(args, seq, head_k, blocks.begin, &block_rows[0]);
  DirectUnit unit;
  for (int64_t block = blocks.begin; block < blocks.end; ++block) {
    const int64_t j0 = block * kKeyBlock;
    const bool crosses_boundary = blocks.crosses_boundary(j0);
    const BlockRows& this_block = block_rows[current];
    BlockRows& next_block = block_rows[1 - current];
    const bool has_next = block + 1 < blocks.end;
    if (has_next) locate_block(args, seq, head_k, block + 1, &next_block);
    const int64_t next_pieces = has_next ? next_block.keys * task.heads_k : 0;
    for (int64_t h = 0; h < task.heads_k; ++h) {
      locate_unit(args, this_block, h, &unit);
      const int64_t first = next_pieces * h / task.heads_k;
      const int64_t count = next_pieces * (h + 1) / task.heads_k - first;
      PrefetchCursor next_k(static_cast<const char*>(args.k), next_block.k, task.heads_k,
                            k_head_stride_bytes, k_row_bytes, first, count);
      PrefetchCursor next_v(static_cast<const char*>(args.v), next_block.v, task.heads_k,
                            v_head_stride_bytes, v_row_bytes, first, count);
      const int64_t r0 = h * rows_per_kv;
      const TaskRows head_rows{rows.q_begin, rows.positions, rows.head_begin + h * heads_per_kv,
                               rows_per_kv};
      float* s = scratch.s + r0 * kKeyBlock;
      float* o = scratch.o + r0 * dv_pad;
      const float* q = scratch.q + r0 * layout.q_stride;

      direct_scores<kDtype>(q, layout.q_stride, rows_per_kv, unit, args.head_dim, &next_k, s);
      scores_to_probabilities(args, seq, transform, neg_slopes + h * heads_per_kv, crosses_boundary,
                              head_rows, j0, s, scratch.m + r0, scratch.l + r0, o, dv_pad);
      if (crosses_boundary) {
        // Each row reads only the keys it may see: a masked key's probability is 0, and 0 times
        // an infinite or NaN value would otherwise leak NaN into the row.
        for (int64_t r = 0; r < rows_per_kv; ++r) {
          const VisibleRange range = visible_in_block(args, seq, head_rows.position(r), j0);
          direct_pv_rows<kDtype, 1>(s + r * kKeyBlock + range.lo, unit.v_rows + range.lo,
                                    range.hi - range.lo, args.head_dim_v, &next_v, o + r * dv_pad,
                                    dv_pad);
        }
      } else {
        direct_pv<kDtype>(s, rows_per_kv, unit, args.head_dim_v, &next_v, o, dv_pad);
      }
    }
    current = 1 - current;
  }

  finish_task(args, layout, task, rows, scratch);
}

void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch) {
  switch (args.dtype) {
    case DType::kBF16:
      attend_direct_typed<DType::kBF16>(args, layout, task, scratch);
      break;
    case DType::kF16:
      attend_direct_typed<DType::kF16>(args, layout, task, scratch);
      break;
    case DType::kF32:
    default:
      attend_direct_typed<DType::kF32>(args, layout, task, scratch);
      break;
  }
}
