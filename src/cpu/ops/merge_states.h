// Merging two partial attention results over disjoint key sets by their log-sum-exp.
#ifndef ANYATTN_CPU_OPS_MERGE_STATES_H_
#define ANYATTN_CPU_OPS_MERGE_STATES_H_

#include <cstdint>

#include "common/fwd_args.h"

namespace anyattn::cpu {

// Rows are (outer, token, head) triples; element c of row (n, t, h) of tensor X is at
// X + n*X_outer_stride + t*X_token_stride + h*X_head_stride + c, and its lse at
// lse + n*lse_outer_stride + h*lse_head_stride + t*lse_token_stride.
struct MergeArgs {
  DType dtype = DType::kF32;
  int64_t outer = 0, tokens = 0, heads = 0, head_dim = 0;
  const void* out_a = nullptr;
  int64_t a_outer_stride = 0, a_token_stride = 0, a_head_stride = 0;
  const void* out_b = nullptr;
  int64_t b_outer_stride = 0, b_token_stride = 0, b_head_stride = 0;
  void* out = nullptr;
  int64_t o_outer_stride = 0, o_token_stride = 0, o_head_stride = 0;
  const float* lse_a = nullptr;
  int64_t la_outer_stride = 0, la_head_stride = 0, la_token_stride = 0;
  const float* lse_b = nullptr;
  int64_t lb_outer_stride = 0, lb_head_stride = 0, lb_token_stride = 0;
  float* lse_out = nullptr;  // optional
  int64_t lo_outer_stride = 0, lo_head_stride = 0, lo_token_stride = 0;
};

// Writes every merged row. Each row reads its inputs completely before writing, so out may be
// out_a or out_b (and lse_out lse_a or lse_b) exactly. Multithreaded over rows.
void merge_states(const MergeArgs& args);

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_OPS_MERGE_STATES_H_
