// The benchmark's cases: the forward table of issues 2 and 3, the backward table of issue 6, the
// decode table of issue 3, their row keys (what --filter matches) and their FLOP and byte counts
// (docs/design.md, section 1).
#ifndef ANYATTN_BENCH_SHAPES_H_
#define ANYATTN_BENCH_SHAPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensors.h"

namespace anyattn_bench {

// One dense forward call: q (B, Sq, Hq, D), k and v (B, Sk, Hk, D), out (B, Sq, Hq, D).
struct FwdShape {
  int64_t batch = 1;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 16;
  int64_t heads_k = 16;
  int64_t head_dim = 128;
  bool causal = false;
  DType dtype = DType::kF32;
};

// Query-key pairs the mask leaves visible: Sq*Sk without a mask; with the bottom-right aligned
// causal mask, query i sees keys j <= i + Sk - Sq (Sq(Sq+1)/2 when Sq == Sk).
int64_t VisiblePairs(int64_t seqlen_q, int64_t seqlen_k, bool causal);

// Forward FLOPs (docs/design.md, section 1): 4 * B * Hq * D * visible pairs.
double FwdFlops(const FwdShape& shape);

// Row key, e.g. "fwd/f32/causal/B1/Hq16/Hk4/D128/S2048" (S is Sq = Sk; "Sq.../Sk..." otherwise).
std::string FwdKey(const FwdShape& shape);

// Short label for the table's shape column, e.g. "B1 H16/4 D128 S2048".
std::string FwdLabel(const FwdShape& shape);

// The forward table: B=1, Hq=16, Hk in {16, 4}, D in {64, 128}, S in {512 .. 8192}, both masks and
// both dtypes. `quick` keeps a subset that runs in about a minute.
std::vector<FwdShape> ForwardTableShapes(bool quick);

// Backward FLOPs (docs/design.md, section 1): 2.5 * FwdFlops(shape), the useful FLOPs of the
// backward's five products (S, dP, dV, dK, dQ).
double BwdFlops(const FwdShape& shape);

// Row key of the backward call on `shape`, e.g. "bwd/f32/causal/B1/Hq16/Hk16/D128/S2048".
std::string BwdKey(const FwdShape& shape);

// The backward table: B=1, Hq=Hk=16, D in {64, 128}, S in {1024, 2048, 4096}, both masks and both
// dtypes. `quick` keeps S=2048.
std::vector<FwdShape> BackwardTableShapes(bool quick);

// The element type of a decode row's K/V cache.
enum class CacheFormat {
  kAsQ,        // the shape's dtype (f32 or bf16), as q
  kFp8E4M3,    // fp8 e4m3 with one descale per tensor
  kI8PerToken  // int8 with one f32 scale per (position, kv head), K and V
};

// One decode call: one query token per sequence against a KV cache of Sk tokens (or, with
// seqlen_q > 1, a causal chunk of prefill whose queries are the cache's last Sq positions).
struct DecodeShape {
  int64_t batch = 1;
  int64_t heads_q = 32;
  int64_t heads_k = 8;
  int64_t head_dim = 128;
  int64_t seqlen_k = 0;
  DType dtype = DType::kBf16;
  // > 0: the K/V cache is paged, (B * Sk / page_size, page_size, Hk, D) pages in scattered order
  // behind a block table, read by anyattn_fwd_kvcache; 0: a dense anyattn_fwd call.
  int64_t page_size = 0;
  // An 8-bit cache is read by anyattn_fwd_kvcache, paged or contiguous.
  CacheFormat cache = CacheFormat::kAsQ;
  int64_t seqlen_q = 1;
  // Dv, the head dim of v and out; 0: Dv = D.
  int64_t head_dim_v = 0;
  // Absorbed MLA's shared latent cache: v is the first Dv columns of k (a view of the same
  // buffer, same strides), so the call has one cache of D columns to read; false: v has its own.
  bool shared_latent = false;

  int64_t value_head_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

// "e4m3", "i8tok" or "" for a cache of q's dtype.
const char* CacheFormatName(CacheFormat cache);

// Bytes of K and V one call must read: B * Sk * Hk * (D + Dv) * element size (1 for an 8-bit
// cache), or B * Sk * Hk * D * element size for a shared latent cache (its bytes counted once),
// plus the per-token scales of an int8 cache (2 * B * Sk * Hk * 4).
double DecodeKvBytes(const DecodeShape& shape);

// Row key, e.g. "decode/bf16/B8/Hq32/Hk8/D128/Sk32768", with "/page16" for a paged cache, and for
// Dv != D "/Dv512" after the D, and "/latent" at the end for a shared latent cache.
std::string DecodeKey(const DecodeShape& shape);

// Short label for the decode table's shape column, e.g. "B8 H32/8 D128 Sk32768".
std::string DecodeLabel(const DecodeShape& shape);

// The decode table: Sq=1, B in {1, 8}, Hq=32, Hk=8, D=128, Sk in {4096, 32768}, bf16 and f32;
// each bf16 row of a dense or 16-key-page cache is followed by the same shape over an fp8 e4m3
// and an int8 per-token cache. `quick` keeps B=1. Then one chunked-prefill shape (Sq 512, Sk 4096,
// B 1) over bf16, e4m3 and int8 per-token caches, and absorbed MLA's decode (IsMlaDecode): B=1,
// Hq=16, Hk=1, D=576, Dv=512, Sk=32768, bf16, pages of 64 keys, on a shared latent cache and, for
// comparison, with v a separate buffer.
std::vector<DecodeShape> DecodeTableShapes(bool quick);

// True for the MLA rows of the decode table (Dv != D or a shared latent cache): not part of
// issue 5's decode table and its bandwidth target.
bool IsMlaDecode(const DecodeShape& shape);

// True when `filter` is empty or `key` contains every comma-separated term of `filter`.
bool MatchesFilter(const std::string& key, const std::string& filter);

// True when `filters` is empty or `key` matches at least one of them (MatchesFilter).
bool MatchesAnyFilter(const std::string& key, const std::vector<std::string>& filters);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_SHAPES_H_
