// The direct decode block loop: attention for streaming tasks with at most the path's direct_rows
// query rows per kv head (isa_table.inc: 12, 20 on avx2 and avx512; decode: Sq = 1 or a few
// positions, times the GQA group), reading K and V rows where they lie instead of packing them.
// Compiled once per ISA, included by fwd_<isa>.cc right after fwd_kernel-inl.h, whose helpers
// (task set-up, transforms, online softmax, dropout) it shares.
//
// Design. With R <= direct_rows query rows per kv head every K/V element is used only R times, so
// the packed path's conversion, transpose and copy of each block cost more than the products, and
// the memory stream idles while they run. Per block of 64 keys:
//   1. Scores, in passes of kDirectChunkKeys (16) keys and one kv head: chunk by chunk, and within
//      a chunk kv head by kv head. A task holds several kv heads (up to 8 for a GQA group of 4)
//      whose parts of a key row lie side by side, so the loop reads each key row of the task
//      within a short time instead of one head's 256-byte slice of it per pass over the block.
//      Within a pass, kDirectKeyGroup keys at a time (4 on AVX-512), each K row is converted to
//      f32 one vector at a time and multiplied into R x G accumulators, so each q vector loaded
//      from L1 serves G keys (held in a register: on AVX2 GCC would otherwise re-read it per key).
//      bf16 rows are widened two vectors per load (even and odd elements: a shift and a mask for
//      2 * lanes values), with q held in the same even/odd order. The
//      accumulators of `lanes` consecutive keys are then reduced together by lane_sums, one
//      vector of scores in about three instructions per score. bf16 calls on the avx512 path, on
//      an AMD or Hygon CPU with AVX512_BF16, score on VDPBF16PS instead, and on the neon path, on
//      a CPU with FEAT_BF16, on BFDOT (fwd_decode_bf16_dot.h: raw bf16 q, no widening, half the
//      instructions), except for kv heads whose q holds values that instruction would flush or
//      lose (load_bf16_head_queries). q is never scaled: the softmax
//      applies softmax_scale.
//   2. Softmax, kv head by kv head: softcap, ALiBi, mask, online softmax and dropout exactly as
//      in the packed path, on the same S rows (64 floats per row, in L1).
//   3. O += P V in the same passes, with R x kPvVecs accumulator tiles loaded from and stored to
//      scratch.o once per pass and column tile, V rows converted on load (bf16 in even/odd pairs
//      again, O kept in that order until the task ends): the first column tile reads the pass's
//      16 V rows from memory, the others find them in L1.
// Rows of more than kDirectTileRows queries per kv head run the tiles once per group of rows; the
// later groups find K and V in L1.
//
// Memory traffic: each K and V row is read from memory once per task; q, S and O stay in L1 (O
// is read and written once per pass: 16 keys' worth of FMAs per load and store). The hardware
// prefetchers barely follow these reads, so the loop prefetches each row itself
// (PassPrefetcher): into L2 a whole chunk or more ahead, in ascending memory order where the
// layout allows it, and into L1 a few keys ahead in the order the passes read them, each line's
// two hints next to the load of a line of the current row: spread over the arithmetic rather than
// in a burst per key, the far ones in ascending memory order. Reading in passes over the task's
// kv heads, rather than a whole block per kv head, reads each key row within a short time, as if
// the cache held one kv head in contiguous rows (docs/design.md, section 6; measured:
// bench/MEASUREMENTS.md, "Prefetch hints spread over the loads", "Memory order" and "Far prefetch
// hints in ascending memory order").

constexpr int kDirectTileRows = 4;
// Passes of kDirectChunkKeys keys (fwd_layout.h) reduce whole vectors of scores.
static_assert(kDirectChunkKeys % kLanes == 0, "lane_sums reduces whole vectors of keys");
static_assert(kDirectTileRows == 4, "for_each_row_tile dispatches tiles of 1 to 4 rows");

// Bytes per element of a K/V row of kDtype.
template <DType kDtype>
constexpr int64_t kRowElementBytes = kDtype == DType::kF32 ? 4 : is_kv8(kDtype) ? 1 : 2;

// How the direct loop widens e4m3 bytes (each other dtype has one way):
//   kDirect   Vec::load_fp8_e4m3_direct: the value times 2^-kE4m3DirectExponent (2^-120 on the
//             x86 paths: three integer instructions, no F16C). Each query row is scaled up to
//             match (scale_e4m3_queries) and the probabilities with their V factors (KeyScales),
//             so that the products are the unscaled ones, exactly.
//   kViaHalf  Vec::load_fp8_e4m3_finite: the value times 2^-8, through an f16. For the P V of a
//             block whose V factors are too large for the direct read's scale (a probability
//             times both could overflow: KeyScales); and for every read of a call on a CPU that
//             is slow on f32 subnormal operands (e4m3_reads_as_f32_bits): there the direct
//             read's subnormals, every code below 2^-6, cost a microcode assist per instruction.
// Both give the format's NaN code a finite value (restored afterwards: restore_e4m3_nan_scores).
// A call's key read (kKeyRead below) is one of the two; its V blocks read the same, or kViaHalf.
enum class E4m3Read { kDirect, kViaHalf };
template <E4m3Read kRead>
constexpr int kE4m3LoadExponent = kRead == E4m3Read::kDirect ? Vec::kE4m3DirectExponent : 8;
// Whether a call whose key read is kKeyRead has a second read for its wide V blocks (on paths
// whose kDirect is the f16 read, and for calls that read keys kViaHalf, it would repeat it).
template <E4m3Read kKeyRead>
constexpr bool kE4m3TwoReads = kE4m3LoadExponent<kKeyRead> !=
                               kE4m3LoadExponent<E4m3Read::kViaHalf>;

// Vector `index / lanes` of a row of kDtype values, as f32 (an 8-bit cache: the stored values,
// e4m3 times 2^-kE4m3LoadExponent<kRead>, whose scales the loop applies to the scores and
// probabilities instead).
template <DType kDtype, E4m3Read kRead = E4m3Read::kDirect>
inline Vec load_converted(const void* row, int64_t index) {
  if constexpr (kDtype == DType::kF32) {
    return Vec::load(static_cast<const float*>(row) + index);
  } else if constexpr (kDtype == DType::kI8) {
    return Vec::load_i8(static_cast<const uint8_t*>(row) + index);
  } else if constexpr (kDtype == DType::kFp8E5M2) {
    return Vec::load_fp8_e5m2(static_cast<const uint8_t*>(row) + index);
  } else if constexpr (kDtype == DType::kFp8E4M3 && kRead == E4m3Read::kDirect) {
    return Vec::load_fp8_e4m3_direct(static_cast<const uint8_t*>(row) + index);
  } else if constexpr (kDtype == DType::kFp8E4M3) {
    return Vec::load_fp8_e4m3_finite(static_cast<const uint8_t*>(row) + index);
  } else if constexpr (kDtype == DType::kBF16) {
    return Vec::load_bf16(static_cast<const uint16_t*>(row) + index);
  } else {
    return Vec::load_f16(static_cast<const uint16_t*>(row) + index);
  }
}

// Elements [index, count) of a row of kDtype values as f32, zero in the lanes past `count`; never
// reads past element count - 1. e4m3 values come scaled as from load_converted.
template <DType kDtype, E4m3Read kRead = E4m3Read::kDirect>
inline Vec load_converted_tail(const void* row, int64_t index, int64_t count) {
  alignas(64) float lanes[kLanes] = {};
  const float unscale =  // exact
      kDtype == DType::kFp8E4M3 ? std::ldexp(1.f, -kE4m3LoadExponent<kRead>) : 1.f;
  for (int64_t i = index; i < count; ++i) {
    lanes[i - index] = load_element(row, kDtype, i) * unscale;
  }
  return Vec::load(lanes);
}

// e4m3 rows are read in forms that give the format's NaN code S.1111.111 a finite value, and save
// three or more instructions per vector. The loop watches each pass's rows for that code (K rows
// as the score loop reads them, E4m3NanProbe; V rows after the pass, e4m3_rows_have_nan; none is
// found in a cache of finite values) and where it is found writes NaN where the exact reads would
// have given it: the scores of every query row for a key whose K row holds the code, and the
// output columns where a V row holds it, in every query row that multiplied that V row
// (probability 0 included: 0 times NaN is NaN).

// Watches e4m3 rows for the NaN code as a loop reads them: the bytes are OR-ed with 0x80 and
// max-ed into one vector of 32 (two vector instructions per 32 bytes, issued among the score
// loop's FMAs, on the line it is reading), and found() reduces it once: the code is the byte that
// gives 0xFF.
struct E4m3NanProbe {
  typedef uint8_t Bytes __attribute__((vector_size(32)));
  Bytes largest = {};
  uint8_t tail_largest = 0;

