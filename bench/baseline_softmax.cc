// Compiled with -ffast-math (see CMakeLists.txt) so that GCC vectorises expf through libmvec and
// the max and sum reductions through vector registers. Scores are finite by contract and masked
// columns are never passed to expf, so fast-math's no-infinity assumption holds.
#include "baseline_softmax.h"

#include <algorithm>
#include <cmath>

namespace anyattn_bench {
namespace {

// Softmax of one row of `visible` finite scores in place, zeroing `masked` columns after them.
inline __attribute__((always_inline)) void SoftmaxRow(float* row, int64_t visible, int64_t masked) {
  float max_score = row[0];
  for (int64_t j = 1; j < visible; ++j) max_score = std::max(max_score, row[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < visible; ++j) {
    row[j] = std::exp(row[j] - max_score);
    sum += row[j];
  }
  const float inverse_sum = 1.0f / sum;
  for (int64_t j = 0; j < visible; ++j) row[j] *= inverse_sum;
  std::fill(row + visible, row + visible + masked, 0.0f);
}

// The rows loop of SoftmaxRowsInPlace, inlined into each ISA variant below.
inline __attribute__((always_inline)) void SoftmaxRowsBody(float* scores, int64_t cols,
                                                           int64_t row_begin, int64_t row_end,
                                                           bool causal, int64_t causal_offset) {
  for (int64_t i = row_begin; i < row_end; ++i) {
    float* row = scores + i * cols;
    const int64_t visible = causal ? std::clamp<int64_t>(i + causal_offset + 1, 0, cols) : cols;
    if (visible == 0) {
      std::fill(row, row + cols, 0.0f);
    } else {
      SoftmaxRow(row, visible, cols - visible);
    }
  }
}

__attribute__((target("avx512f,avx512dq"))) void SoftmaxRowsAvx512(float* scores, int64_t cols,
                                                                   int64_t row_begin,
                                                                   int64_t row_end, bool causal,
                                                                   int64_t causal_offset) {
  SoftmaxRowsBody(scores, cols, row_begin, row_end, causal, causal_offset);
}

__attribute__((target("avx2,fma"))) void SoftmaxRowsAvx2(float* scores, int64_t cols,
                                                         int64_t row_begin, int64_t row_end,
                                                         bool causal, int64_t causal_offset) {
  SoftmaxRowsBody(scores, cols, row_begin, row_end, causal, causal_offset);
}

void SoftmaxRowsBaseline(float* scores, int64_t cols, int64_t row_begin, int64_t row_end,
                         bool causal, int64_t causal_offset) {
  SoftmaxRowsBody(scores, cols, row_begin, row_end, causal, causal_offset);
}

}  // namespace

void SoftmaxRowsInPlace(float* scores, int64_t cols, int64_t row_begin, int64_t row_end,
                        bool causal, int64_t causal_offset) {
  static const int isa_level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
  }();
  if (isa_level == 2) {
    SoftmaxRowsAvx512(scores, cols, row_begin, row_end, causal, causal_offset);
  } else if (isa_level == 1) {
    SoftmaxRowsAvx2(scores, cols, row_begin, row_end, causal, causal_offset);
  } else {
    SoftmaxRowsBaseline(scores, cols, row_begin, row_end, causal, causal_offset);
  }
}

}  // namespace anyattn_bench
