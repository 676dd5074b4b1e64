// The backward's 64-key dropout factors: philox.h's keep mask, drawn for a whole tile row at
// once in a form compilers vectorise. Plain C++; usable from the kernels and the tests alike.
#ifndef ANYATTN_CPU_BACKWARD_BWD_PHILOX_H_
#define ANYATTN_CPU_BACKWARD_BWD_PHILOX_H_

#include <cstdint>

#include "common/philox.h"

namespace anyattn::cpu {

// Dropout factors of keys j0 .. j0 + 63 of query row i of head h in batch b (j0 % 4 == 0):
// factor[t] = keep_scale when key j0 + t is kept, else 0. Exactly dropout_keep's decisions, but
// the 16 Philox calls (four keys each) run in lock step on arrays of 16 lanes: every round is a
// loop over lanes of 32 x 32 -> 64-bit multiplies and xors with no dependence between lanes, which
// compilers turn into 16-lane vector code (one AVX-512 register per counter word).
inline void dropout_keep_factors64(PhiloxKey key, int64_t b, int64_t h, int64_t i, int64_t j0,
                                   uint32_t threshold, float keep_scale, float* factor) {
  constexpr int kCalls = 16;
  constexpr uint64_t kMul0 = 0xD2511F53u;
  constexpr uint64_t kMul1 = 0xCD9E8D57u;
  uint32_t c0[kCalls], c1[kCalls], c2[kCalls], c3[kCalls];
  for (int l = 0; l < kCalls; ++l) {
    c0[l] = static_cast<uint32_t>((j0 >> 2) + l);
    c1[l] = static_cast<uint32_t>(i);
    c2[l] = static_cast<uint32_t>(h);
    c3[l] = static_cast<uint32_t>(b);
  }
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    for (int l = 0; l < kCalls; ++l) {
      const uint64_t product0 = kMul0 * c0[l];
      const uint64_t product1 = kMul1 * c2[l];
      const uint32_t next0 = static_cast<uint32_t>(product1 >> 32) ^ c1[l] ^ k0;
      const uint32_t next2 = static_cast<uint32_t>(product0 >> 32) ^ c3[l] ^ k1;
      c1[l] = static_cast<uint32_t>(product1);
      c3[l] = static_cast<uint32_t>(product0);
      c0[l] = next0;
      c2[l] = next2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int l = 0; l < kCalls; ++l) {
    factor[4 * l + 0] = c0[l] >= threshold ? keep_scale : 0.f;
    factor[4 * l + 1] = c1[l] >= threshold ? keep_scale : 0.f;
    factor[4 * l + 2] = c2[l] >= threshold ? keep_scale : 0.f;
    factor[4 * l + 3] = c3[l] >= threshold ? keep_scale : 0.f;
  }
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_BACKWARD_BWD_PHILOX_H_