  __attribute__((always_inline)) void add32(const uint8_t* p) {
    Bytes x;
    std::memcpy(&x, p, sizeof(x));
    x |= 0x80;
    largest = largest > x ? largest : x;
  }
  __attribute__((always_inline)) void add(const uint8_t* p, int64_t n) {
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) add32(p + i);
    for (; i < n; ++i) tail_largest = std::max<uint8_t>(tail_largest, p[i] | 0x80);
  }
  void merge(const E4m3NanProbe& other) {
    largest = largest > other.largest ? largest : other.largest;
    tail_largest = std::max(tail_largest, other.tail_largest);
  }
  bool found() const {
    uint8_t all = tail_largest;
    for (int i = 0; i < 32; ++i) all = std::max<uint8_t>(all, largest[i]);
    return all == 0xFF;
  }
};

// Whether one of the `count` rows of n bytes at rows[0 .. count) holds the e4m3 NaN code.
inline bool e4m3_rows_have_nan(const void* const* rows, int64_t count, int64_t n) {
  E4m3NanProbe probe;
  for (int64_t j = 0; j < count; ++j) probe.add(static_cast<const uint8_t*>(rows[j]), n);
  return probe.found();
}
inline bool e4m3_row_has_nan(const void* row, int64_t n) { return e4m3_rows_have_nan(&row, 1, n); }

// s[r][j] = NaN for r < rows (stride kKeyBlock) and the keys j < keys whose K row (head_dim
// bytes at k_rows[j]) holds the NaN code; for passes whose E4m3NanProbe found one.
inline void restore_e4m3_nan_scores(const void* const* k_rows, int64_t keys, int64_t head_dim,
                                    int64_t rows, float* s) {
  for (int64_t j = 0; j < keys; ++j) {
    if (!e4m3_row_has_nan(k_rows[j], head_dim)) continue;
    for (int64_t r = 0; r < rows; ++r) {
      s[r * kKeyBlock + j] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// o[r][c] = NaN for r < rows (stride ldo) and the columns c < head_dim_v where one of the V rows
// v_rows[0 .. keys) holds the NaN code (after one e4m3_rows_have_nan over them all).
inline void restore_e4m3_nan_outputs(const void* const* v_rows, int64_t keys, int64_t head_dim_v,
                                     int64_t rows, float* o, int64_t ldo) {
  if (!e4m3_rows_have_nan(v_rows, keys, head_dim_v)) return;
  for (int64_t j = 0; j < keys; ++j) {
    if (!e4m3_row_has_nan(v_rows[j], head_dim_v)) continue;
    const uint8_t* bytes = static_cast<const uint8_t*>(v_rows[j]);
    for (int64_t c = 0; c < head_dim_v; ++c) {  // rare: the scalar conversion names the columns
      if (!std::isnan(convert::fp8_e4m3_to_f32(bytes[c]))) continue;
      for (int64_t r = 0; r < rows; ++r) o[r * ldo + c] = std::numeric_limits<float>::quiet_NaN();
    }
  }
}

// Byte offsets, from k and v, of the rows of one key block for the task's first kv head; head h
// of the task adds h times the head stride.
struct BlockRows {
  int64_t keys = 0;  // keys of the block that exist
  int64_t k[kKeyBlock];
  int64_t v[kKeyBlock];
  // 8-bit caches with token scales: the element offsets of the keys' K and V token scales for the
  // task's first kv head (head h adds h times the scale's head stride).
  int64_t k_scale[kKeyBlock];
  int64_t v_scale[kKeyBlock];
};

inline void locate_block(const FwdArgs& args, const SeqInfo& seq, int64_t head_k, int64_t block,
                         BlockRows* rows) {
  const int64_t j0 = block * kKeyBlock;
  const int64_t element_bytes = element_size(args.kv_dtype);
  rows->keys = std::min(kKeyBlock, seq.seqlen_k - j0);
  if (args.k_token_scale != nullptr) {
    key_row_offsets(args, seq, j0, rows->keys, head_k, args.k_scale_batch_stride,
                    args.k_scale_row_stride, args.k_scale_head_stride, rows->k_scale);
    key_row_offsets(args, seq, j0, rows->keys, head_k, args.v_scale_batch_stride,
                    args.v_scale_row_stride, args.v_scale_head_stride, rows->v_scale);
  }
  key_row_offsets(args, seq, j0, rows->keys, head_k, args.k_batch_stride, args.k_row_stride,
                  args.k_head_stride, rows->k);
  key_row_offsets(args, seq, j0, rows->keys, head_k, args.v_batch_stride, args.v_row_stride,
                  args.v_head_stride, rows->v);
  for (int64_t j = 0; j < rows->keys; ++j) {
    rows->k[j] *= element_bytes;
    rows->v[j] *= element_bytes;
  }
}

// bf16 rows are widened a pair of vectors at a time (load_bf16_pairs: even and odd elements of
// 2 * lanes values, two instructions instead of four), over their first paired_columns(n)
// elements. q and O hold those columns in the same order, each chunk of 2 * lanes as (even
// elements, odd elements): split_pairs reorders q after load_query_rows, join_pairs restores O
// before finish_task. Other dtypes keep the plain order.
template <DType kDtype>
constexpr bool kPairedWidening = kDtype == DType::kBF16;
constexpr int64_t kPairCols = 2 * kLanes;

template <DType kDtype>
inline int64_t paired_columns(int64_t n) {
  return kPairedWidening<kDtype> ? n / kPairCols * kPairCols : 0;
}

// Reorders each chunk of 2 * lanes elements of row[0, n) to (even elements, odd elements);
// n is a multiple of 2 * lanes.
inline void split_pairs(float* row, int64_t n) {
  float chunk[kPairCols];
  for (int64_t c = 0; c < n; c += kPairCols) {
    for (int64_t i = 0; i < kLanes; ++i) {
      chunk[i] = row[c + 2 * i];
      chunk[kLanes + i] = row[c + 2 * i + 1];
    }
    for (int64_t i = 0; i < kPairCols; ++i) row[c + i] = chunk[i];
  }
}

// The inverse of split_pairs.
inline void join_pairs(float* row, int64_t n) {
  float chunk[kPairCols];
  for (int64_t c = 0; c < n; c += kPairCols) {
    for (int64_t i = 0; i < kPairCols; ++i) chunk[i] = row[c + i];
    for (int64_t i = 0; i < kLanes; ++i) {
      row[c + 2 * i] = chunk[i];
      row[c + 2 * i + 1] = chunk[kLanes + i];
    }
  }
}

// acc[r][g] += q_r[0 .. lanes) * key[g] for R query rows (stride ldq) and G key vectors.
template <DType kDtype, int R, int G>
__attribute__((always_inline)) inline void fma_key_vectors(const float* q, int64_t ldq,
                                                           const Vec* key, Vec (&acc)[R][G]) {
  for (int r = 0; r < R; ++r) {
    // Loaded into a register once for the G keys: GCC would otherwise fold a load of it into
    // each FMA, and the loop would be bound by its loads (two per cycle; measured:
    // bench/MEASUREMENTS.md, "The direct loop's q in registers").
    const Vec q_vec = Vec::load_in_register(q + r * ldq);
    for (int g = 0; g < G; ++g) acc[r][g] = fma(q_vec, key[g], acc[r][g]);
  }
}

// partial[r * lanes + first + g] = lane-wise partial products of q_r . k_g for R query rows
// (stride ldq, paired order over paired_columns(head_dim)) and G keys; the lanes of each sum to
// the score. The R x G accumulators are independent chains, and each q vector loaded serves G
// keys. With `prefetch`, each 64 bytes loaded from the rows of keys pass_key .. pass_key + G - 1
// come with that line's hints (PassPrefetcher::score_hints: line()'s targets, as bases per key).
// With `nan_probe` (e4m3 rows), the keys' row bytes are added to it, each whole line next to its
// hints. Always inlined: as a call GCC 12 kept the accumulators in a stack array (zeroed, stored
// and copied on every call), which slowed the loop markedly (measured: bench/MEASUREMENTS.md,
// "Design constants").
template <DType kDtype, E4m3Read kRead, int R, int G, bool kFarInMemoryOrder>
__attribute__((always_inline)) inline void direct_key_group(
    const float* q, int64_t ldq, const void* const* k_rows, int64_t head_dim, Vec* partial,
    int64_t first, const PassPrefetcher* prefetch, int64_t pass_key, E4m3NanProbe* nan_probe) {
  constexpr int64_t kElementBytes = kRowElementBytes<kDtype>;
  const int64_t row_lines = (head_dim * kElementBytes + 63) / 64;
  // The keys' hint bases; without a prefetcher (kFarInMemoryOrder is then false) each hint asks
  // for the line the loop loads, which costs less than a branch per line.
  constexpr int64_t kFarStep = PassPrefetcher::score_far_step<kFarInMemoryOrder>(G);
  PassPrefetcher::RowHints hints[G];
  for (int g = 0; g < G; ++g) {
    const char* row = static_cast<const char*>(k_rows[g]);
    hints[g] = prefetch != nullptr
                   ? prefetch->score_hints<kFarInMemoryOrder>(pass_key, g, G, row_lines)
                   : PassPrefetcher::RowHints{row, row};
  }
  // Called at each 64-byte line start of the rows (a vector may be half a line).
  auto prefetch_lines = [&](int64_t column) __attribute__((always_inline)) {
    const int64_t offset = column * kElementBytes;
    for (int g = 0; g < G; ++g) {
      prefetch_line_l1(hints[g].near + offset);
      prefetch_line_l2(hints[g].far + offset * kFarStep);
    }
  };
  Vec acc[R][G];
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) acc[r][g] = Vec::zero();
  }
  auto paired_step = [&](int64_t c) __attribute__((always_inline)) {
    Vec even[G], odd[G];
    for (int g = 0; g < G; ++g) {
      Vec::load_bf16_pairs(static_cast<const uint16_t*>(k_rows[g]) + c, &even[g], &odd[g]);
    }
    fma_key_vectors<kDtype, R, G>(q + c, ldq, even, acc);
    fma_key_vectors<kDtype, R, G>(q + c + kLanes, ldq, odd, acc);
  };
  auto plain_step = [&](int64_t c) __attribute__((always_inline)) {
    Vec key[G];
    for (int g = 0; g < G; ++g) key[g] = load_converted<kDtype, kRead>(k_rows[g], c);
    fma_key_vectors<kDtype, R, G>(q + c, ldq, key, acc);
  };
  // Whole 64-byte lines of the rows first, each line's hints and then its steps, so that the
  // loop tests no line start per step; then the steps of the rest, the hints at line starts.
  constexpr int64_t kLineColumns = 64 / kElementBytes;
  const int64_t paired = paired_columns<kDtype>(head_dim);
  const int64_t full = head_dim / kLanes * kLanes;
  int64_t c = 0;
  if constexpr (kPairedWidening<kDtype>) {
    static_assert(kLineColumns % kPairCols == 0, "paired steps must tile a line");
    for (; c + kLineColumns <= paired; c += kLineColumns) {
      prefetch_lines(c);
      for (int64_t step = 0; step < kLineColumns; step += kPairCols) paired_step(c + step);
    }
    for (; c < paired; c += kPairCols) {
      if (c * kElementBytes % 64 == 0) prefetch_lines(c);
      paired_step(c);
    }
  }
  static_assert(kLineColumns % kLanes == 0, "steps must tile a line");
  constexpr bool kProbe = kDtype == DType::kFp8E4M3;
  E4m3NanProbe probe;  // in registers until merged into *nan_probe
  auto probe_bytes = [&](int64_t column, int64_t bytes) __attribute__((always_inline)) {
    for (int g = 0; g < G; ++g) probe.add(static_cast<const uint8_t*>(k_rows[g]) + column, bytes);
  };
  if (c * kElementBytes % 64 == 0) {
    for (; c + kLineColumns <= full; c += kLineColumns) {
      prefetch_lines(c);
      if constexpr (kProbe) {
        if (nan_probe != nullptr) probe_bytes(c, 64);
      }
      for (int64_t step = 0; step < kLineColumns; step += kLanes) plain_step(c + step);
    }
  }
  if constexpr (kProbe) {
    if (nan_probe != nullptr) {
      probe_bytes(c, head_dim - c);
      nan_probe->merge(probe);
    }
  }
  for (; c < full; c += kLanes) {
    if (c * kElementBytes % 64 == 0) prefetch_lines(c);
    plain_step(c);
  }
  if (c < head_dim) {
    if (c * kElementBytes % 64 == 0) prefetch_lines(c);
    Vec key[G];
    for (int g = 0; g < G; ++g) {
      key[g] = load_converted_tail<kDtype, kRead>(k_rows[g], c, head_dim);
    }
    fma_key_vectors<kDtype, R, G>(q + c, ldq, key, acc);
  }
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) partial[r * kLanes + first + g] = acc[r][g];
  }
}

