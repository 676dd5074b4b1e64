// AMX tile basics shared by the avx512_amx forward (fwd_tiles_amx-inl.h) and backward
// (bwd_kernel-inl.h with ANYATTN_BWD_BF16_TILES): the tile configuration, bf16 subnormal lanes, one
// pass of S = Q K^T, and products whose left operand is an f32 matrix split into bf16 hi + lo.
//
// Included inside an ISA namespace and a target region with AVX-512, AVX512_BF16, AMX-TILE and
// AMX-BF16 (fwd_avx512_amx.cc, bwd_avx512_amx.cc).
//
// Every configured tile is 16 rows x 64 bytes: 16 x 16 f32, or 16 x 32 bf16. TDPBF16PS C += A B
// reads A as 16 rows of 32 bf16 (one 32-element chunk of the reduction per row) and B in the
// pair-interleaved ("VNNI") order: row w holds, for each of 16 columns n, the elements of
// reduction index 2w and 2w + 1. Products of two bf16 are exact in f32 and are summed in f32.

constexpr int64_t kTileRows = 16;
constexpr int64_t kTileBytes = 1024;  // one 16 x 64-byte tile, packed contiguously

// A head dimension as the tiles see it: whole 32-element reduction chunks.
inline int64_t tile_head_dim(int64_t head_dim) {
  return (head_dim + 31) / 32 * 32;
}

// The 64-byte operand of LDTILECFG (palette 1).
struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

constexpr TileConfig tile_config_16x64() {
  TileConfig config = {};
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kTileRows;
    config.bytes_per_row[t] = 64;
  }
  return config;
}

// Built at compile time: a configuration filled in on the stack just before LDTILECFG depends on
// the compiler keeping stores whose only reader is the instruction (GCC 12 dropped them in a
// standalone probe, and LDTILECFG then faulted on the half-written operand).
alignas(64) inline constexpr TileConfig kTileConfig = tile_config_16x64();

inline void configure_tiles() {
  _tile_loadconfig(&kTileConfig);
}

// Lanes (of 32 bf16) that hold a subnormal: exponent bits 0, mantissa not. TDPBF16PS treats
// subnormal inputs (and results) as zero, so operands that hold one take f32 products instead.
inline __mmask32 subnormal_lanes(__m512i values) {
  return _mm512_testn_epi16_mask(values, _mm512_set1_epi16(0x7f80)) &
         _mm512_test_epi16_mask(values, _mm512_set1_epi16(0x007f));
}

// Where the B operand (K, packed in the pair-interleaved order) of one S pass lies: the tile of
// 16 keys x 32 dims for key group g and chunk c starts at base + g * group_bytes + c * chunk_bytes
// and has rows row_bytes apart.
struct KeyTiles {
  const char* base;
  int64_t group_bytes;
  int64_t chunk_bytes;
  int64_t row_bytes;
};

