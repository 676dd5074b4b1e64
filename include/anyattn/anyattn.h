/*
 * anyattn: exact attention with FlashAttention 2.x semantics, on any CPU.
 *
 * This header is the one stable boundary of the library. Every other front end (C++, Python, Rust)
 * goes through it. It is plain C99 and C++ compatible.
 *
 * Conventions used throughout:
 *   - Tensors are described by `anyattn_tensor`: a data pointer, a dtype, a rank and per-dimension
 *     shape and strides counted in ELEMENTS (not bytes). The last dimension must have stride 1;
 *     every other stride is arbitrary (views, packed qkv, transposed batches), including 0.
 *   - Dense attention shapes: q (B, Sq, Hq, D), k (B, Sk, Hk, D), v (B, Sk, Hk, Dv),
 *     out (B, Sq, Hq, Dv), lse (B, Hq, Sq). Hq % Hk == 0; query head h reads kv head h / (Hq / Hk).
 *   - q, k and v share one dtype (f32, f16 or bf16); out has that dtype; lse is f32, natural log.
 *     The KV-cache calls also take 8-bit caches (FP8_E4M3, FP8_E5M2, I8) with f32 scales.
 *   - Every entry point returns an `anyattn_status`. On failure `anyattn_last_error()` returns a
 *     message that names the offending parameter, the value given and what is supported. No C++
 *     exception ever crosses this boundary.
 *   - All entry points may be called from several threads at once.
 *
 * The exact semantics (mask alignment, softcap, ALiBi, sinks, fully masked rows) are in
 * docs/semantics.md.
 */
#ifndef ANYATTN_ANYATTN_H_
#define ANYATTN_ANYATTN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#if defined(ANYATTN_BUILDING_LIBRARY)
#define ANYATTN_API __declspec(dllexport)
#elif defined(ANYATTN_SHARED)
#define ANYATTN_API __declspec(dllimport)
#else
#define ANYATTN_API
#endif
#else
#define ANYATTN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------- */
/* Version                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

#define ANYATTN_VERSION_MAJOR 0
#define ANYATTN_VERSION_MINOR 1
#define ANYATTN_VERSION_PATCH 0
/* Encoded as major * 10000 + minor * 100 + patch. */
#define ANYATTN_VERSION \
  (ANYATTN_VERSION_MAJOR * 10000 + ANYATTN_VERSION_MINOR * 100 + ANYATTN_VERSION_PATCH)

/* The version of the library actually loaded, encoded like ANYATTN_VERSION. */
ANYATTN_API int anyattn_version(void);
/* The same as a "major.minor.patch" string with static storage. */
ANYATTN_API const char* anyattn_version_string(void);

/* ---------------------------------------------------------------------------------------------- */
/* Status and errors                                                                              */
/* ---------------------------------------------------------------------------------------------- */

typedef enum anyattn_status {
  ANYATTN_OK = 0,
  /* A parameter is malformed: wrong shape, dtype, stride, range or a null pointer. */
  ANYATTN_E_INVALID_ARGUMENT = 1,
  /* The request is well formed but names a feature this build or CPU does not provide. */
  ANYATTN_E_UNSUPPORTED = 2,
  /* Workspace could not be allocated. Nothing was written to the outputs. */
  ANYATTN_E_OUT_OF_MEMORY = 3,
  /* A bug in anyattn. Please report it with the message. */
  ANYATTN_E_INTERNAL = 4
} anyattn_status;

/* Message describing the last failure on the calling thread, or "" if the last call on this
 * thread succeeded. The pointer stays valid until the next anyattn call on the same thread. */
ANYATTN_API const char* anyattn_last_error(void);

/* A short static name for a status code, e.g. "ANYATTN_E_INVALID_ARGUMENT". */
ANYATTN_API const char* anyattn_status_name(anyattn_status status);