// s[r][j] = q_r . k_j for R query rows (stride ldq, zero from D to ldq) and the kDirectChunkKeys
// keys of one pass, kDirectKeyGroup keys at a time; keys past `keys` score 0 (the mask hides
// them). s: row r at s + r * kKeyBlock.
template <DType kDtype, E4m3Read kRead, int R, bool kFarInMemoryOrder>
inline void direct_score_chunk(const float* q, int64_t ldq, const void* const* k_rows, int64_t keys,
                               int64_t head_dim, const PassPrefetcher* prefetch,
                               E4m3NanProbe* nan_probe, float* s) {
  static_assert(kLanes % kDirectKeyGroup == 0, "key groups must tile a vector of scores");
  for (int64_t sub = 0; sub < kDirectChunkKeys; sub += kLanes) {
    Vec partial[R * kLanes];
    for (int64_t first = 0; first < kLanes; first += kDirectKeyGroup) {
      const int64_t j = sub + first;
      const int64_t present = std::clamp<int64_t>(keys - j, 0, kDirectKeyGroup);
      if (present == kDirectKeyGroup) {
        direct_key_group<kDtype, kRead, R, kDirectKeyGroup, kFarInMemoryOrder>(
            q, ldq, k_rows + j, head_dim, partial, first, prefetch, j, nan_probe);
        continue;
      }
      for (int64_t g = 0; g < kDirectKeyGroup; ++g) {
        if (g < present) {
          direct_key_group<kDtype, kRead, R, 1, kFarInMemoryOrder>(
              q, ldq, k_rows + j + g, head_dim, partial, first + g, prefetch, j + g, nan_probe);
        } else {
          for (int r = 0; r < R; ++r) partial[r * kLanes + first + g] = Vec::zero();
        }
      }
    }
    for (int r = 0; r < R; ++r) lane_sums(partial + r * kLanes).store(s + r * kKeyBlock + sub);
  }
}

// o[r][col .. col + NV * lanes) += sum_{j < keys} p[r][j] v_j[col ..] for R rows (p stride 64,
// o stride ldo). kPaired: the columns lie in the paired region, NV is even and each pair of
// vectors is one load_bf16_pairs. kTail: one vector whose columns end at head_dim_v (read no
// further). With `prefetch`, each key's loads come with the hints of the row lines that start in
// these columns (PassPrefetcher::tile_lines). Always inlined: once the far-order variants doubled
// the instantiations GCC stopped inlining it, and the call stored the tile's accumulators to the
// stack on every key.
template <DType kDtype, E4m3Read kRead, int R, int NV, bool kPaired, bool kTail,
          bool kFarInMemoryOrder>
