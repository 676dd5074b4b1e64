// One anyattn forward or backward call over contiguous (B, S, H, D) buffers, through the public C
// ABI only.
#ifndef ANYATTN_BENCH_ANYATTN_RUNNER_H_
#define ANYATTN_BENCH_ANYATTN_RUNNER_H_

#include <cstdint>
#include <string>

#include "anyattn/anyattn.h"
#include "shapes.h"
#include "tensors.h"

namespace anyattn_bench {

// The tensor descriptors and parameters of one forward call (dense, or against a paged KV cache
// after UsePagedCache), built once and run many times.
class AnyattnFwdCall {
 public:
  // Describes q (B, Sq, Hq, D), k and v (B, Sk, Hk, D) and out (B, Sq, Hq, D), all contiguous and
  // of `dtype`, with no LSE output. `causal` selects the causal mask; `isa` is passed through
  // (ANYATTN_ISA_AUTO for the library's choice). The buffers must outlive the object.
  AnyattnFwdCall(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                 int64_t heads_k, int64_t head_dim, DType dtype, bool causal, anyattn_isa isa,
                 const void* q, const void* k, const void* v, void* out);

  // Makes the call read K and V as a paged KV cache: k and v are then (B * Sk / page_size,
  // page_size, Hk, D) pages named by the int32 block table (B, Sk / page_size), every sequence
  // holding Sk keys, and Run() calls anyattn_fwd_kvcache (no new keys). Sk must be a multiple of
  // page_size; the table must outlive the object.
  void UsePagedCache(int64_t page_size, const int32_t* block_table);

  // Makes the call read K and V as an 8-bit cache of `dtype` (ANYATTN_DTYPE_FP8_E4M3,
  // ANYATTN_DTYPE_FP8_E5M2 or ANYATTN_DTYPE_I8) through anyattn_fwd_kvcache: the whole contiguous
  // cache, or the pages of an earlier UsePagedCache. With token scales (f32, one per position and
  // kv head of k and v: (B, Sk, Hk) or (pages, page_size, Hk)) they are read as such; else one
  // descale of `descale` per tensor. The scales must outlive the object. After
  // SetValueHeadDim(.., true) v stays k's column view, and v_token_scale must be k_token_scale
  // (a shared latent cache's V takes K's scales).
  void UseKv8Cache(anyattn_dtype dtype, float descale, const float* k_token_scale,
                   const float* v_token_scale);

  // Gives v and out the head dim `head_dim_v` (<= D): v a buffer of its own, (B, Sk, Hk, Dv)
  // laid out like k (contiguous, or the same pages after UsePagedCache), or with `shared_latent`
  // the first Dv columns of k itself (absorbed MLA's latent cache: same data and strides, and
  // SetKv's v is then ignored). out becomes (B, Sq, Hq, Dv), contiguous.
  void SetValueHeadDim(int64_t head_dim_v, bool shared_latent);

  // Points k and v at other buffers of the same shape (used to rotate through KV copies).
  void SetKv(const void* k, const void* v);

  // Calls anyattn_fwd (anyattn_fwd_kvcache after UsePagedCache). On failure stores "STATUS_NAME:
  // anyattn_last_error()" in *error (if not null) and returns false.
  bool Run(std::string* error) const;

 private:
  anyattn_tensor q_{};
  anyattn_tensor k_{};
  anyattn_tensor v_{};
  anyattn_tensor out_{};
  anyattn_fwd_params params_{};
  // Set by UsePagedCache: the block table and the cache arguments that point at it.
  anyattn_tensor block_table_{};
  anyattn_kvcache_params cache_{};
  bool paged_ = false;
  // Set by UseKv8Cache: the scale tensors the cache arguments point at.
  anyattn_tensor descale_{};
  anyattn_tensor k_token_scale_{};
  anyattn_tensor v_token_scale_{};
  float descale_value_ = 1.f;
  bool kv8_ = false;
  bool shared_latent_ = false;  // v_ is a column view of k_ (SetValueHeadDim)
  // Non-empty when describing a tensor failed; Run() then reports it instead of calling anyattn.
  std::string setup_error_;
};

// The inputs and output of one dense forward call on a shape: q and out (B, Sq, Hq, D), k and v
// (B, Sk, Hk, D), contiguous, of the shape's dtype, filled uniform in [-1, 1) (seeds 1 to 4, so
// every case draws the same values for the same shape).
struct FwdBuffers {
  // Allocates and fills the four buffers; ok() is false if an allocation failed.
  explicit FwdBuffers(const FwdShape& shape);
  bool ok() const { return q.data() && k.data() && v.data() && out.data(); }
  // A call on these buffers (no mask unless shape.causal; `isa` passed through).
  AnyattnFwdCall Call(anyattn_isa isa) const;

  FwdShape shape;
  size_t q_elements = 0;
  size_t kv_elements = 0;
  AlignedBuffer q;
  AlignedBuffer k;
  AlignedBuffer v;
  AlignedBuffer out;
};

// The caller's buffers of one backward call, all contiguous: q, dq, dout and out (B, Sq, Hq, D);
// k, v, dk and dv (B, Sk, Hk, D), of the shape's dtype; lse (B, Hq, Sq) f32.
struct BwdBuffers {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// The tensor descriptors and parameters of one dense backward call on `shape` (default scale, no
// sinks, no dropout), and of the forward call that produces its out and lse, built once and run
// many times.
class AnyattnBwdCall {
 public:
  // `isa` is passed through (ANYATTN_ISA_AUTO for the library's choice). The buffers must outlive
  // the object.
  AnyattnBwdCall(const FwdShape& shape, anyattn_isa isa, const BwdBuffers& buffers);

  // Calls anyattn_fwd, writing out and lse. On failure stores "STATUS_NAME: anyattn_last_error()"
  // in *error (if not null) and returns false.
  bool RunForward(std::string* error) const;

  // Calls anyattn_bwd, writing dq, dk and dv from dout, q, k, v, out and lse. Errors as RunForward.
  bool Run(std::string* error) const;

 private:
  anyattn_tensor q_{};
  anyattn_tensor k_{};
  anyattn_tensor v_{};
  anyattn_tensor dout_{};
  anyattn_tensor out_{};
  anyattn_tensor lse_{};
  anyattn_tensor dq_{};
  anyattn_tensor dk_{};
  anyattn_tensor dv_{};
  anyattn_fwd_params params_{};
  // Non-empty when describing a tensor failed; the Run methods then report it instead of calling
  // anyattn.
  std::string setup_error_;
};

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_ANYATTN_RUNNER_H_