/* ---------------------------------------------------------------------------------------------- */
/* Tensors                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

typedef enum anyattn_dtype {
  ANYATTN_DTYPE_F32 = 0,
  ANYATTN_DTYPE_F16 = 1,
  ANYATTN_DTYPE_BF16 = 2,
  ANYATTN_DTYPE_I32 = 3,
  /* 8-bit KV-cache element types (k_cache and v_cache only; see anyattn_kvcache_params). */
  /* float8 e4m3, the "fn" convention of torch.float8_e4m3fn: bias 7, no infinities, largest
   * finite +-448, NaN = S.1111.111 (0x7F / 0xFF), subnormals 2^-9 .. 7 * 2^-9. */
  ANYATTN_DTYPE_FP8_E4M3 = 4,
  /* float8 e5m2 (torch.float8_e5m2): IEEE-style, bias 15, +-inf, NaNs, largest finite +-57344. */
  ANYATTN_DTYPE_FP8_E5M2 = 5,
  /* Signed two's-complement int8; read as its integer value -128 .. 127. */
  ANYATTN_DTYPE_I8 = 6,
  /* Not a dtype: makes every non-negative int32 a valid value of this type, so that a caller
   * passing an unknown value gets ANYATTN_E_INVALID_ARGUMENT rather than undefined behaviour. */
  ANYATTN_DTYPE_MAX_ENUM = 0x7fffffff
} anyattn_dtype;

#define ANYATTN_MAX_NDIM 4

/* The largest head dims every entry point accepts: D (q, k) and Dv (v, out). 576 and 512 are
 * absorbed MLA's (docs/semantics.md, "Shared latent cache"). */
#define ANYATTN_MAX_HEAD_DIM 576
#define ANYATTN_MAX_HEAD_DIM_V 512

/* A strided view of memory. Mirrors DLPack's DLTensor with element strides.
 * `dtype` holds an anyattn_dtype value; entries of shape/strides at or beyond `ndim` are ignored. */
typedef struct anyattn_tensor {
  void* data;
  int32_t dtype;
  int32_t ndim;
  int64_t shape[ANYATTN_MAX_NDIM];
  int64_t strides[ANYATTN_MAX_NDIM];
} anyattn_tensor;

/* Fills `t` as a C-contiguous (row-major) tensor of the given shape over `data`.
 * Returns ANYATTN_E_INVALID_ARGUMENT if t or shape is null, ndim is outside [1, ANYATTN_MAX_NDIM],
 * a dimension is negative or dtype is unknown. */
ANYATTN_API anyattn_status anyattn_tensor_init_contiguous(anyattn_tensor* t, void* data,
                                                          anyattn_dtype dtype, int32_t ndim,
                                                          const int64_t* shape);

/* Bytes per element of `dtype` (4, 2 or 1), or 0 for a value that is no dtype. */
ANYATTN_API int64_t anyattn_dtype_size(int32_t dtype);

/* ---------------------------------------------------------------------------------------------- */
/* Instruction-set paths                                                                          */
/* ---------------------------------------------------------------------------------------------- */

typedef enum anyattn_isa {
  /* The fastest path the CPU supports (or the one named by the ANYATTN_ISA environment variable,
   * one of "portable", "avx2", "avx512", "avx512_amx", "neon"). */
  ANYATTN_ISA_AUTO = 0,
  /* Plain C++ that every machine runs. */
  ANYATTN_ISA_PORTABLE = 1,
  /* x86-64 AVX2 + FMA + F16C. */
  ANYATTN_ISA_AVX2 = 2,
  /* x86-64 AVX-512 F/BW/VL/DQ. */
  ANYATTN_ISA_AVX512 = 3,
  /* ANYATTN_ISA_AVX512 with bf16 forward products on AMX tiles (AVX512_BF16, AMX-TILE, AMX-BF16,
   * and an OS that grants the tile state); every other call runs as on ANYATTN_ISA_AVX512. */
  ANYATTN_ISA_AVX512_AMX = 4,
  /* AArch64 Advanced SIMD (NEON), which every AArch64 CPU has. */
  ANYATTN_ISA_NEON = 5,
  /* Not a path: makes every non-negative int32 a valid value of this type (see
   * ANYATTN_DTYPE_MAX_ENUM). */
  ANYATTN_ISA_MAX_ENUM = 0x7fffffff
} anyattn_isa;

/* 1 if this build contains the path and the running CPU can execute it, else 0. */
ANYATTN_API int anyattn_isa_supported(anyattn_isa isa);
/* The path ANYATTN_ISA_AUTO resolves to (never ANYATTN_ISA_AUTO): the one named by the ANYATTN_ISA
 * environment variable when that is set and runnable, else the fastest this build and CPU support. */