// S for one or two 16-row groups (q rows at q, q_row_bytes apart, bf16) against key groups kg
// and kg + 1, `chunks` 32-dim passes, into s (f32 rows s_row_bytes apart): accumulators in tiles
// 0-3, q tiles in 4-5, K tiles in 6-7 (2 x 2 blocking: four loads for four products). The tile
// numbers are literals: GCC's AMX intrinsics paste them into the assembly.
template <int kRowGroups>
inline void score_tiles(const char* q, int64_t q_row_bytes, const KeyTiles& k, int64_t kg,
                        int64_t chunks, float* s, int64_t s_row_bytes) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kRowGroups == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const char* k_first = k.base + kg * k.group_bytes;
  const char* k_second = k_first + k.group_bytes;
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(6, k_first + c * k.chunk_bytes, k.row_bytes);
    _tile_loadd(7, k_second + c * k.chunk_bytes, k.row_bytes);
    _tile_loadd(4, q + c * 64, q_row_bytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kRowGroups == 2) {
      _tile_loadd(5, q + kTileRows * q_row_bytes + c * 64, q_row_bytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  char* s_bytes = reinterpret_cast<char*>(s);
  _tile_stored(0, s_bytes, s_row_bytes);
  _tile_stored(1, s_bytes + 64, s_row_bytes);
  if constexpr (kRowGroups == 2) {
    _tile_stored(2, s_bytes + kTileRows * s_row_bytes, s_row_bytes);
    _tile_stored(3, s_bytes + kTileRows * s_row_bytes + 64, s_row_bytes);
  }
}

// s[r][0 .. 64) = q_r . k_j for the `rows` rows at q (bf16, tile_head_dim(head_dim) per row,
// zero rows up to a multiple of 16) against 64 keys (four key groups of k), into s (64 f32 per
// row, s_row_bytes apart). Rows of s up to the next multiple of 16 are written too (zeros).
inline void score_block_tiles(int64_t head_dim, const void* q, int64_t rows, const KeyTiles& k,
                              float* s, int64_t s_row_bytes) {
  const int64_t dp = tile_head_dim(head_dim);
  const int64_t q_row_bytes = dp * 2;
  const int64_t chunks = dp / 32;
  const int64_t row_groups = (rows + kTileRows - 1) / kTileRows;
  const char* q_bytes = static_cast<const char*>(q);
  char* s_bytes = reinterpret_cast<char*>(s);
  for (int64_t g = 0; g < row_groups; g += 2) {
    const char* q_group = q_bytes + g * kTileRows * q_row_bytes;
    float* s_group = reinterpret_cast<float*>(s_bytes + g * kTileRows * s_row_bytes);
    for (int64_t kg = 0; kg < 4; kg += 2) {
      if (g + 1 < row_groups) {
        score_tiles<2>(q_group, q_row_bytes, k, kg, chunks, s_group + kg * kTileRows, s_row_bytes);
      } else {
        score_tiles<1>(q_group, q_row_bytes, k, kg, chunks, s_group + kg * kTileRows, s_row_bytes);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Products with a split left operand: C += (A_hi + A_lo) B
// ---------------------------------------------------------------------------------------------
//
// The tiles multiply bf16 only. A left operand computed in f32 (probabilities, score gradients)
// is split per element into hi (a truncated to bf16) and lo = bf16(a - hi), |a - hi - lo| <=
// 2^-16 |a|, and both parts are multiplied by the same right tiles: the product is as accurate as
// in f32 (bf16 hi alone, as GPU kernels use, would cost 2^-9 of |a| per term), for twice the tile
// products. Forward calls that allow bf16 probabilities (FwdArgs::bf16_probabilities) round each
// probability to bf16 instead (round_row: the hi part, lo zero) and take one pass (kRoundedParts).

// A split row: 64 values as [hi: 64 bf16 | lo: 64 bf16], 256 bytes like the f32 row it replaces.
constexpr int64_t kSplitRowFloats = 64;
constexpr int64_t kSplitRowBytes = kSplitRowFloats * 4;
constexpr int64_t kSplitLoOffset = kSplitRowFloats * 2;  // bytes from the hi part to the lo part
// Parts of a split row the products read: hi and lo (split_row), or hi only (round_row).
constexpr int kSplitParts = 2;
constexpr int kRoundedParts = 1;

// The high halves of the 32 floats of first:second, in order: bf16 truncations of them.
inline __m512i high_halves(__m512i first, __m512i second) {
  // Half t of the result is element 2t + 1 of the 64 halves the two sources hold.
  alignas(64) static constexpr uint16_t kHighHalves[32] = {
      1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
      33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(first, _mm512_load_si512(kHighHalves), second);
}

// Writes the 64 floats at p to dst as one split row (dst may be p): hi is each value truncated to
// bf16 (|a - hi| < 2^-7 |a|, and a - hi is exact in f32), lo is a - hi rounded to nearest bf16,
// so |a - hi - lo| <= 2^-9 |a - hi| < 2^-16 |a|.
inline void split_row(const float* p, void* dst) {
  const __m512 high_bits = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  __m512i hi[2], lo[2];
  for (int half = 0; half < 2; ++half) {
    const __m512 first = _mm512_loadu_ps(p + 32 * half);
    const __m512 second = _mm512_loadu_ps(p + 32 * half + 16);
    hi[half] = high_halves(_mm512_castps_si512(first), _mm512_castps_si512(second));
    lo[half] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(second, _mm512_and_ps(second, high_bits)),
                                            _mm512_sub_ps(first, _mm512_and_ps(first, high_bits)));
  }
  __m512i* row = static_cast<__m512i*>(dst);
  _mm512_storeu_si512(row + 0, hi[0]);
  _mm512_storeu_si512(row + 1, hi[1]);
  _mm512_storeu_si512(row + 2, lo[0]);
  _mm512_storeu_si512(row + 3, lo[1]);
}

// Writes the 64 floats at p to dst as a split row whose hi part is each value rounded to bf16 (to
// nearest even, |a - hi| <= 2^-9 |a|) and whose lo part is 0 (dst may be p).
inline void round_row(const float* p, void* dst) {
  __m512i rounded[2];
  for (int half = 0; half < 2; ++half) {
    rounded[half] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 32 * half + 16),
                                                 _mm512_loadu_ps(p + 32 * half));
  }
  __m512i* row = static_cast<__m512i*>(dst);
  _mm512_storeu_si512(row + 0, rounded[0]);
  _mm512_storeu_si512(row + 1, rounded[1]);
  _mm512_storeu_si512(row + 2, _mm512_setzero_si512());
  _mm512_storeu_si512(row + 3, _mm512_setzero_si512());
}

// split_row (parts = kSplitParts) or round_row (parts = kRoundedParts) for the first `rows` rows
// of p (64 floats apart) into dst (kSplitRowBytes apart; dst may be p), then zero rows up to the
// next multiple of 16.
inline void split_rows(const float* p, int64_t rows, int parts, void* dst) {
  char* dst_rows = static_cast<char*>(dst);
  for (int64_t r = 0; r < rows; ++r) {
    if (parts == kRoundedParts) {
      round_row(p + r * kSplitRowFloats, dst_rows + r * kSplitRowBytes);
    } else {
      split_row(p + r * kSplitRowFloats, dst_rows + r * kSplitRowBytes);
    }
  }
  for (int64_t r = rows; r < (rows + kTileRows - 1) / kTileRows * kTileRows; ++r) {
    for (int i = 0; i < 4; ++i) {
      _mm512_storeu_si512(dst_rows + r * kSplitRowBytes + 64 * i, _mm512_setzero_si512());
    }
  }
}

// Where a right operand's tiles lie: the tile of column group n (16 columns) and reduction chunk
// c (32 deep, 16 rows of pairs) starts n * group_bytes + c * chunk_bytes past its base, and its
// rows are row_bytes apart.
struct RightTiles {
  int64_t group_bytes;
  int64_t chunk_bytes;
  int64_t row_bytes;
};

// One left operand of a split pass: its split rows (kSplitRowBytes apart) from the pass's first
// row group, its right operand's base at the pass's first column group, and its chunks.
struct SplitStep {
  const char* a;
  const char* b;
  int64_t chunks;
};

// C pieces of one or two 16-row groups x one or two 16-column groups (c: f32 rows c_row_bytes
// apart) += sum over `count` steps of (A_hi + A_lo) B (parts = kSplitParts) or A_hi B (parts =
// kRoundedParts: rounded rows), each over its chunks: the C tiles are loaded once and stored once
// for all of them. Tiles 0-3 hold C, 4-5 A, 6-7 B; per chunk two B loads feed the hi (and the lo)
// products of both row groups.
template <int kRowGroups, int kColumnGroups>
inline void split_product_tiles(const SplitStep* steps, int64_t count, int parts,
                                const RightTiles& right, float* c, int64_t c_row_bytes) {
  char* c_bytes = reinterpret_cast<char*>(c);
  const int64_t c_lower = kTileRows * c_row_bytes;
  _tile_loadd(0, c_bytes, c_row_bytes);
  if constexpr (kColumnGroups == 2) _tile_loadd(1, c_bytes + 64, c_row_bytes);
  if constexpr (kRowGroups == 2) _tile_loadd(2, c_bytes + c_lower, c_row_bytes);
  if constexpr (kRowGroups == 2 && kColumnGroups == 2) {
    _tile_loadd(3, c_bytes + c_lower + 64, c_row_bytes);
  }
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t k = 0; k < steps[s].chunks; ++k) {
      const char* b_chunk = steps[s].b + k * right.chunk_bytes;
      _tile_loadd(6, b_chunk, right.row_bytes);
      if constexpr (kColumnGroups == 2)
        _tile_loadd(7, b_chunk + right.group_bytes, right.row_bytes);
      for (int part = 0; part < parts; ++part) {
        const char* a_chunk = steps[s].a + part * kSplitLoOffset + k * 64;
        _tile_loadd(4, a_chunk, kSplitRowBytes);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (kColumnGroups == 2) _tile_dpbf16ps(1, 4, 7);
        if constexpr (kRowGroups == 2) {
          _tile_loadd(5, a_chunk + kTileRows * kSplitRowBytes, kSplitRowBytes);
          _tile_dpbf16ps(2, 5, 6);
          if constexpr (kColumnGroups == 2) _tile_dpbf16ps(3, 5, 7);
        }
      }
    }
  }
  _tile_stored(0, c_bytes, c_row_bytes);
  if constexpr (kColumnGroups == 2) _tile_stored(1, c_bytes + 64, c_row_bytes);
  if constexpr (kRowGroups == 2) _tile_stored(2, c_bytes + c_lower, c_row_bytes);
  if constexpr (kRowGroups == 2 && kColumnGroups == 2) {
    _tile_stored(3, c_bytes + c_lower + 64, c_row_bytes);
  }
}

// split_product_tiles for 1 or 2 row groups and 1 or 2 column groups, chosen at run time.
inline void split_product_pass(bool two_rows, bool two_columns, const SplitStep* steps,
                               int64_t count, int parts, const RightTiles& right, float* c,
                               int64_t c_row_bytes) {
  if (two_rows && two_columns) {
    split_product_tiles<2, 2>(steps, count, parts, right, c, c_row_bytes);
  } else if (two_rows) {
    split_product_tiles<2, 1>(steps, count, parts, right, c, c_row_bytes);
  } else if (two_columns) {
    split_product_tiles<1, 2>(steps, count, parts, right, c, c_row_bytes);
  } else {
    split_product_tiles<1, 1>(steps, count, parts, right, c, c_row_bytes);
  }
}
