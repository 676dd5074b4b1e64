// The unfused attention a user would write with a BLAS: for every (batch, head), S = Q·Kᵀ with
// cblas_sgemm, a row softmax with the mask, then O = P·V with cblas_sgemm. It materialises one
// Sq x Sk f32 score matrix (one head at a time) and is the benchmark's first peer.
#ifndef ANYATTN_BENCH_BASELINE_OPENBLAS_H_
#define ANYATTN_BENCH_BASELINE_OPENBLAS_H_

#include <string>

#include "shapes.h"
#include "tensors.h"
#include "thread_team.h"

namespace anyattn_bench {

// Seconds after a call during which Debian's pthread OpenBLAS keeps its workers spinning (about
// 2^28 cycles) before they sleep; whatever runs next on the same cores waits this long first.
constexpr double kOpenBlasSpinSeconds = 0.1;

class UnfusedBaseline {
 public:
  // Allocates the score matrix of `shape` and, for bf16, f32 copies of q, k, v and out; sets
  // OpenBLAS to `threads` threads and builds a team of as many for the softmax and conversions.
  // Check ok() before Run().
  UnfusedBaseline(const FwdShape& shape, int threads);

  // Bytes of the one score matrix the baseline materialises: Sq * Sk * 4.
  static double ScoreBytes(const FwdShape& shape);

  // True when every allocation succeeded.
  bool ok() const { return ok_; }

  // out = softmax(q kᵀ / sqrt(D) + mask) v per (batch, query head), with query head h reading kv
  // head h / (Hq / Hk) and the causal mask bottom-right aligned. q, k, v and out are contiguous
  // (B, S, H, D) buffers of the shape's dtype. For bf16 the inputs are widened to f32 first and
  // the output rounded back to bf16, and both conversions are part of the call.
  void Run(const void* q, const void* k, const void* v, void* out);

  // A one-line description of what Run() does, for the report.
  static std::string Description();

 private:
  // The f32 algorithm over f32 (B, S, H, D) buffers.
  void RunF32(const float* q, const float* k, const float* v, float* out);

  FwdShape shape_;
  ThreadTeam team_;
  AlignedBuffer scores_;
  AlignedBuffer q_f32_;
  AlignedBuffer k_f32_;
  AlignedBuffer v_f32_;
  AlignedBuffer out_f32_;
  bool ok_ = false;
};

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_BASELINE_OPENBLAS_H_
