// Rotary position embedding of one row, shared by the KV-cache append (new keys) and the forward
// kernels (queries). Plain scalar code: it runs once per row, not per score.
#ifndef ANYATTN_CPU_SHARED_ROTARY_H_
#define ANYATTN_CPU_SHARED_ROTARY_H_

#include <cstdint>

namespace anyattn::cpu {

// Rotates the first rotary_dim values of `row` by the angles of one position (cos/sin: rotary_dim
// / 2 values): pairs (2t, 2t+1) when interleaved (GPT-J), else (t, t + rotary_dim/2) (GPT-NeoX).
inline void apply_rotary(const float* cos, const float* sin, int64_t rotary_dim, bool interleaved,
                         float* row) {
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < half; ++t) {
    const int64_t a = interleaved ? 2 * t : t;
    const int64_t b = interleaved ? 2 * t + 1 : t + half;
    const float x0 = row[a], x1 = row[b];
    row[a] = x0 * cos[t] - x1 * sin[t];
    row[b] = x0 * sin[t] + x1 * cos[t];
  }
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_SHARED_ROTARY_H_