__attribute__((always_inline)) inline void direct_pv_tile(const float* p, const void* const* v_rows,
                                                          int64_t keys, int64_t col,
                                                          int64_t head_dim_v,
                                                          const PassPrefetcher* prefetch, float* o,
                                                          int64_t ldo) {
  static_assert(!kPaired || (NV % 2 == 0 && !kTail), "paired tiles hold whole pairs");
  Vec acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int n = 0; n < NV; ++n) acc[r][n] = Vec::load(o + r * ldo + col + n * kLanes);
  }
  constexpr int64_t kElementBytes = kRowElementBytes<kDtype>;
  // The row lines that start in these columns: none in most tiles of a narrow row (an 8-bit row's
  // 64-byte line spans four AVX2 tiles), and then the key loop issues no hint at all.
  const PassPrefetcher::LineRange lines =
      prefetch != nullptr
          ? prefetch->lines_in(col * kElementBytes, (col + NV * kLanes) * kElementBytes)
          : PassPrefetcher::LineRange{};
  for (int64_t j = 0; j < keys; ++j) {
    if (lines.first < lines.end) prefetch->tile_lines<kFarInMemoryOrder>(j, lines);
    Vec values[NV];
    for (int n = 0; n < NV; ++n) {
      if constexpr (kPaired) {
        if (n % 2 == 0) {
          Vec::load_bf16_pairs(static_cast<const uint16_t*>(v_rows[j]) + col + n * kLanes,
                               &values[n], &values[n + 1]);
        }
      } else {
        values[n] = kTail ? load_converted_tail<kDtype, kRead>(v_rows[j], col, head_dim_v)
                          : load_converted<kDtype, kRead>(v_rows[j], col + n * kLanes);
      }
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

// o[r][0 .. head_dim_v) += sum_{j < keys} p[r][j] v_j for R rows; each column tile issues the
// prefetches of the bytes its own columns cover in the target rows.
template <DType kDtype, E4m3Read kRead, int R, bool kFarInMemoryOrder>
inline void direct_pv_rows(const float* p, const void* const* v_rows, int64_t keys,
                           int64_t head_dim_v, const PassPrefetcher* prefetch, float* o,
                           int64_t ldo) {
  static_assert(kPvVecs % 2 == 0, "paired tiles hold whole pairs");
  const int64_t paired = paired_columns<kDtype>(head_dim_v);
  const int64_t full = head_dim_v / kLanes * kLanes;
  int64_t c = 0;
  if constexpr (kPairedWidening<kDtype>) {
    for (; c + kPvCols <= paired; c += kPvCols) {
      direct_pv_tile<kDtype, kRead, R, kPvVecs, true, false, kFarInMemoryOrder>(
          p, v_rows, keys, c, head_dim_v, prefetch, o, ldo);
    }
    for (; c < paired; c += kPairCols) {
      direct_pv_tile<kDtype, kRead, R, 2, true, false, kFarInMemoryOrder>(
          p, v_rows, keys, c, head_dim_v, prefetch, o, ldo);
    }
  }
  for (; c + kPvCols <= full; c += kPvCols) {
    direct_pv_tile<kDtype, kRead, R, kPvVecs, false, false, kFarInMemoryOrder>(
        p, v_rows, keys, c, head_dim_v, prefetch, o, ldo);
  }
  for (; c < full; c += kLanes) {
    direct_pv_tile<kDtype, kRead, R, 1, false, false, kFarInMemoryOrder>(
        p, v_rows, keys, c, head_dim_v, prefetch, o, ldo);
  }
  if (c < head_dim_v) {
    direct_pv_tile<kDtype, kRead, R, 1, false, true, kFarInMemoryOrder>(
        p, v_rows, keys, c, head_dim_v, prefetch, o, ldo);
  }
}

// Runs one pass's product over `rows` query rows in tiles of up to kDirectTileRows:
// tile(r, std::integral_constant<int, R>, std::bool_constant<kFarInMemoryOrder>, tile_prefetch)
// for the tile of R rows from row r. The first tile issues the pass's prefetches (tile_prefetch is
// `prefetch` there, null for the others), with the far hints in the order the prefetcher chose;
// R and the order become template arguments of the loops, so that neither costs a branch inside
// them. The lambdas are always inlined (here, within the ISA's target region, they can be).
template <class Tile>
__attribute__((always_inline)) inline void for_each_row_tile(int64_t rows,
                                                             const PassPrefetcher* prefetch,
                                                             Tile&& tile) {
  for (int64_t r = 0; r < rows; r += kDirectTileRows) {
    const PassPrefetcher* tile_prefetch = r == 0 ? prefetch : nullptr;
    const int64_t tile_rows = std::min<int64_t>(rows - r, kDirectTileRows);
    auto run = [&](auto in_memory_order) __attribute__((always_inline)) {
      switch (tile_rows) {
        case 1:
          tile(r, std::integral_constant<int, 1>{}, in_memory_order, tile_prefetch);
          break;
        case 2:
          tile(r, std::integral_constant<int, 2>{}, in_memory_order, tile_prefetch);
          break;
        case 3:
          tile(r, std::integral_constant<int, 3>{}, in_memory_order, tile_prefetch);
          break;
        default:
          tile(r, std::integral_constant<int, 4>{}, in_memory_order, tile_prefetch);
          break;
      }
    };
    if (tile_prefetch != nullptr && tile_prefetch->far_in_memory_order()) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  }
}

// One pass of scores (the chunk's `keys` keys at k_rows) for `rows` query rows in tiles of
// kDirectTileRows; the first tile issues the prefetches (for_each_row_tile). kRead: how e4m3 rows
// are read (E4m3Read).
template <DType kDtype, E4m3Read kRead>
inline void direct_scores(const float* q, int64_t ldq, int64_t rows, const void* const* k_rows,
                          int64_t keys, int64_t head_dim, const PassPrefetcher* prefetch,
                          E4m3NanProbe* nan_probe, float* s) {
  for_each_row_tile(
      rows, prefetch,
      [&](int64_t r, auto tile_rows, auto in_memory_order,
          const PassPrefetcher* tile_prefetch) __attribute__((always_inline)) {
        direct_score_chunk<kDtype, kRead, decltype(tile_rows)::value,
                           decltype(in_memory_order)::value>(
            q + r * ldq, ldq, k_rows, keys, head_dim, tile_prefetch, r == 0 ? nan_probe : nullptr,
            s + r * kKeyBlock);
      });
}

// One pass of O += P V (the chunk's `keys` keys at v_rows, probabilities at p, row stride 64) for
// `rows` query rows in tiles of kDirectTileRows; the first tile issues the prefetches
// (for_each_row_tile). kRead: how e4m3 rows are read (E4m3Read).
template <DType kDtype, E4m3Read kRead = E4m3Read::kDirect>
inline void direct_pv(const float* p, int64_t rows, const void* const* v_rows, int64_t keys,
                      int64_t head_dim_v, const PassPrefetcher* prefetch, float* o, int64_t ldo) {
  for_each_row_tile(
      rows, prefetch,
      [&](int64_t r, auto tile_rows, auto in_memory_order, const PassPrefetcher* tile_prefetch)
          __attribute__((always_inline)) {
            direct_pv_rows<kDtype, kRead, decltype(tile_rows)::value,
                           decltype(in_memory_order)::value>(p + r * kKeyBlock, v_rows, keys,
                                                             head_dim_v, tile_prefetch,
                                                             o + r * ldo, ldo);
          });
}

#if defined(ANYATTN_DIRECT_BF16_DOT)
// For one kv head of a task with bf16 queries (its `count` query rows from r0): unless one of
// their elements keeps it off the dot products (bf16_query_unfit_for_dot for a bf16 cache,
// kv8_query_unfit_for_dot for 8-bit rows widened to bf16: kKv8Widened), overwrites those rows of
// scratch.q (as loaded by load_query_rows) with the raw bf16 queries (unscaled, rows of
// 2 * q_stride elements, zero from D) and returns true; else leaves them and returns false.
// Decided per kv head, never per task: which kv heads share a task may depend on the thread
// count, and a kv head's result must not.
template <bool kKv8Widened = false>
inline bool load_bf16_head_queries(const FwdArgs& args, const PackedLayout& layout,
                                   const TaskRows& rows, const SeqInfo& seq, int64_t r0,
                                   int64_t count, const Scratch& scratch) {
  auto source_row = [&](int64_t r) {
    const int64_t offset =
        seq.q_offset + rows.position(r) * args.q_row_stride + rows.head(r) * args.q_head_stride;
    return static_cast<const uint16_t*>(args.q) + offset;
  };
  // OR-ed over each row with no early exit, so that the compiler vectorises it: a scalar loop with
  // a return per element is a visible share of a short decode call.
  for (int64_t r = r0; r < r0 + count; ++r) {
    const uint16_t* source = source_row(r);
    uint16_t flagged = 0;
    for (int64_t d = 0; d < args.head_dim; ++d) {
      if constexpr (kKv8Widened) {
        flagged |= static_cast<uint16_t>(kv8_query_unfit_for_dot(source[d]));
      } else {
        flagged |= static_cast<uint16_t>(bf16_query_unfit_for_dot(source[d]));
      }
    }
    if (flagged != 0) return false;
  }
  const int64_t ldq = 2 * layout.q_stride;
  uint16_t* q16 = reinterpret_cast<uint16_t*>(scratch.q);
  for (int64_t r = r0; r < r0 + count; ++r) {
    const uint16_t* source = source_row(r);
    uint16_t* row = q16 + r * ldq;
    for (int64_t d = 0; d < args.head_dim; ++d) row[d] = source[d];
    for (int64_t d = args.head_dim; d < ldq; ++d) row[d] = 0;
  }
  return true;
}
#endif

// The rows of pass (chunk c, kv head h) of a stream.
inline void pass_rows(const BlockStream& stream, int64_t c, int64_t h, const void** rows) {
  for (int64_t j = 0; j < kDirectChunkKeys; ++j) rows[j] = stream.row(c + j, h);
}

// An 8-bit cache's scales, folded into the loop instead of applied per element: the scores of a
// pass's keys are multiplied by their K factors (descale times token scale), and after the
// softmax each key's probabilities by its V factor times the load scale of the V read, which
// carries it into O += P V. e4m3 scores need no load scale: the query rows carry it
// (scale_e4m3_queries). Keys a row does not see have probability 0 and stay 0, whatever their
// token scale holds.
//
// e4m3's V load scale. Probabilities reach 2^8 (the online softmax's stale max, kStaleMaxHeadroom),
// so p * factor * 2^E (E = the exponent of the call's key read kKeyRead, kE4m3LoadExponent) could
// overflow. Each kv head h of the task therefore takes the load scale 2^s_h for the key read,
// s_h = min(E, 119 - ilogb(descale)) (direct_v_exponent: E for descales below 1), and holds its O
// in units of 2^(E - s_h) (rescaled at the end: unscale_e4m3_outputs); a block whose factors
// (token scales included) reach 2^(120 - s_h) reads V through f16 (kViaHalf), load scale
// 2^(8 - (E - s_h)), which for E = 8 is the key read's own. Both choices depend on the kv head and
// the block only, never on how tasks are split.
template <E4m3Read kKeyRead>
struct KeyScales {
  const FwdArgs& args;
  const SeqInfo& seq;
  int64_t head_k;  // the task's first kv head

  // s_h for kv head head_k + h (above), for an e4m3 cache.
  int direct_v_exponent(int64_t h) const {
    constexpr int kExponent = kE4m3LoadExponent<kKeyRead>;
    const float descale = args.v_descale_of(seq.batch, head_k + h);  // finite, >= 0
    if (!(descale > 0.f)) return kExponent;
    return std::clamp(119 - std::ilogb(descale), -7, kExponent);
  }

  // factors[j] = the factor of key first + j of the block (rows located in `rows`), j < count,
  // for kv head head_k + h: descale times the key's token scale where the cache has them.
  void fill_factors(const BlockRows& rows, int64_t first, int64_t count, int64_t h,
                    KvStream stream, float* factors) const {
    const bool k = stream == KvStream::kK;
    const float per_head =
        k ? args.k_descale_of(seq.batch, head_k + h) : args.v_descale_of(seq.batch, head_k + h);
    const float* token_scale = k ? args.k_token_scale : args.v_token_scale;
    if (token_scale == nullptr) {
      for (int64_t j = 0; j < count; ++j) factors[j] = per_head;
      return;
    }
    const int64_t* offsets = (k ? rows.k_scale : rows.v_scale) + first;
    token_scale += h * (k ? args.k_scale_head_stride : args.v_scale_head_stride);
    for (int64_t j = 0; j < count; ++j) factors[j] = per_head * token_scale[offsets[j]];
  }

  // s[r][c .. c + keys) *= the K factors of those keys, for `rows_count` rows (stride 64), each
  // row's scores first multiplied by query_unscale[r] (a power of two, exact: 1 unless
  // scale_e4m3_queries scaled that row by less than the load scale).
  void scale_scores(const BlockRows& rows, int64_t c, int64_t keys, int64_t h, int64_t rows_count,
                    const float* query_unscale, float* s) const {
    float factors[kDirectChunkKeys];
    fill_factors(rows, c, keys, h, KvStream::kK, factors);
    for (int64_t r = 0; r < rows_count; ++r) {
      float* row = s + r * kKeyBlock;
      if (query_unscale[r] != 1.f) {
        for (int64_t j = 0; j < keys; ++j) row[j] *= query_unscale[r];
      }
      for (int64_t j = 0; j < keys; ++j) row[j] *= factors[j];
    }
  }

  // p[r][0 .. keys) *= the V factors of the block's keys times the load scale of the E4m3Read it
  // returns, where p is not 0 (probabilities are 0 or normal numbers: vec_math's exp2 gives no
  // subnormal), a vector at a time. e4m3 blocks of kv head h (direct exponent s_h) read kKeyRead
  // unless a factor reaches 2^(120 - s_h) (infinity included) or the V rows are widened to bf16
  // (`widened`: they hold the kViaHalf read's values): those read kViaHalf. factors_fit_pairs,
  // when not null (a kv head on the value pairs): set to whether every key's factor times the
  // load scale, as multiplied into p, lets the pairs round that product to bf16
  // (value_factor_fits_pairs), where the path has them.
  E4m3Read scale_probabilities(const BlockRows& rows, int64_t keys, int64_t h, int64_t rows_count,
                               int direct_exponent, bool widened, float* p,
                               bool* factors_fit_pairs) const {
    alignas(64) float factors[kKeyBlock];
    fill_factors(rows, 0, keys, h, KvStream::kV, factors);
    E4m3Read read = kKeyRead;
    float load_scale = 1.f;
    if (args.kv_dtype == DType::kFp8E4M3) {
      const float direct_limit = std::ldexp(1.f, 120 - direct_exponent);
      bool wide = false;
      for (int64_t j = 0; j < keys; ++j) wide |= factors[j] >= direct_limit;
      read = (wide || widened) && kE4m3TwoReads<kKeyRead> ? E4m3Read::kViaHalf : kKeyRead;
      const int units = kE4m3LoadExponent<kKeyRead> - direct_exponent;
      load_scale = read == kKeyRead
                       ? std::ldexp(1.f, direct_exponent)
                       : std::ldexp(1.f, kE4m3LoadExponent<E4m3Read::kViaHalf> - units);
    }
    const int64_t padded = round_up(keys, kLanes);
    for (int64_t j = 0; j < keys; ++j) factors[j] *= load_scale;
    for (int64_t j = keys; j < padded; ++j) factors[j] = 1.f;
    if (factors_fit_pairs != nullptr) {
#if defined(ANYATTN_NARROW_BF16_PV)
      bool fit = true;
      for (int64_t j = 0; j < keys; ++j) fit &= value_factor_fits_pairs(factors[j]);
      *factors_fit_pairs = fit;
#else
      *factors_fit_pairs = false;
#endif
    }
    for (int64_t r = 0; r < rows_count; ++r) {
      float* row = p + r * kKeyBlock;
      for (int64_t j = 0; j < padded; j += kLanes) {
        const Vec value = Vec::load(row + j);
        select_abs_less(value, std::numeric_limits<float>::min(), Vec::zero(),
                        value * Vec::load(factors + j))
            .store(row + j);
      }
    }
    return read;
  }
};

// o[r][0 .. dv_pad) *= 2^(E - direct_exponent) for `count` rows (stride dv_pad), E the exponent
// of the key read: an e4m3 kv head's O back from the units of its direct exponent (KeyScales),
// exactly.
template <E4m3Read kKeyRead>
inline void unscale_e4m3_outputs(int direct_exponent, int64_t count, float* o, int64_t dv_pad) {
  const int units = kE4m3LoadExponent<kKeyRead> - direct_exponent;  // 0 .. 127
  if (units == 0) return;
  const Vec scale = Vec::broadcast(std::ldexp(1.f, units));
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t c = 0; c < dv_pad; c += kLanes) {
      (Vec::load(o + r * dv_pad + c) * scale).store(o + r * dv_pad + c);
    }
  }
}

