// The validated description of one forward attention call, in the form every CPU kernel reads.
//
// Built only by api/validate_fwd.cc, after every check has passed: a kernel may rely on every
// invariant documented here without re-checking it. All strides are in elements, int64.
#ifndef ANYATTN_CPU_FWD_ARGS_H_
#define ANYATTN_CPU_FWD_ARGS_H_

#include <cstdint>

namespace anyattn::cpu {

enum class DType : int32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// Window bound meaning "no limit on this side". Large enough that no valid index reaches it, small
// enough that i + Sk - Sq +/- it never overflows int64.
constexpr int64_t kUnboundedWindow = int64_t{1} << 48;

struct FwdArgs {
  DType dtype = DType::kF32;  // of q, k, v and out

  int64_t batch = 0;       // B
  int64_t seqlen_q = 0;    // Sq
  int64_t seqlen_k = 0;    // Sk
  int64_t heads_q = 0;     // Hq >= 1
  int64_t heads_k = 0;     // Hk >= 1, Hq % Hk == 0
  int64_t head_dim = 0;    // D in [1, 256]
  int64_t head_dim_v = 0;  // Dv in [1, 256]

  // q[b][i][h][d] = q_data[b*q_batch_stride + i*q_row_stride + h*q_head_stride + d]; likewise k,
  // v and out. lse[b][h][i] = lse_data[b*lse_batch_stride + h*lse_head_stride + i*lse_row_stride].
  const void* q = nullptr;
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  const void* k = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  const void* v = nullptr;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  void* out = nullptr;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  float* lse = nullptr;  // optional
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;

  float softmax_scale = 0.f;  // resolved: never the "0 = default" marker
  float softcap = 0.f;        // 0 = off, else > 0
  // Visible keys for query i: [i + Sk - Sq - window_left, i + Sk - Sq + window_right].
  int64_t window_left = kUnboundedWindow;
  int64_t window_right = kUnboundedWindow;

  // slope of (b, h) = alibi_slopes[b*alibi_batch_stride + h*alibi_head_stride]; batch stride 0
  // for slopes of shape (Hq).
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0, alibi_head_stride = 0;
  // sink of head h = sinks[h*sinks_stride], natural-log score units.
  const float* sinks = nullptr;
  int64_t sinks_stride = 0;

  int32_t num_splits = 0;  // 0 = choose from the shape

  int64_t group_size() const { return heads_q / heads_k; }
  bool has_mask() const {
    return window_left < kUnboundedWindow || window_right < kUnboundedWindow;
  }
};

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_FWD_ARGS_H_
