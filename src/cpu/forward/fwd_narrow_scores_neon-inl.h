// The f16 format's packing for the neon path's FMLAL scores (forward/fwd_narrow_scores.h).
// Included by fwd_narrow_scores-inl.h when ANYATTN_NARROW_F16 is defined (traits_neon.h),
// inside namespace anyattn::cpu::neon, after stage_narrow_key_rows.
//
// Per 8 keys the rows are staged bit for bit, transposed 4 x 4 as 32-bit pairs of elements (the
// f32 path's transpose_tile) for keys 0-3 and 4-7, and each pair row is split into its even and
// odd elements (UZP1/UZP2): one f16 row of the 8 keys per head-dim element.
// No include guard: included once, by fwd_narrow_scores-inl.h.

// K of one block in the f16 format: `keys` keys from j0, zero up to round_up(keys, 8). staging:
// 8 * round_up(D, 8) / 2 floats.
inline void pack_f16_keys(const FwdArgs& args, const SeqInfo& seq, int64_t head_k, int64_t j0,
                          int64_t keys, float* panel, float* staging) {
  constexpr int64_t kChunkKeys = 8;
  const int64_t pair_rows = narrow_depth(args.head_dim) / 2;  // 32-bit words per staged row
  uint16_t* kt = reinterpret_cast<uint16_t*>(panel);
  for (int64_t chunk = 0; chunk < keys; chunk += kChunkKeys) {
    stage_narrow_key_rows(args, seq, head_k, j0 + chunk,
                          std::min<int64_t>(kChunkKeys, keys - chunk), kChunkKeys, pair_rows * 4,
                          staging);
    const float* words = staging;
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
}