// For e4m3 caches whose keys are read kKeyRead (values times 2^-E, E = kE4m3LoadExponent): scales
// query row r (`count` rows of head_dim from q, stride ldq) by 2^a_r, a_r = E unless the row holds
// a finite |q| of 2^(128 - E) or more, then the largest a that keeps it finite
// (127 - ilogb(max |q|)).
// Each product q_d 2^a_r * k_d 2^-E is then exactly q_d k_d 2^(a_r - E): the unscaled product
// where a_r = E, and it underflows no sooner than an f32 product of the unscaled values would,
// but for rows with |q| >= 2^(128 - E) (whose products below 2^(E - a_r - 126) lose bits).
// query_unscale[r] = 2^(E - a_r) brings those rows' scores back (KeyScales::scale_scores).
// ldq is a multiple of the lanes, and the rows are zero from head_dim to ldq.
template <E4m3Read kKeyRead>
inline void scale_e4m3_queries(float* q, int64_t ldq, int64_t count, float* query_unscale) {
  constexpr int kExponent = kE4m3LoadExponent<kKeyRead>;
  constexpr float kInfinity = std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < count; ++r) {
    float* row = q + r * ldq;
    Vec largest = Vec::zero();
    for (int64_t d = 0; d < ldq; d += kLanes) {
      const Vec value = Vec::load(row + d);  // |value| where finite, else 0
      largest =
          max_keep_b_nan(largest, select_abs_less(value, kInfinity, abs(value), Vec::zero()));
    }
    const float row_largest = reduce_max(largest);
    const int a =
        row_largest > 0.f ? std::min(kExponent, 127 - std::ilogb(row_largest)) : kExponent;
    const Vec scale = Vec::broadcast(std::ldexp(1.f, a));  // exact: 0 <= a <= kExponent
    for (int64_t d = 0; d < ldq; d += kLanes) (Vec::load(row + d) * scale).store(row + d);
    query_unscale[r] = std::ldexp(1.f, kExponent - a);
  }
}