ANYATTN_API anyattn_isa anyattn_isa_default(void);
/* "auto", "portable", "avx2", "avx512", "avx512_amx", "neon", or "unknown". Static storage. The
 * paths' values run from 1 without gaps, so a binding lists every name by calling this for 0, 1, 2,
 * ... until it answers "unknown". */
ANYATTN_API const char* anyattn_isa_name(anyattn_isa isa);

/* One forward kernel of the registry (one per row of src/cpu/isa_table.inc): the list the
 * dispatcher, the tests and the benchmark enumerate. */
typedef struct anyattn_kernel_info {
  const char* name;     /* e.g. "fwd_f32acc_avx512_6x64": ISA, then the score tile rows x keys */
  int32_t isa;          /* an anyattn_isa value */
  int32_t supported;    /* 1 if this CPU can run it */
  int32_t vector_lanes; /* floats per vector register */
  int32_t tile_rows;    /* query rows per register tile */
  int32_t tile_keys;    /* keys per register tile */
} anyattn_kernel_info;

/* Number of forward kernels compiled into this build. */
ANYATTN_API int anyattn_fwd_kernel_count(void);
/* Fills *info for kernel `index` in [0, anyattn_fwd_kernel_count()). */
ANYATTN_API anyattn_status anyattn_fwd_kernel_info(int index, anyattn_kernel_info* info);

/* ---------------------------------------------------------------------------------------------- */
/* Threads                                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Sets the number of threads used by later calls, process-wide. n <= 0 restores the default: the
 * ANYATTN_NUM_THREADS environment variable if set to a positive integer, else the number of CPUs in
 * the process's affinity mask. Concurrent calls share one pool and never oversubscribe it: a call
 * that finds the pool busy runs on its caller's thread alone. Results do not depend on the thread
 * count (bitwise). */
ANYATTN_API void anyattn_set_num_threads(int n);
/* The thread count later calls will use. */
ANYATTN_API int anyattn_get_num_threads(void);

/* A host's parallel region (see anyattn_set_host_parallel): runs body(context, worker) once on
 * each of up to `threads` of the host's threads, the worker indices distinct and in [0, threads),
 * and returns when every body has returned. It may run fewer bodies, down to one on the calling
 * thread with worker 0 (a nested region): the library's tasks are claimed from a shared counter,
 * so any number of bodies completes them. It must accept calls from any thread. */
typedef void (*anyattn_parallel_body)(void* context, int worker);
typedef void (*anyattn_host_parallel_fn)(int threads, anyattn_parallel_body body, void* context);

/* Runs the parallel phases of later calls on the host's threads through `parallel` instead of the
 * library's own pool; NULL restores the pool. For processes whose runtime keeps its own threads
 * busy between its parallel regions (an OpenMP team spins on its cores for a while after each
 * region, as PyTorch's does): there the pool's workers would compete with those threads for the
 * cores. The thread count (anyattn_set_num_threads) and the one-caller-at-a-time rule are
 * unchanged, and so are the results (bitwise). Set it before concurrent calls start. */
ANYATTN_API void anyattn_set_host_parallel(anyattn_host_parallel_fn parallel);

/* ---------------------------------------------------------------------------------------------- */
/* Forward attention                                                                              */
/* ---------------------------------------------------------------------------------------------- */

/* How a forward call multiplies the probabilities P by V, and a backward call its gradient
 * products (anyattn_fwd_params::precision). */
typedef enum anyattn_precision {
  /* ANYATTN_PRECISION_ACCURATE, or ANYATTN_PRECISION_FAST where the environment variable
   * ANYATTN_PRECISION is "fast" ("accurate" or unset: accurate; any other value is an error). */
  ANYATTN_PRECISION_DEFAULT = 0,
  /* P V, and the backward's products, at f32 accuracy on every path: P (and P Z, dS) in f32 (on
   * avx512_amx, split into two bf16 parts whose sum is within 2^-16 of it). */
  ANYATTN_PRECISION_ACCURATE = 1,
  /* bf16 calls may round each probability once to bf16 (to nearest even) before P V, as
   * flash-attn's CUDA kernels do: a relative error of at most 2^-9 per term, the size of rounding
   * out to bf16, and still within the contract's rule (twice the error of a naive bf16 run, which
   * rounds both the scores and P). Paths with bf16 dot products run P V on them at twice the rate
   * (docs/semantics.md, section 1); other paths, and f32 and f16 calls, compute as accurate. The
   * backward's bf16 calls likewise may round P Z and dS before dV, dK and dQ. */
  ANYATTN_PRECISION_FAST = 2,
  /* Not a value: makes every non-negative int32 a valid value of this type. */
  ANYATTN_PRECISION_MAX_ENUM = 0x7fffffff
} anyattn_precision;

