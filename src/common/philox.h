// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11) and the dropout keep mask.
//
// Written for anyattn from the published algorithm; plain C++ with no dependencies, usable from
// the kernels, the f64 reference and the tests alike.
//
// The dropout mask is a pure function of (seed, offset, b, h, i, j): no state, no call order, no
// thread count enters it, so the forward and the backward (and any ISA path) draw the same mask.
//
//   key     = the first two words of Philox(counter = (offset_lo, offset_hi, 0, 0),
//                                           key = (seed_lo, seed_hi))
//   words   = Philox(counter = (j / 4, i, h, b), key)         // four 32-bit words per call
//   keep(b, h, i, j) = words[j % 4] >= threshold,  threshold = dropout_threshold(p)
//
// b, h, i and j are the batch index, the QUERY head, the query row and the key column of the
// attention matrix; each must be in [0, 2^31), which the C ABI's size limits guarantee. A kept
// probability is scaled by 1 / (1 - p). Deriving the key from (seed, offset) with one extra Philox
// call keeps calls with different offsets on unrelated streams.
#ifndef ANYATTN_COMMON_PHILOX_H_
#define ANYATTN_COMMON_PHILOX_H_

#include <cmath>
#include <cstdint>

namespace anyattn::cpu {

struct PhiloxKey {
  uint32_t k0 = 0;
  uint32_t k1 = 0;
};

struct PhiloxBlock {
  uint32_t w[4];
};

// One Philox-4x32 bijection with 10 rounds: a pure function of the 128-bit counter and 64-bit key.
inline PhiloxBlock philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                 PhiloxKey key) {
  constexpr uint64_t kMul0 = 0xD2511F53u;
  constexpr uint64_t kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;  // golden ratio
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = kMul0 * c0;
    const uint64_t product1 = kMul1 * c2;
    const uint32_t hi0 = static_cast<uint32_t>(product0 >> 32);
    const uint32_t lo0 = static_cast<uint32_t>(product0);
    const uint32_t hi1 = static_cast<uint32_t>(product1 >> 32);
    const uint32_t lo1 = static_cast<uint32_t>(product1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// The per-call dropout key: a function of (seed, offset) only.
inline PhiloxKey dropout_key(uint64_t seed, uint64_t offset) {
  const PhiloxKey seed_key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const PhiloxBlock block = philox4x32_10(static_cast<uint32_t>(offset),
                                          static_cast<uint32_t>(offset >> 32), 0u, 0u, seed_key);
  return PhiloxKey{block.w[0], block.w[1]};
}

// The 32-bit threshold for drop probability p in [0, 1): a word below it drops its element, so
// an element is kept with probability 1 - threshold / 2^32 = 1 - p to within 2^-32.
inline uint32_t dropout_threshold(float p) {
  if (!(p > 0.f)) return 0u;
  const double scaled = std::nearbyint(static_cast<double>(p) * 4294967296.0);
  return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
}

// Keep bits of keys j0 .. j0 + 15 of query row i of head h in batch b: bit t is set iff key
// j0 + t is kept. j0 must be a multiple of 4 (four Philox calls serve 16 keys). The loop over the
// four calls is independent work that vectorising compilers may run in parallel lanes.
inline uint32_t dropout_keep_bits16(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                    uint32_t threshold) {
  uint32_t bits = 0;
  for (int call = 0; call < 4; ++call) {
    const PhiloxBlock block =
        philox4x32_10(static_cast<uint32_t>((j0 >> 2) + call), static_cast<uint32_t>(i),
                      static_cast<uint32_t>(h), static_cast<uint32_t>(b), key);
    for (int word = 0; word < 4; ++word) {
      if (block.w[word] >= threshold) bits |= 1u << (4 * call + word);
    }
  }
  return bits;
}

// The keep decision of one element, given the per-call key.
inline bool dropout_keep(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j,
                         uint32_t threshold) {
  const PhiloxBlock block = philox4x32_10(static_cast<uint32_t>(j >> 2), static_cast<uint32_t>(i),
                                          static_cast<uint32_t>(h), static_cast<uint32_t>(b), key);
  return block.w[j & 3] >= threshold;
}

// The keep decision of one element from the raw (seed, offset). Same result as the overload
// above with key = dropout_key(seed, offset); prefer that one in loops.
inline bool dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h, int64_t i, int64_t j,
                         uint32_t threshold) {
  return dropout_keep(dropout_key(seed, offset), b, h, i, j, threshold);
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_COMMON_PHILOX_H_