// Whether a task with rows_per_kv query rows per kv head widens an 8-bit cache's K rows to bf16
// (kv8_widen.h) for the kv heads whose queries qualify: bf16 queries, enough rows per kv head, and
// a CPU and call that score bf16 on the dot products (the V rows follow from
// kv8_widen_value_min_rows rows). rows_per_kv is the kv head's rows in every task that holds them
// (Sq times the group size), so the choice is the call's, never the split's.
inline bool takes_widened_kv8_rows(const FwdArgs& args, int64_t rows_per_kv) {
#if defined(ANYATTN_DIRECT_KV8_WIDEN)
  return is_kv8(args.kv_dtype) && args.dtype == DType::kBF16 &&
         rows_per_kv >= kv8_widen_key_min_rows(args.kv_dtype) &&
         call_takes_bf16_dot_scores(args) && kv8_widening_available();
#else
  (void)args;
  (void)rows_per_kv;
  return false;
#endif
}

// Loads the task's query rows into scratch.q for the direct loop: f32 in paired order
// (split_pairs), or for kv heads that score on the dot products (dot_head[h] set here, where the
// CPU has the instruction: bf16 caches, and 8-bit caches whose rows the loop widens to bf16,
// takes_widened_kv8_rows) bf16. Either way the softmax applies softmax_scale as it reads the
// scores. For e4m3 caches the f32 rows are scaled to the direct read (scale_e4m3_queries);
// query_unscale[r] is 1 for the other rows.
template <DType kDtype, E4m3Read kKeyRead>
void load_direct_queries(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                         const TaskRows& rows, const Scratch& scratch, bool* dot_head,
                         float* query_unscale) {
  const int64_t rows_per_kv = rows.count / task.heads_k;
  load_query_rows(args, layout, task, rows, scratch);
#if defined(ANYATTN_DIRECT_BF16_DOT)
  if constexpr (kDtype == DType::kBF16) {
    if (call_takes_bf16_dot_scores(args)) {
      for (int64_t h = 0; h < task.heads_k; ++h) {
        dot_head[h] = load_bf16_head_queries(args, layout, rows, task.seq, h * rows_per_kv,
                                             rows_per_kv, scratch);
      }
    }
  } else if constexpr (is_kv8(kDtype)) {
    if (takes_widened_kv8_rows(args, rows_per_kv)) {
      for (int64_t h = 0; h < task.heads_k; ++h) {
        dot_head[h] = load_bf16_head_queries<true>(args, layout, rows, task.seq, h * rows_per_kv,
                                                   rows_per_kv, scratch);
      }
    }
  }
#endif
  for (int64_t r = 0; r < rows.count; ++r) query_unscale[r] = 1.f;
  if constexpr (kDtype == DType::kFp8E4M3) {
    for (int64_t h = 0; h < task.heads_k; ++h) {
      if (dot_head[h]) continue;
      const int64_t r0 = h * rows_per_kv;
      scale_e4m3_queries<kKeyRead>(scratch.q + r0 * layout.q_stride, layout.q_stride,
                                   rows_per_kv, query_unscale + r0);
    }
  }
  for (int64_t r = 0; r < rows.count; ++r) {
    if (dot_head[r / rows_per_kv]) continue;
    split_pairs(scratch.q + r * layout.q_stride, paired_columns<kDtype>(args.head_dim));
  }
}

// O += P V over a block that crosses the mask's boundary, for `count` <= kDirectTileRows rows
// from row0 (scratch rows; p at s, o at o, stride dv_pad): each row reads only the keys it may
// see. The keys every row of the tile sees (the intersection of their ranges: a block past the
// last key without a mask, the first keys of a causal block) run as one tile of `count` rows,
// then each row's keys before and after them on their own; where the intersection is empty each
// row runs alone. Each row adds each of its keys once. kRead: how e4m3 rows are read (E4m3Read).
template <DType kDtype, E4m3Read kRead>
void boundary_pv_tile(const Mask& mask, const TaskRows& rows, int64_t row0, int64_t count,
                      int64_t j0, const void* const* v_rows, int64_t head_dim_v, const float* s,
                      float* o, int64_t dv_pad) {
  KeyRange ranges[kDirectTileRows];
  KeyRange shared{0, kKeyBlock};
  for (int64_t i = 0; i < count; ++i) {
    ranges[i] = mask.row_keys_in_block(rows.position(row0 + i), j0, kKeyBlock);
    shared.begin = std::max(shared.begin, ranges[i].begin);
    shared.end = std::min(shared.end, ranges[i].end);
  }
  const bool tile = count > 1 && shared.begin < shared.end;
  if (tile) {
    direct_pv<kDtype, kRead>(s + row0 * kKeyBlock + shared.begin, count, v_rows + shared.begin,
                             shared.end - shared.begin, head_dim_v, nullptr, o + row0 * dv_pad,
                             dv_pad);
  }
  auto own_keys = [&](int64_t row, int64_t begin, int64_t end) {
    if (begin >= end) return;
    direct_pv_rows<kDtype, kRead, 1, false>(s + row * kKeyBlock + begin, v_rows + begin,
                                            end - begin, head_dim_v, nullptr, o + row * dv_pad,
                                            dv_pad);
  };
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = row0 + i;
    const KeyRange range = ranges[i];
    if (tile) {
      own_keys(row, range.begin, shared.begin);
      own_keys(row, shared.end, range.end);
    } else {
      own_keys(row, range.begin, range.end);
    }
    if constexpr (kDtype == DType::kFp8E4M3) {
      restore_e4m3_nan_outputs(v_rows + range.begin, range.end - range.begin, head_dim_v, 1,
                               o + row * dv_pad, dv_pad);
    }
  }
}

#if defined(ANYATTN_DIRECT_KV8_WIDEN)
// Widens `count` 8-bit rows of n elements (rows[j]) to bf16 in scratch.staging (kv8_widen.h),
// e4m3 values times 2^-e4m3_exponent, and points widened[j] at them for j < `slots` (those
// past `count` point at staging rows that hold nothing read); with `prefetch`, the loads issue
// the pass's hints.
inline void widen_rows(const FwdArgs& args, int e4m3_exponent, const void* const* rows,
                       int64_t count, int64_t n, const PassPrefetcher* prefetch,
                       const Scratch& scratch, int64_t slots, const void** widened) {
  const int64_t ld = kv8_widened_stride(n);
  uint16_t* out = reinterpret_cast<uint16_t*>(scratch.staging);
  ANYATTN_DIRECT_KV8_WIDEN(args.kv_dtype, e4m3_exponent, rows, count, n, prefetch, out, ld);
  for (int64_t j = 0; j < slots; ++j) widened[j] = out + j * ld;
}
#endif

#if defined(ANYATTN_DIRECT_BF16_PV)
// The fewest query rows per kv head whose P V takes the value pairs (chunk_pv_pairs): below it
// the interleaving of each pass's V rows costs more than the dot products save.
constexpr int64_t kPairsPvMinRows = 8;
// The same for 8-bit caches, whose V rows are widened straight into the pairs: e4m3's f32 loop
// converts each V element at a higher cost than the widening, so the pairs pay from one tile of
// rows on; int8's and e5m2's break even below two tiles (bench/MEASUREMENTS.md, "Fast-precision P
// V on widened 8-bit V rows").
constexpr int64_t kv8_pairs_pv_min_rows(DType kv_dtype) {
  return kv_dtype == DType::kFp8E4M3 ? 4 : kPairsPvMinRows;
}

// Whether one of the first n values of the `keys` bf16 rows is subnormal.
inline bool bf16_rows_hold_subnormal(const void* const* rows, int64_t keys, int64_t n) {
  bool found = false;
  for (int64_t j = 0; j < keys; ++j) {
    const uint16_t* row = static_cast<const uint16_t*>(rows[j]);
    for (int64_t c = 0; c < n; ++c) found |= bf16_is_subnormal(row[c]);
  }
  return found;
}
#endif