/* Options of a forward call. Always initialise with anyattn_fwd_params_init(), then set fields.
 * `struct_size` lets the struct grow: fields past struct_size take their defaults. */
typedef struct anyattn_fwd_params {
  /* sizeof(anyattn_fwd_params) as compiled by the caller; set by anyattn_fwd_params_init. */
  size_t struct_size;
  /* Multiplies <q_i, k_j>. 0 (the default) selects 1/sqrt(D), so a literal zero scale (uniform
   * attention) cannot be requested. Must be finite. */
  float softmax_scale;
  /* If > 0, scores become softcap * tanh(score / softcap) before ALiBi and masking. 0 = off. */
  float softcap;
  /* Non-zero: causal mask, i.e. window_right = 0 (bottom-right aligned, like flash-attn >= 2.1). */
  int32_t causal;
  /* Key j is visible to query i iff i + Sk - Sq - window_left <= j <= i + Sk - Sq + window_right.
   * -1 means unbounded on that side (the default for both). Values < -1 are rejected. */
  int32_t window_left;
  int32_t window_right;
  /* Optional f32 ALiBi slopes of shape (Hq) or (B, Hq): score += -slope * |i + Sk - Sq - j|.
   * NULL = off. */
  const anyattn_tensor* alibi_slopes;
  /* Optional f32 per-head sink logits of shape (Hq), in score units (not scaled). The sink joins
   * the softmax denominator and contributes no value. NULL = off. */
  const anyattn_tensor* sinks;
  /* Dropout probability in [0, 1). Probability P_ij of query head h in batch b is kept iff a
   * Philox-4x32-10 draw keyed by (dropout_seed, dropout_offset) at counter (j/4, i, h, b) passes
   * (docs/backward.md), then scaled by 1/(1-p); the softmax denominator and the LSE ignore
   * dropout. The same inputs give the same mask in the forward and the backward, for any thread
   * count. Not supported by anyattn_fwd_kvcache. */
  float dropout_p;
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  /* Number of splits of the key dimension. 0 (default) = chosen from the problem shape (never from
   * the thread count, so results are the same for any thread count). 1 = no split. */
  int32_t num_splits;
  /* Instruction-set path; ANYATTN_ISA_AUTO (default) picks the fastest. Forcing a path the CPU
   * cannot run returns ANYATTN_E_UNSUPPORTED. */
  int32_t isa;
  /* Backward only; the forward calls ignore it. Non-zero promises that the out and lse handed to
   * anyattn_bwd or anyattn_bwd_varlen are this library's forward results for exactly these q, k,
   * v and params, as an autograd function that saved them has them. The backward then normalises
   * each query row whose visible keys lie in one block of 64 from that row's own scores, and
   * takes its delta as sum_j P_ij dP_ij rather than <dout_i, out_i>: that removes the rounding of
   * lse and out from those rows; in bf16 and f16 dsinks is likewise summed from every row's
   * P_ij dP_ij instead of <dout_i, out_i> (docs/backward.md). 0 (the default) uses out and lse as
   * handed over, whatever they are; ring attention, for one, hands over merged results. */
  int32_t bwd_own_forward;
  /* An anyattn_precision value: ANYATTN_PRECISION_DEFAULT (the default), _ACCURATE or _FAST. The
   * forward calls (dense, varlen, KV cache) read it, and so does the backward: with FAST, bf16
   * calls may round P Z and dS to bf16 before dV, dK and dQ, as flash-attn's GPU backward does
   * (at most 2^-9 of each term; docs/backward.md, "Precision"). */
  int32_t precision;
} anyattn_fwd_params;

/* Fills `params` with defaults (see the field comments) and sets struct_size. */
ANYATTN_API void anyattn_fwd_params_init(anyattn_fwd_params* params);

