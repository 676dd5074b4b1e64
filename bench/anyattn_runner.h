// One anyattn forward call over contiguous (B, S, H, D) buffers, through the public C ABI only.
#ifndef ANYATTN_BENCH_ANYATTN_RUNNER_H_
#define ANYATTN_BENCH_ANYATTN_RUNNER_H_

#include <cstdint>
#include <string>

#include "anyattn/anyattn.h"
#include "tensors.h"

namespace anyattn_bench {

// The tensor descriptors and parameters of one dense forward call, built once and run many times.
class AnyattnFwdCall {
 public:
  // Describes q (B, Sq, Hq, D), k and v (B, Sk, Hk, D) and out (B, Sq, Hq, D), all contiguous and
  // of `dtype`, with no LSE output. `causal` selects the causal mask; `isa` is passed through
  // (ANYATTN_ISA_AUTO for the library's choice). The buffers must outlive the object.
  AnyattnFwdCall(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                 int64_t heads_k, int64_t head_dim, DType dtype, bool causal, anyattn_isa isa,
                 const void* q, const void* k, const void* v, void* out);

  // Points k and v at other buffers of the same shape (used to rotate through KV copies).
  void SetKv(const void* k, const void* v);

  // Calls anyattn_fwd. On failure stores "STATUS_NAME: anyattn_last_error()" in *error (if not
  // null) and returns false.
  bool Run(std::string* error) const;

 private:
  anyattn_tensor q_{};
  anyattn_tensor k_{};
  anyattn_tensor v_{};
  anyattn_tensor out_{};
  anyattn_fwd_params params_{};
  // Non-empty when describing a tensor failed; Run() then reports it instead of calling anyattn.
  std::string setup_error_;
};

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_ANYATTN_RUNNER_H_