// kKeyRead: how an e4m3 cache's K rows are read (E4m3Read; kDirect for the other dtypes).
template <DType kDtype, E4m3Read kKeyRead>
void attend_direct_typed(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                         const Scratch& scratch) {
  const TaskRows rows = task_rows(task);
  const SeqInfo& seq = task.seq;
  const int64_t head_k = task.head_q_begin / args.group_size();
  const int64_t dv_pad = layout.dv_pad;
  const Mask mask(args, seq);
  float neg_slopes[kMaxQBlockRows];
  const ScoreTransform transform = task_transform(mask, task, neg_slopes);
  const int64_t heads = task.heads_k;
  const int64_t rows_per_kv = rows.count / heads;
  bool dot_head[kMaxQBlockRows] = {};
  float query_unscale[kMaxQBlockRows];
  load_direct_queries<kDtype, kKeyRead>(args, layout, task, rows, scratch, dot_head,
                                        query_unscale);
  reset_rows(layout, rows, scratch);

  const KeyRange blocks = task_blocks(mask, task);
  const int64_t heads_per_kv = task.heads / heads;
  const KeyScales<kKeyRead> key_scales{args, seq, head_k};
  // Widened V rows (widened_v below, 8-bit caches) hold e4m3 values as the kViaHalf
  // read gives them (KeyScales::scale_probabilities), the other formats' unscaled.
  [[maybe_unused]] constexpr int kWidenedVExponent =
      kDtype == DType::kFp8E4M3 ? kE4m3LoadExponent<E4m3Read::kViaHalf> : 0;
  // Whether kv head h's V rows are widened to bf16 too (8-bit caches): a kv head whose K rows
  // are (dot_head) with kv8_widen_value_min_rows rows or more, and every kv head whose P V takes
  // the value pairs (below; the blocks that do not, and the boundary blocks, then read the widened
  // rows, which keep O in the same column order).
  [[maybe_unused]] bool widened_v[kMaxQBlockRows] = {};
  [[maybe_unused]] bool kv8_pairs = false;
  if constexpr (is_kv8(kDtype)) {
#if defined(ANYATTN_DIRECT_BF16_PV)
    kv8_pairs = args.bf16_probabilities && args.head_dim_v % 32 == 0 &&
                rows_per_kv >= kv8_pairs_pv_min_rows(args.kv_dtype) && kv8_widening_available();
#endif
    for (int64_t h = 0; h < heads; ++h) {
      widened_v[h] =
          kv8_pairs || (dot_head[h] && rows_per_kv >= kv8_widen_value_min_rows(args.kv_dtype));
    }
  }
  int v_exponent[kMaxQBlockRows];  // per kv head of the task: KeyScales::direct_v_exponent
  for (int64_t h = 0; h < heads; ++h) {
    v_exponent[h] = kDtype == DType::kFp8E4M3 ? key_scales.direct_v_exponent(h) : 0;
  }
  // Whether kv head h's P V passes run on the value pairs (chunk_pv_pairs, pairs_pv): bf16 caches
  // with at least kPairsPvMinRows rows per kv head, and 8-bit caches with kv8_pairs_pv_min_rows
  // (their V rows widened straight into the pairs, on CPUs with the widening), of calls that allow
  // bf16 probabilities, on CPUs whose bf16 scores take the dot products, with whole 32-column
  // groups; cleared for the rest of the task once a pass's or a boundary block's V holds a
  // subnormal, or a block's V factors do not fit the pairs (KeyScales::scale_probabilities),
  // since O may then hold a subnormal.
#if defined(ANYATTN_DIRECT_BF16_PV)
  bool pairs_pv[kMaxQBlockRows] = {};
  if constexpr (kDtype == DType::kBF16) {
    const bool takes_pairs = args.bf16_probabilities && args.head_dim_v % 32 == 0 &&
                             rows_per_kv >= kPairsPvMinRows && bf16_dot_scores_available();
    std::fill(pairs_pv, pairs_pv + heads, takes_pairs);
  } else if constexpr (is_kv8(kDtype)) {
    std::fill(pairs_pv, pairs_pv + heads, kv8_pairs);
  }
#endif
  const int64_t element_bytes = element_size(args.kv_dtype);
  const int64_t k_row_bytes = args.head_dim * element_bytes;
  const int64_t v_row_bytes = args.head_dim_v * element_bytes;
  const int64_t k_head_bytes = args.k_head_stride * element_bytes;
  const int64_t v_head_bytes = args.v_head_stride * element_bytes;
  const PrefetchDistances k_distances = prefetch_distances(k_row_bytes, heads);
  const PrefetchDistances v_distances = prefetch_distances(v_row_bytes, heads);
  // Whether the task's kv heads lie side by side within each key row (PassPrefetcher's memory
  // order).
  const bool k_heads_side_by_side = args.k_head_stride < args.k_row_stride;
  const bool v_heads_side_by_side = args.v_head_stride < args.v_row_stride;

  // Block by block; the next block's rows are located one block early, for the prefetches.
  BlockRows block_rows[2];
  int current = 0;
  if (blocks.begin < blocks.end) locate_block(args, seq, head_k, blocks.begin, &block_rows[0]);
  for (int64_t block = blocks.begin; block < blocks.end; ++block) {
    const int64_t j0 = block * kKeyBlock;
    const bool crosses_boundary = block_crosses_boundary(mask, task, j0);
    const BlockRows& this_block = block_rows[current];
    BlockRows& next_block = block_rows[1 - current];
    const bool has_next = block + 1 < blocks.end;
    if (has_next) locate_block(args, seq, head_k, block + 1, &next_block);
    const int64_t next_keys = has_next ? next_block.keys : 0;
    const BlockStream k_stream(args.k, this_block.k, this_block.keys, next_block.k, next_keys,
                               k_head_bytes);
    const BlockStream v_stream(args.v, this_block.v, this_block.keys, next_block.v, next_keys,
                               v_head_bytes);
    const int64_t keys = this_block.keys;

    // 1. Scores, chunk by chunk, each chunk over the task's kv heads; chunks past the block's
    // keys score 0 (the mask hides them: such a block crosses the boundary).
    for (int64_t c = 0; c < kKeyBlock; c += kDirectChunkKeys) {
      const int64_t present = std::clamp<int64_t>(keys - c, 0, kDirectChunkKeys);
      for (int64_t h = 0; h < heads; ++h) {
        float* s = scratch.s + h * rows_per_kv * kKeyBlock + c;
        if (present == 0) {
          for (int64_t r = 0; r < rows_per_kv; ++r) {
            for (int64_t j = 0; j < kDirectChunkKeys; j += kLanes) {
              Vec::zero().store(s + r * kKeyBlock + j);
            }
          }
          continue;
        }
        const void* k_rows[kDirectChunkKeys];
        pass_rows(k_stream, c, h, k_rows);
        const PassPrefetcher prefetch(k_stream, c, h, heads, k_distances.l1_keys,
                                      k_distances.l2_chunks, k_heads_side_by_side, k_row_bytes);
#if defined(ANYATTN_DIRECT_BF16_DOT)
        if (dot_head[h]) {
          const int64_t ldq = 2 * layout.q_stride;
          const uint16_t* q16 =
              reinterpret_cast<const uint16_t*>(scratch.q) + h * rows_per_kv * ldq;
          if constexpr (is_kv8(kDtype)) {
#if defined(ANYATTN_DIRECT_KV8_WIDEN)
            // The raw query rows against the stored values (no load scale), then the K factors.
            const void* widened[kDirectChunkKeys];
            widen_rows(args, 0, k_rows, present, args.head_dim, &prefetch, scratch,
                       kDirectChunkKeys, widened);
            ANYATTN_DIRECT_BF16_DOT_SCORES(q16, ldq, rows_per_kv, widened, present, args.head_dim,
                                           nullptr, s);
            key_scales.scale_scores(this_block, c, present, h, rows_per_kv,
                                    query_unscale + h * rows_per_kv, s);
#endif
          } else {
            ANYATTN_DIRECT_BF16_DOT_SCORES(q16, ldq, rows_per_kv, k_rows, present, args.head_dim,
                                           &prefetch, s);
          }
          continue;
        }
#endif
        E4m3NanProbe nan_probe;
        direct_scores<kDtype, kKeyRead>(scratch.q + h * rows_per_kv * layout.q_stride,
                                        layout.q_stride, rows_per_kv, k_rows, present,
                                        args.head_dim, &prefetch, &nan_probe, s);
        if constexpr (kDtype == DType::kFp8E4M3) {
          if (nan_probe.found()) {
            restore_e4m3_nan_scores(k_rows, present, args.head_dim, rows_per_kv, s);
          }
        }
        if constexpr (is_kv8(kDtype)) {
          key_scales.scale_scores(this_block, c, present, h, rows_per_kv,
                                  query_unscale + h * rows_per_kv, s);
        }
      }
    }

    // 2. Softmax, kv head by kv head; v_read[h]: how the P V of the block reads kv head h's V
    // rows (KeyScales::scale_probabilities).
    E4m3Read v_read[kMaxQBlockRows];
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t r0 = h * rows_per_kv;
      const TaskRows head_rows{rows.q_begin, rows.positions, rows.head_begin + h * heads_per_kv,
                               rows_per_kv};
      scores_to_probabilities(args, seq, transform, neg_slopes + h * heads_per_kv,
                              crosses_boundary, head_rows, j0, keys, scratch.s + r0 * kKeyBlock,
                              scratch.m + r0, scratch.l + r0 * kRowSumSlots,
                              scratch.o + r0 * dv_pad, dv_pad);
      v_read[h] = kKeyRead;
      if constexpr (is_kv8(kDtype)) {
#if defined(ANYATTN_DIRECT_BF16_PV)
        bool* fit = pairs_pv[h] ? &pairs_pv[h] : nullptr;  // cleared where the factors do not fit
#else
        bool* fit = nullptr;
#endif
        v_read[h] = key_scales.scale_probabilities(this_block, keys, h, rows_per_kv,
                                                   v_exponent[h], widened_v[h],
                                                   scratch.s + r0 * kKeyBlock, fit);
      }
    }
    // body(std::integral_constant<E4m3Read, read>) for kv head h's read of V: the kViaHalf
    // variants of a kDirect key read are compiled only for e4m3 on paths with two reads.
    auto with_v_read = [&](int64_t h, auto&& body) __attribute__((always_inline)) {
      if constexpr (kDtype == DType::kFp8E4M3 && kE4m3TwoReads<kKeyRead>) {
        if (v_read[h] == E4m3Read::kViaHalf) {
          body(std::integral_constant<E4m3Read, E4m3Read::kViaHalf>{});
          return;
        }
      }
      body(std::integral_constant<E4m3Read, kKeyRead>{});
    };

    // 3. O += P V.
    if (crosses_boundary) {
      // Each row reads only the keys it may see: a masked key's probability is 0, and 0 times
      // an infinite or NaN value would otherwise leak NaN into the row. (No V prefetch here:
      // boundary blocks are at most one or two per task.)
      for (int64_t h = 0; h < heads; ++h) {
        const void* v_rows[kKeyBlock];
        for (int64_t j = 0; j < kKeyBlock; ++j) v_rows[j] = v_stream.row(j, h);
#if defined(ANYATTN_DIRECT_KV8_WIDEN)
        if constexpr (is_kv8(kDtype)) {
          if (widened_v[h]) {
            const void* widened[kKeyBlock];
            widen_rows(args, kWidenedVExponent, v_rows, keys, args.head_dim_v, nullptr, scratch,
                       kKeyBlock, widened);
            for (int64_t r = 0; r < rows_per_kv; r += kDirectTileRows) {
              boundary_pv_tile<DType::kBF16, E4m3Read::kDirect>(
                  mask, rows, h * rows_per_kv + r,
                  std::min<int64_t>(kDirectTileRows, rows_per_kv - r), j0, widened,
                  args.head_dim_v, scratch.s, scratch.o, dv_pad);
            }
            continue;
          }
        }
#endif
#if defined(ANYATTN_DIRECT_BF16_PV)
        if (pairs_pv[h] && bf16_rows_hold_subnormal(v_rows, keys, args.head_dim_v)) {
          pairs_pv[h] = false;
        }
#endif
        for (int64_t r = 0; r < rows_per_kv; r += kDirectTileRows) {
          const int64_t row0 = h * rows_per_kv + r;
          const int64_t count = std::min<int64_t>(kDirectTileRows, rows_per_kv - r);
          with_v_read(h, [&](auto read) {
            boundary_pv_tile<kDtype, decltype(read)::value>(mask, rows, row0, count, j0, v_rows,
                                                            args.head_dim_v, scratch.s,
                                                            scratch.o, dv_pad);
          });
        }
      }
    } else {
      for (int64_t c = 0; c < keys; c += kDirectChunkKeys) {
        const int64_t present = std::min<int64_t>(keys - c, kDirectChunkKeys);
        for (int64_t h = 0; h < heads; ++h) {
          const void* v_rows[kDirectChunkKeys];
          pass_rows(v_stream, c, h, v_rows);
          const PassPrefetcher prefetch(v_stream, c, h, heads, v_distances.l1_keys,
                                        v_distances.l2_chunks, v_heads_side_by_side, v_row_bytes);
          const int64_t r0 = h * rows_per_kv;
#if defined(ANYATTN_DIRECT_KV8_WIDEN)
          if constexpr (is_kv8(kDtype)) {
#if defined(ANYATTN_DIRECT_KV8_WIDEN_PAIRS)
            if (pairs_pv[h]) {  // widened straight into the value pairs (never subnormal)
              uint32_t* pairs = reinterpret_cast<uint32_t*>(scratch.staging);
              ANYATTN_DIRECT_KV8_WIDEN_PAIRS(args.kv_dtype, kWidenedVExponent, v_rows, present,
                                             args.head_dim_v, &prefetch, pairs);
              ANYATTN_DIRECT_BF16_PAIRS_PV(scratch.s + r0 * kKeyBlock + c, rows_per_kv, pairs,
                                           present, args.head_dim_v, scratch.o + r0 * dv_pad,
                                           dv_pad);
              continue;
            }
#endif
            if (widened_v[h]) {
              const void* widened[kDirectChunkKeys];
              widen_rows(args, kWidenedVExponent, v_rows, present, args.head_dim_v, &prefetch,
                         scratch, kDirectChunkKeys, widened);
              direct_pv<DType::kBF16>(scratch.s + r0 * kKeyBlock + c, rows_per_kv, widened,
                                      present, args.head_dim_v, nullptr, scratch.o + r0 * dv_pad,
                                      dv_pad);
              continue;
            }
          }
#endif
#if defined(ANYATTN_DIRECT_BF16_PV)
          if (pairs_pv[h]) {
            if (ANYATTN_DIRECT_BF16_PV(scratch.s + r0 * kKeyBlock + c, rows_per_kv, v_rows,
                                       present, args.head_dim_v, &prefetch,
                                       scratch.o + r0 * dv_pad, dv_pad)) {
              continue;
            }
            pairs_pv[h] = false;  // a subnormal value: this pass and the rest take the FMAs
          }
#endif
          with_v_read(h, [&](auto read) {
            direct_pv<kDtype, decltype(read)::value>(scratch.s + r0 * kKeyBlock + c, rows_per_kv,
                                                     v_rows, present, args.head_dim_v, &prefetch,
                                                     scratch.o + r0 * dv_pad, dv_pad);
          });
          if constexpr (kDtype == DType::kFp8E4M3) {
            restore_e4m3_nan_outputs(v_rows, present, args.head_dim_v, rows_per_kv,
                                     scratch.o + r0 * dv_pad, dv_pad);
          }
        }
      }
    }
    current = 1 - current;
  }

  if constexpr (kDtype == DType::kFp8E4M3) {
    for (int64_t h = 0; h < heads; ++h) {
      unscale_e4m3_outputs<kKeyRead>(v_exponent[h], rows_per_kv,
                                     scratch.o + h * rows_per_kv * dv_pad, dv_pad);
    }
  }
  for (int64_t r = 0; r < rows.count; ++r) {
    // O rows of kv heads with widened V rows are in the bf16 loop's paired order.
    const bool paired = kPairedWidening<kDtype> || (is_kv8(kDtype) && widened_v[r / rows_per_kv]);
    join_pairs(scratch.o + r * dv_pad,
               paired ? paired_columns<DType::kBF16>(args.head_dim_v) : 0);
  }
  finish_task(args, layout, task, rows, scratch);
}