/* Dense forward attention.
 *   q   (B, Sq, Hq, D)    f32/f16/bf16
 *   k   (B, Sk, Hk, D)    same dtype as q
 *   v   (B, Sk, Hk, Dv)   same dtype as q
 *   out (B, Sq, Hq, Dv)   same dtype as q; written
 *   lse (B, Hq, Sq)       f32; written; may be NULL
 *   params                may be NULL for all defaults
 * 0 <= D <= 576 and 0 <= Dv <= 512 (at every entry point). Any of B, Sq, Sk, Hq may be 0 (Hk
 * too when Hq is; docs/semantics.md, section 6). out must not overlap q, k, v or lse.
 * Fully masked rows (and Sk == 0) give out = 0 and lse = -inf, or lse = sink with a sink.
 * On any error nothing is written. */
ANYATTN_API anyattn_status anyattn_fwd(const anyattn_tensor* q, const anyattn_tensor* k,
                                       const anyattn_tensor* v, const anyattn_tensor* out,
                                       const anyattn_tensor* lse, const anyattn_fwd_params* params);

/* ---------------------------------------------------------------------------------------------- */
/* Variable-length forward                                                                        */
/* ---------------------------------------------------------------------------------------------- */

/* Forward attention over B packed sequences of different lengths.
 *   q   (total_q, Hq, D)     sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
 *   k   (total_k, Hk, D)     sequence b is rows [cu_seqlens_k[b], cu_seqlens_k[b+1])
 *   v   (total_k, Hk, Dv)
 *   out (total_q, Hq, Dv)    written
 *   lse (Hq, total_q) f32    written; may be NULL
 *   cu_seqlens_q, cu_seqlens_k   i32 (B + 1), non-decreasing, starting at >= 0, within total_q /
 *                                total_k, each length <= max_seqlen_q / max_seqlen_k
 *   seqused_k    i32 (B) or NULL: sequence b uses only its first seqused_k[b] keys
 * Every dense option applies per sequence (the mask is bottom-right aligned per sequence, ALiBi
 * positions are per sequence). Rows of q outside every sequence are not written. */
ANYATTN_API anyattn_status anyattn_fwd_varlen(
    const anyattn_tensor* q, const anyattn_tensor* k, const anyattn_tensor* v,
    const anyattn_tensor* out, const anyattn_tensor* lse, const anyattn_tensor* cu_seqlens_q,
    const anyattn_tensor* cu_seqlens_k, const anyattn_tensor* seqused_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, const anyattn_fwd_params* params);

/* ---------------------------------------------------------------------------------------------- */
/* KV-cache forward (flash_attn_with_kvcache)                                                     */
/* ---------------------------------------------------------------------------------------------- */

/* The cache-specific arguments of anyattn_fwd_kvcache. Initialise with anyattn_kvcache_params_init.
 * All tensors are optional (NULL) unless stated. */
