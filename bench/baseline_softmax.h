// The row softmax of the unfused baseline, vectorised the way a framework's softmax is (glibc's
// libmvec expf), so that the baseline is not handicapped by a scalar exp.
#ifndef ANYATTN_BENCH_BASELINE_SOFTMAX_H_
#define ANYATTN_BENCH_BASELINE_SOFTMAX_H_

#include <cstdint>

namespace anyattn_bench {

// Turns rows [row_begin, row_end) of the row-major score matrix `scores` (row stride `cols`) into
// probabilities in place. Without `causal` every column is visible. With `causal`, row i sees
// columns j <= i + causal_offset (bottom-right alignment: causal_offset = Sk - Sq); masked columns
// become 0, exactly what exp(-inf) would give, and a row with no visible column becomes all 0.
// Scores must be finite. Chooses AVX-512, AVX2 or baseline code at run time.
void SoftmaxRowsInPlace(float* scores, int64_t cols, int64_t row_begin, int64_t row_end,
                        bool causal, int64_t causal_offset);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_BASELINE_SOFTMAX_H_
