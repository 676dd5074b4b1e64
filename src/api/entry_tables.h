// The tensors of every entry point, as CallCheck checks them (call_check.h): one row per tensor
// with its name, symbolic dims, dtypes, role and whether it may be NULL. A table lists the
// tensors in the order the C function takes them; its last field ends a dtype mismatch message.
// The checks a table cannot say (cu_seqlens, cache lengths, block tables, options) are the
// entry points' own, in validate_*.cc.
#ifndef ANYATTN_API_ENTRY_TABLES_H_
#define ANYATTN_API_ENTRY_TABLES_H_

#include "api/call_check.h"

namespace anyattn::api::tables {

using D = Dim;
constexpr DTypes kShared = DTypes::kShared;
constexpr DTypes kF32 = DTypes::kF32;
constexpr Role kIn = Role::kInput;
constexpr Role kOut = Role::kOutput;
constexpr bool kRequired = false;
constexpr bool kOptional = true;

// ---- Attention tensors, dense (B, S, H, D) and packed varlen (total, H, D) ----------------------

inline constexpr TensorSpec kDenseQ = {"q", {D::kB, D::kSq, D::kHq, D::kD}, kShared, kIn};
inline constexpr TensorSpec kDenseK = {"k", {D::kB, D::kSk, D::kHk, D::kD}, kShared, kIn};
inline constexpr TensorSpec kDenseV = {"v", {D::kB, D::kSk, D::kHk, D::kDv}, kShared, kIn};
inline constexpr TensorSpec kDenseOut = {"out", {D::kB, D::kSq, D::kHq, D::kDv}, kShared, kOut};
inline constexpr TensorSpec kDenseLse = {"lse", {D::kB, D::kHq, D::kSq}, kF32, kOut, kOptional};

inline constexpr TensorSpec kPackedQ = {"q", {D::kTotalQ, D::kHq, D::kD}, kShared, kIn};
inline constexpr TensorSpec kPackedK = {"k", {D::kTotalK, D::kHk, D::kD}, kShared, kIn};
inline constexpr TensorSpec kPackedV = {"v", {D::kTotalK, D::kHk, D::kDv}, kShared, kIn};
inline constexpr TensorSpec kPackedOut = {"out", {D::kTotalQ, D::kHq, D::kDv}, kShared, kOut};
inline constexpr TensorSpec kPackedLse = {"lse", {D::kHq, D::kTotalQ}, kF32, kOut, kOptional};

// The backward reads out and lse, which the forward wrote.
constexpr TensorSpec read_by_backward(TensorSpec spec) {
  spec.role = kIn;
  spec.optional = kRequired;
  return spec;
}

// ---- anyattn_fwd and anyattn_fwd_varlen ---------------------------------------------------------

constexpr const char* kFwdDtypeRule = "q, k, v and out must share one dtype";
inline constexpr TensorSpec kFwdSpecs[] = {kDenseQ, kDenseK, kDenseV, kDenseOut, kDenseLse};
inline constexpr TensorTable kFwd = make_table(kFwdSpecs, kFwdDtypeRule);
inline constexpr TensorSpec kFwdVarlenSpecs[] = {kPackedQ, kPackedK, kPackedV, kPackedOut,
                                                 kPackedLse};
inline constexpr TensorTable kFwdVarlen = make_table(kFwdVarlenSpecs, kFwdDtypeRule);

// ---- anyattn_bwd and anyattn_bwd_varlen: the forward's tensors, then the gradients --------------

constexpr const char* kBwdDtypeRule = "q, k, v, out, dout, dq, dk and dv must share one dtype";
inline constexpr TensorSpec kBwdForwardSpecs[] = {
    kDenseQ, kDenseK, kDenseV, read_by_backward(kDenseOut), read_by_backward(kDenseLse)};
inline constexpr TensorTable kBwdForward = make_table(kBwdForwardSpecs, kBwdDtypeRule);
inline constexpr TensorSpec kBwdGradientSpecs[] = {
    {"dout", {D::kB, D::kSq, D::kHq, D::kDv}, kShared, kIn},
    {"dq", {D::kB, D::kSq, D::kHq, D::kD}, kShared, kOut},
    {"dk", {D::kB, D::kSk, D::kHk, D::kD}, kShared, kOut},
    {"dv", {D::kB, D::kSk, D::kHk, D::kDv}, kShared, kOut}};
inline constexpr TensorTable kBwdGradients = make_table(kBwdGradientSpecs, kBwdDtypeRule);

inline constexpr TensorSpec kBwdVarlenForwardSpecs[] = {
    kPackedQ, kPackedK, kPackedV, read_by_backward(kPackedOut), read_by_backward(kPackedLse)};
inline constexpr TensorTable kBwdVarlenForward = make_table(kBwdVarlenForwardSpecs, kBwdDtypeRule);
inline constexpr TensorSpec kBwdVarlenGradientSpecs[] = {
    {"dout", {D::kTotalQ, D::kHq, D::kDv}, kShared, kIn},
    {"dq", {D::kTotalQ, D::kHq, D::kD}, kShared, kOut},
    {"dk", {D::kTotalK, D::kHk, D::kD}, kShared, kOut},
    {"dv", {D::kTotalK, D::kHk, D::kDv}, kShared, kOut}};
inline constexpr TensorTable kBwdVarlenGradients =
    make_table(kBwdVarlenGradientSpecs, kBwdDtypeRule);

// The sink gradient, given exactly when params->sinks is.
inline constexpr TensorSpec kDsinksSpecs[] = {{"dsinks", {D::kHq}, kF32, kOut, kOptional}};
inline constexpr TensorTable kDsinks = make_table(kDsinksSpecs, kBwdDtypeRule);

// ---- anyattn_fwd_kvcache (dense q) and anyattn_fwd_kvcache_varlen (packed q) --------------------

constexpr const char* kCacheDtypeRule =
    "q, the new keys/values, out and a float cache share one dtype";
constexpr Role kCached = Role::kCache;
constexpr DTypes kCacheDtype = DTypes::kKvCache;
inline constexpr TensorSpec kKCache = {
    "k_cache", {D::kCacheBatches, D::kCacheLen, D::kHk, D::kD}, kCacheDtype, kCached};
inline constexpr TensorSpec kVCache = {
    "v_cache", {D::kCacheBatches, D::kCacheLen, D::kHk, D::kDv}, kCacheDtype, kCached};
inline constexpr TensorSpec kKPages = {
    "k_cache", {D::kPages, D::kPageSize, D::kHk, D::kD}, kCacheDtype, kCached};
inline constexpr TensorSpec kVPages = {
    "v_cache", {D::kPages, D::kPageSize, D::kHk, D::kDv}, kCacheDtype, kCached};

inline constexpr TensorSpec kCacheSpecs[] = {kDenseQ, kKCache, kVCache, kDenseOut, kDenseLse};
inline constexpr TensorTable kCacheContiguous = make_table(kCacheSpecs, kCacheDtypeRule);
inline constexpr TensorSpec kPagedSpecs[] = {kDenseQ, kKPages, kVPages, kDenseOut, kDenseLse};
inline constexpr TensorTable kCachePaged = make_table(kPagedSpecs, kCacheDtypeRule);
inline constexpr TensorSpec kCacheVarlenSpecs[] = {kPackedQ, kKCache, kVCache, kPackedOut,
                                                   kPackedLse};
inline constexpr TensorTable kCacheVarlenContiguous =
    make_table(kCacheVarlenSpecs, kCacheDtypeRule);
inline constexpr TensorSpec kPagedVarlenSpecs[] = {kPackedQ, kKPages, kVPages, kPackedOut,
                                                   kPackedLse};
inline constexpr TensorTable kCacheVarlenPaged = make_table(kPagedVarlenSpecs, kCacheDtypeRule);

// The keys and values appended before the attention (dense q only).
inline constexpr TensorSpec kAppendSpecs[] = {
    {"cache->k_new", {D::kB, D::kNewTokens, D::kHk, D::kD}, kShared, kIn},
    {"cache->v_new", {D::kB, D::kNewTokens, D::kHk, D::kDv}, kShared, kIn}};
inline constexpr TensorTable kAppend = make_table(kAppendSpecs, kCacheDtypeRule);

// The rotary tables, in any float dtype.
inline constexpr TensorSpec kRotarySpecs[] = {
    {"cache->rotary_cos", {D::kRotaryPositions, D::kRotaryHalf}, DTypes::kAnyFloat, kIn},
    {"cache->rotary_sin", {D::kRotaryPositions, D::kRotaryHalf}, DTypes::kAnyFloat, kIn}};
inline constexpr TensorTable kRotary = make_table(kRotarySpecs, kCacheDtypeRule);

// The per-token scales of an 8-bit cache, (B_cache, S_cache, Hk) or paged (num_blocks, page_size,
// Hk): cache data that the append writes.
inline constexpr TensorSpec kTokenScaleSpecs[] = {
    {"cache->k_token_scale", {D::kCacheBatches, D::kCacheLen, D::kHk}, kF32, kCached},
    {"cache->v_token_scale", {D::kCacheBatches, D::kCacheLen, D::kHk}, kF32, kCached}};
inline constexpr TensorTable kTokenScales = make_table(kTokenScaleSpecs, kCacheDtypeRule);
inline constexpr TensorSpec kPagedTokenScaleSpecs[] = {
    {"cache->k_token_scale", {D::kPages, D::kPageSize, D::kHk}, kF32, kCached},
    {"cache->v_token_scale", {D::kPages, D::kPageSize, D::kHk}, kF32, kCached}};
inline constexpr TensorTable kPagedTokenScales = make_table(kPagedTokenScaleSpecs, kCacheDtypeRule);

// ---- anyattn_merge_attention_states: out may be out_a or out_b, lse_out lse_a or lse_b ----------

constexpr const char* kMergeDtypeRule = "the outputs must share one dtype";
constexpr uint8_t kStates = 1;  // in-place group of the outputs
constexpr uint8_t kLses = 2;    // in-place group of the lse
inline constexpr TensorSpec kMergeTokensSpecs[] = {
    {"out_a", {D::kMergeT, D::kMergeH, D::kMergeDv}, kShared, kIn, kRequired, kStates},
    {"lse_a", {D::kMergeH, D::kMergeT}, kF32, kIn, kRequired, kLses},
    {"out_b", {D::kMergeT, D::kMergeH, D::kMergeDv}, kShared, kIn, kRequired, kStates},
    {"lse_b", {D::kMergeH, D::kMergeT}, kF32, kIn, kRequired, kLses},
    {"out", {D::kMergeT, D::kMergeH, D::kMergeDv}, kShared, kOut, kRequired, kStates},
    {"lse_out", {D::kMergeH, D::kMergeT}, kF32, kOut, kOptional, kLses}};
inline constexpr TensorTable kMergeTokens = make_table(kMergeTokensSpecs, kMergeDtypeRule);
inline constexpr TensorSpec kMergeBatchedSpecs[] = {
    {"out_a", {D::kB, D::kMergeS, D::kMergeH, D::kMergeDv}, kShared, kIn, kRequired, kStates},
    {"lse_a", {D::kB, D::kMergeH, D::kMergeS}, kF32, kIn, kRequired, kLses},
    {"out_b", {D::kB, D::kMergeS, D::kMergeH, D::kMergeDv}, kShared, kIn, kRequired, kStates},
    {"lse_b", {D::kB, D::kMergeH, D::kMergeS}, kF32, kIn, kRequired, kLses},
    {"out", {D::kB, D::kMergeS, D::kMergeH, D::kMergeDv}, kShared, kOut, kRequired, kStates},
    {"lse_out", {D::kB, D::kMergeH, D::kMergeS}, kF32, kOut, kOptional, kLses}};
inline constexpr TensorTable kMergeBatched = make_table(kMergeBatchedSpecs, kMergeDtypeRule);

}  // namespace anyattn::api::tables

#endif  // ANYATTN_API_ENTRY_TABLES_H_