typedef struct anyattn_kvcache_params {
  size_t struct_size;
  /* New keys/values (B, S_new, Hk, D) / (B, S_new, Hk, Dv), dtype of q: written into the cache at
   * positions cache_seqlens[b] .. cache_seqlens[b] + S_new - 1 before attention. Both or neither. */
  const anyattn_tensor* k_new;
  const anyattn_tensor* v_new;
  /* i32 (B): keys already in the cache per sequence. NULL: cache_seqlen for every sequence. */
  const anyattn_tensor* cache_seqlens;
  /* Used when cache_seqlens is NULL. -1 (the default) = the whole cache (S_cache; contiguous
   * caches only). */
  int64_t cache_seqlen;
  /* i32 (B): sequence b uses cache batch cache_batch_idx[b] (contiguous caches only). */
  const anyattn_tensor* cache_batch_idx;
  /* i32 (B): sequence b's keys start at cache position cache_leftpad[b]. */
  const anyattn_tensor* cache_leftpad;
  /* i32 (B, max_blocks): paged cache. k_cache/v_cache are then (num_blocks, page_size, Hk, D) and
   * cache position p of sequence b lives in page block_table[b][p / page_size]. */
  const anyattn_tensor* block_table;
  /* (S_ro, rotary_dim / 2), f32 or q's dtype: rotary embedding applied to the new keys at their
   * cache positions and to q (at cache_seqlens[b] + i when causal or windowed, else at
   * cache_seqlens[b]). Requires k_new. rotary_dim <= D, even. */
  const anyattn_tensor* rotary_cos;
  const anyattn_tensor* rotary_sin;
  /* Non-zero: rotate pairs (2t, 2t+1) (GPT-J); zero: pairs (t, t + rotary_dim/2) (GPT-NeoX). */
  int32_t rotary_interleaved;
  /* ---- 8-bit caches (k_cache/v_cache of dtype FP8_E4M3, FP8_E5M2 or I8; both the same) ----
   * The value of a cached element is  stored * descale[...] * token_scale[...]  (a factor is 1
   * when its tensor is NULL); attention runs on these values with f32 accumulation; q, k_new,
   * v_new and out stay f32/f16/bf16. The four tensors below must be NULL for an f32/f16/bf16
   * cache (ANYATTN_E_INVALID_ARGUMENT otherwise). An 8-bit shared latent cache (v_cache a
   * column view of k_cache) reads V from the K rows with K's scales: v_descale must then be NULL
   * or equal to k_descale, and v_token_scale NULL or k_token_scale itself (k_token_scale may be
   * given alone); ANYATTN_E_INVALID_ARGUMENT otherwise. docs/kvcache_8bit.md has the details.
   *
   * k_descale, v_descale: f32, NULL = 1. Shape (1): one per tensor; (Hk): one per kv head; (B, Hk):
   * one per sequence (index b of q, not the cache batch) and kv head, FlashAttention 3's layout.
   * Any strides, 0 included (a broadcast view; the entries are copied at the call). Every entry
   * must be finite and >= 0 (0 and subnormals are legal for reading: those values read as 0 /
   * scaled); when the call appends (k_new given) every entry must be a normal positive number (>=
   * FLT_MIN). Anything else: ANYATTN_E_INVALID_ARGUMENT naming the entry and its value. */
  const anyattn_tensor* k_descale;
  const anyattn_tensor* v_descale;
  /* k_token_scale, v_token_scale: f32, NULL = none. One scale per (cache position, kv head):
   * (B_cache, S_cache, Hk), or (num_blocks, page_size, Hk) for a paged cache. Cache data: read
   * as stored (not validated; a NaN or inf there propagates like a NaN in an f16 cache), and
   * written by the in-place append for the new positions. Both or neither (a shared latent
   * cache: k_token_scale alone, or v_token_scale the same tensor). */
  const anyattn_tensor* k_token_scale;
  const anyattn_tensor* v_token_scale;
} anyattn_kvcache_params;

/* The in-place append into an 8-bit cache quantizes each new key and value row (one position,
 * one kv head, after rotary), with qmax = 127 (I8), 448 (E4M3), 57344 (E5M2):
 *   with token scales: amax = max |x| over the row's finite elements;
 *                      token_scale = min(amax / (qmax * descale), FLT_MAX), rounded to f32
 *                      (0 for an all-zero row); stored = Q(x / (descale * token_scale)),
 *                      and a row whose token_scale is 0 stores zeros;
 *   without:           stored = Q(x / descale).
 * Each quotient is formed in f64 and rounded to f32 (after clamping to +-2 qmax); Q rounds to
 * nearest, ties to even, and saturates to the finite range: I8 to [-127, 127] (symmetric; a
 * stored -128 is still read as -128), E4M3 to +-448, E5M2 to +-57344; +-inf saturate too. NaN stays NaN in fp8 (E4M3 S.1111.111, E5M2 S.11111.11) and becomes 0 in I8. */

/* Fills `cache` with defaults (no new keys, whole cache, no paging, no rotary). */
ANYATTN_API void anyattn_kvcache_params_init(anyattn_kvcache_params* cache);

