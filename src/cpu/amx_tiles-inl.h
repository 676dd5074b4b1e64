// AMX tile basics shared by the avx512_amx forward (fwd_tiles_amx-inl.h) and backward
// (bwd_kernel-inl.h with ANYATTN_BWD_BF16_TILES): the tile configuration, bf16 subnormal lanes, and
// one pass of S = Q K^T on tiles.
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