void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                   const Scratch& scratch) {
  switch (args.kv_dtype) {  // q's dtype is read at run time (load_query_rows)
    case DType::kI8:
      attend_direct_typed<DType::kI8, E4m3Read::kDirect>(args, layout, task, scratch);
      break;
    case DType::kFp8E4M3:
      if (e4m3_reads_as_f32_bits()) {
        // The f32-bits read's values may be f32 subnormals, which MXCSR.DAZ would read as 0 (the
        // read through f16 gives only normal values).
        [[maybe_unused]] const SubnormalOperandsScope subnormal_operands;
        attend_direct_typed<DType::kFp8E4M3, E4m3Read::kDirect>(args, layout, task, scratch);
      } else {
        attend_direct_typed<DType::kFp8E4M3, E4m3Read::kViaHalf>(args, layout, task, scratch);
      }
      break;
    case DType::kFp8E5M2:
      attend_direct_typed<DType::kFp8E5M2, E4m3Read::kDirect>(args, layout, task, scratch);
      break;
    case DType::kBF16:
      attend_direct_typed<DType::kBF16, E4m3Read::kDirect>(args, layout, task, scratch);
      break;
    case DType::kF16:
      attend_direct_typed<DType::kF16, E4m3Read::kDirect>(args, layout, task, scratch);
      break;
    case DType::kF32:
    default:
      attend_direct_typed<DType::kF32, E4m3Read::kDirect>(args, layout, task, scratch);
      break;
  }
}