/* Forward attention of q against a KV cache, with optional in-place append and rotary.
 *   q       (B, Sq, Hq, D)
 *   k_cache (B_cache, S_cache, Hk, D) or paged (num_blocks, page_size, Hk, D); written when
 *           cache->k_new is given
 *   v_cache (B_cache, S_cache, Hk, Dv) or paged (num_blocks, page_size, Hk, Dv); likewise
 *   out     (B, Sq, Hq, Dv) written;  lse (B, Hq, Sq) f32 written, may be NULL
 * Sequence b attends to cache positions [leftpad_b, cache_seqlens[b] + S_new); the mask is
 * bottom-right aligned to that key count. Everything is validated (capacity, block table entries,
 * rotary table length) before the first write: a failed call leaves the cache untouched.
 * Shared latent cache (absorbed MLA, e.g. D = 576, Dv = 512, Hk = 1): v_cache may be a column
 * view of k_cache (same data pointer and strides, Dv <= D); V is then read from the K rows. With
 * an append, v_new must then be the same view of k_new (each row is written once, from k_new),
 * and rotary is unsupported. Other overlaps of the two caches are rejected when appending. */
ANYATTN_API anyattn_status anyattn_fwd_kvcache(const anyattn_tensor* q,
                                               const anyattn_tensor* k_cache,
                                               const anyattn_tensor* v_cache,
                                               const anyattn_tensor* out, const anyattn_tensor* lse,
                                               const anyattn_kvcache_params* cache,
                                               const anyattn_fwd_params* params);

/* Forward attention of packed variable-length queries against a KV cache: flash-attn's paged
 * varlen (flash_attn_varlen_func with block_table, as vLLM calls it) and its KV-cache call with
 * cu_seqlens_q, for batches that mix prefill chunks and decode steps. Reads the cache only.
 *   q       (total_q, Hq, D)     sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b+1])
 *   k_cache, v_cache             as in anyattn_fwd_kvcache (contiguous or paged)
 *   out     (total_q, Hq, Dv)    written;  lse (Hq, total_q) f32 written, may be NULL
 *   cu_seqlens_q  i32 (B + 1), non-decreasing, starting at >= 0, within total_q, each length
 *                 <= max_seqlen_q
 *   cache   cache_seqlens / cache_seqlen, cache_batch_idx, cache_leftpad, block_table as in
 *           anyattn_fwd_kvcache; k_new, v_new and the rotary tables must be NULL
 *           (ANYATTN_E_UNSUPPORTED otherwise); the 8-bit cache scales as in anyattn_fwd_kvcache
 *           ((B, Hk) descales indexed by sequence b)
 * Sequence b's queries attend to cache positions [leftpad_b, cache_seqlens[b]), the mask
 * bottom-right aligned per sequence (its queries are the last of its keys, as in chunked
 * prefill). Rows of q outside every sequence are not written. */
ANYATTN_API anyattn_status anyattn_fwd_kvcache_varlen(
    const anyattn_tensor* q, const anyattn_tensor* k_cache, const anyattn_tensor* v_cache,
    const anyattn_tensor* out, const anyattn_tensor* lse, const anyattn_tensor* cu_seqlens_q,
    int64_t max_seqlen_q, const anyattn_kvcache_params* cache, const anyattn_fwd_params* params);

/* ---------------------------------------------------------------------------------------------- */
/* Merging partial attention results                                                              */
/* ---------------------------------------------------------------------------------------------- */

/* Merges two attentions of the same queries over disjoint key sets (split-KV, ring attention,
 * cascades): out = (e^lse_a out_a + e^lse_b out_b) / (e^lse_a + e^lse_b), lse = log of the sum.
 *   out_a, out_b, out   (T, H, Dv) with lse (H, T), or (B, S, H, Dv) with lse (B, H, S)
 *   lse_a, lse_b        f32; -inf marks an empty partial result (it gets weight 0)
 *   lse_out             f32, may be NULL
 * out_a/out_b/out share one dtype (f32, f16, bf16). out may be exactly out_a or out_b (and lse_out
 * exactly lse_a or lse_b): the in-place form. Both partials empty gives out = 0, lse = -inf. */
ANYATTN_API anyattn_status anyattn_merge_attention_states(
    const anyattn_tensor* out_a, const anyattn_tensor* lse_a, const anyattn_tensor* out_b,
    const anyattn_tensor* lse_b, const anyattn_tensor* out, const anyattn_tensor* lse_out);

/* ---------------------------------------------------------------------------------------------- */
/* Backward                                                                                       */
/* ---------------------------------------------------------------------------------------------- */

