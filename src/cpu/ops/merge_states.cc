#include "cpu/ops/merge_states.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/head_dims.h"
#include "cpu/shared/half.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

namespace anyattn::cpu {

void merge_states(const MergeArgs& m) {
  const int64_t rows = m.outer * m.tokens * m.heads;
  if (rows == 0) return;
  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());
  constexpr int64_t kRowsPerTask = 64;
  lease.run_each((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t task, int) {
    const int64_t end = std::min(rows, (task + 1) * kRowsPerTask);
    float merged[kMaxHeadDimV];
    for (int64_t row = task * kRowsPerTask; row < end; ++row) {
      const int64_t n = row / (m.tokens * m.heads);
      const int64_t t = row / m.heads % m.tokens;
      const int64_t h = row % m.heads;
      const float lse_a =
          m.lse_a[n * m.la_outer_stride + h * m.la_head_stride + t * m.la_token_stride];
      const float lse_b =
          m.lse_b[n * m.lb_outer_stride + h * m.lb_head_stride + t * m.lb_token_stride];
      // Outputs without columns (Dv = 0) may have no memory: only the LSE is merged then.
      const bool columns = m.head_dim > 0;
      const void* row_a = columns ? element_address(m.out_a, m.dtype,
                                                    n * m.a_outer_stride + t * m.a_token_stride +
                                                        h * m.a_head_stride)
                                  : nullptr;
      const void* row_b = columns ? element_address(m.out_b, m.dtype,
                                                    n * m.b_outer_stride + t * m.b_token_stride +
                                                        h * m.b_head_stride)
                                  : nullptr;
      const float top = std::fmax(lse_a, lse_b);  // -inf only if both are -inf
      float merged_lse;
      if (top == -std::numeric_limits<float>::infinity()) {
        for (int64_t c = 0; c < m.head_dim; ++c) merged[c] = 0.f;
        merged_lse = top;
      } else {
        // NaN in either lse makes the weights NaN, and so the row.
        const float weight_a = std::exp(lse_a - top);
        const float weight_b = std::exp(lse_b - top);
        const float total = weight_a + weight_b;
        const float scale_a = weight_a / total, scale_b = weight_b / total;
        for (int64_t c = 0; c < m.head_dim; ++c) {
          const float a = scale_a != 0.f ? scale_a * load_element(row_a, m.dtype, c) : 0.f;
          const float b = scale_b != 0.f ? scale_b * load_element(row_b, m.dtype, c) : 0.f;
          merged[c] = a + b;
        }
        merged_lse = top + std::log(total);
        if (std::isnan(lse_a) || std::isnan(lse_b)) merged_lse = std::nanf("");
      }
      if (columns) {
        void* out_row = element_address(
            m.out, m.dtype, n * m.o_outer_stride + t * m.o_token_stride + h * m.o_head_stride);
        for (int64_t c = 0; c < m.head_dim; ++c) store_element(out_row, m.dtype, c, merged[c]);
      }
      if (m.lse_out != nullptr) {
        m.lse_out[n * m.lo_outer_stride + h * m.lo_head_stride + t * m.lo_token_stride] =
            merged_lse;
      }
    }
  });
}

}  // namespace anyattn::cpu