/* Dense backward attention: the gradients of a loss L with respect to q, k, v (and the sinks),
 * given dout = dL/dout of the forward call with the same q, k, v and params.
 *   dout   (B, Sq, Hq, Dv)   same dtype as q
 *   q      (B, Sq, Hq, D)    f32/f16/bf16
 *   k      (B, Sk, Hk, D)    same dtype as q
 *   v      (B, Sk, Hk, Dv)   same dtype as q
 *   out    (B, Sq, Hq, Dv)   same dtype as q: the forward's output
 *   lse    (B, Hq, Sq)       f32: the forward's LSE (natural log; -inf or the sink for fully
 *                            masked rows). Required.
 *   dq     (B, Sq, Hq, D)    same dtype as q; written
 *   dk     (B, Sk, Hk, D)    same dtype as q; written (summed over each GQA group)
 *   dv     (B, Sk, Hk, Dv)   same dtype as q; written (summed over each GQA group)
 *   dsinks (Hq)              f32; written; required iff params->sinks is set, else NULL
 *   params                   the forward's params (NULL = defaults): scale, softcap, causal,
 *                            window, ALiBi (no slope gradient), sinks, dropout and isa mean the
 *                            same as in anyattn_fwd. dropout_p in [0, 1) is supported: the keep
 *                            mask is a pure function of (dropout_seed, dropout_offset, b, h, i, j)
 *                            (docs/backward.md) and kept probabilities are scaled by 1/(1-p).
 * Accumulation is f32. Gradients must not overlap each other or any input. Results are bitwise
 * identical for any thread count. Workspace is O(B * Hq * Sq) plus, per thread, O((3D + 2Dv) x
 * the keys of one chunk) (the key range is cut into chunks within a fixed budget), never Sq x Sk.
 * On any validation error nothing is written. */
ANYATTN_API anyattn_status anyattn_bwd(const anyattn_tensor* dout, const anyattn_tensor* q,
                                       const anyattn_tensor* k, const anyattn_tensor* v,
                                       const anyattn_tensor* out, const anyattn_tensor* lse,
                                       const anyattn_tensor* dq, const anyattn_tensor* dk,
                                       const anyattn_tensor* dv,
                                       const anyattn_tensor* dsinks_or_null,
                                       const anyattn_fwd_params* params);

/* Variable-length backward: the gradients of anyattn_fwd_varlen with the same q, k, v, lengths and
 * params, given dout = dL/dout.
 *   dout (total_q, Hq, Dv), q (total_q, Hq, D), k (total_k, Hk, D), v (total_k, Hk, Dv),
 *   out (total_q, Hq, Dv): as in anyattn_fwd_varlen, one dtype (f32/f16/bf16)
 *   lse  (Hq, total_q) f32: the forward's LSE. Required.
 *   dq   (total_q, Hq, D)     written for the rows of every sequence
 *   dk   (total_k, Hk, D)     written for the rows of every sequence (summed over each GQA group);
 *   dv   (total_k, Hk, Dv)    keys beyond seqused_k[b] get exact zeros
 *   dsinks (Hq) f32           written; required iff params->sinks is set, else NULL
 *   cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k: as in anyattn_fwd_varlen
 * Rows of dq, dk, dv outside every sequence are not written. The dropout mask of sequence b is
 * that of batch index b, positions counted within the sequence (as in the forward). Validation
 * and determinism as in anyattn_bwd. Workspace: Hq * total_q floats, per thread about
 * (3 D + 2 Dv) floats per key of the longest sequence's key chunk ((4 D + 2.5 Dv) for bf16 on
 * avx512_amx), and at most 128 MiB of dq partials (docs/backward.md); never Sq x Sk. */
ANYATTN_API anyattn_status anyattn_bwd_varlen(
    const anyattn_tensor* dout, const anyattn_tensor* q, const anyattn_tensor* k,
    const anyattn_tensor* v, const anyattn_tensor* out, const anyattn_tensor* lse,
    const anyattn_tensor* dq, const anyattn_tensor* dk, const anyattn_tensor* dv,
    const anyattn_tensor* dsinks_or_null, const anyattn_tensor* cu_seqlens_q,
    const anyattn_tensor* cu_seqlens_k, const anyattn_tensor* seqused_k_or_null,
    int64_t max_seqlen_q, int64_t max_seqlen_k, const anyattn_fwd_params* params);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ANYATTN_ANYATTN_H_ */
