//! Raw FFI declarations of anyattn's C ABI (`include/anyattn/anyattn.h`).
//!
//! The build script compiles the C++ library from this repository with CMake (the same sources and
//! the same runtime instruction-set dispatch as every other front end) and links it statically,
//! together with the C++ standard library and pthread.
//!
//! These declarations are written by hand. `tests/abi.rs` keeps them in sync with the header: it
//! compares every struct layout and constant against values reported by a small C file compiled
//! against the header, checks that every function the header exports is declared here, and the
//! same C file fails to compile when a function signature in the header changes.
//!
//! Everything here is `unsafe` to call; use the `anyattn` crate for a safe API.
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

use std::os::raw::{c_char, c_int, c_void};

/// `ANYATTN_VERSION_MAJOR`: the major version of the header these declarations follow.
pub const ANYATTN_VERSION_MAJOR: c_int = 0;
/// `ANYATTN_VERSION_MINOR`: the minor version of the header these declarations follow.
pub const ANYATTN_VERSION_MINOR: c_int = 1;
/// `ANYATTN_VERSION_PATCH`: the patch version of the header these declarations follow.
pub const ANYATTN_VERSION_PATCH: c_int = 0;
/// `ANYATTN_VERSION`: `major * 10000 + minor * 100 + patch`.
pub const ANYATTN_VERSION: c_int =
    ANYATTN_VERSION_MAJOR * 10000 + ANYATTN_VERSION_MINOR * 100 + ANYATTN_VERSION_PATCH;

/// `anyattn_status`: the result of every entry point. Kept as a plain integer so that a value
/// unknown to these declarations can never be undefined behaviour.
pub type anyattn_status = c_int;
/// Success.
pub const ANYATTN_OK: anyattn_status = 0;
/// A parameter is malformed: wrong shape, dtype, stride, range or a null pointer.
pub const ANYATTN_E_INVALID_ARGUMENT: anyattn_status = 1;
/// The request is well formed but names a feature this build or CPU does not provide.
pub const ANYATTN_E_UNSUPPORTED: anyattn_status = 2;
/// Workspace could not be allocated. Nothing was written to the outputs.
pub const ANYATTN_E_OUT_OF_MEMORY: anyattn_status = 3;
/// A bug in anyattn.
pub const ANYATTN_E_INTERNAL: anyattn_status = 4;

/// `anyattn_dtype`: element types of `anyattn_tensor::dtype`.
pub type anyattn_dtype = c_int;
/// IEEE binary32.
pub const ANYATTN_DTYPE_F32: anyattn_dtype = 0;
/// IEEE binary16.
pub const ANYATTN_DTYPE_F16: anyattn_dtype = 1;
/// bfloat16.
pub const ANYATTN_DTYPE_BF16: anyattn_dtype = 2;
/// 32-bit signed integer (sequence lengths, block tables).
pub const ANYATTN_DTYPE_I32: anyattn_dtype = 3;
/// float8 e4m3 (`torch.float8_e4m3fn`: no infinities, largest finite 448): 8-bit KV caches only.
pub const ANYATTN_DTYPE_FP8_E4M3: anyattn_dtype = 4;
/// float8 e5m2 (`torch.float8_e5m2`, IEEE-style, largest finite 57344): 8-bit KV caches only.
pub const ANYATTN_DTYPE_FP8_E5M2: anyattn_dtype = 5;
/// Signed int8: 8-bit KV caches only.
pub const ANYATTN_DTYPE_I8: anyattn_dtype = 6;

/// `ANYATTN_MAX_NDIM`: the largest rank an `anyattn_tensor` can describe.
pub const ANYATTN_MAX_NDIM: usize = 4;

/// `anyattn_tensor`: a strided view of memory, with shape and strides counted in elements.
///
/// Entries of `shape`/`strides` at or beyond `ndim` are ignored. The last dimension must have
/// stride 1.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct anyattn_tensor {
    /// Address of element (0, 0, ...).
    pub data: *mut c_void,
    /// An `anyattn_dtype` value.
    pub dtype: i32,
    /// Rank, 1 to `ANYATTN_MAX_NDIM`.
    pub ndim: i32,
    /// Extent of each dimension.
    pub shape: [i64; ANYATTN_MAX_NDIM],
    /// Stride of each dimension, in elements.
    pub strides: [i64; ANYATTN_MAX_NDIM],
}

/// `anyattn_isa`: instruction-set paths.
pub type anyattn_isa = c_int;
/// The fastest path the CPU supports (or the one named by the `ANYATTN_ISA` environment
/// variable).
pub const ANYATTN_ISA_AUTO: anyattn_isa = 0;
/// Plain C++ that every machine runs.
pub const ANYATTN_ISA_PORTABLE: anyattn_isa = 1;
/// x86-64 AVX2 + FMA + F16C.
pub const ANYATTN_ISA_AVX2: anyattn_isa = 2;
/// x86-64 AVX-512 F/BW/VL/DQ.
pub const ANYATTN_ISA_AVX512: anyattn_isa = 3;
/// `ANYATTN_ISA_AVX512` with bf16 forward products on AMX tiles.
pub const ANYATTN_ISA_AVX512_AMX: anyattn_isa = 4;
/// AArch64 Advanced SIMD (NEON).
pub const ANYATTN_ISA_NEON: anyattn_isa = 5;

/// `anyattn_precision`: how a forward call multiplies the probabilities by V.
pub type anyattn_precision = c_int;
/// `ANYATTN_PRECISION_ACCURATE`, or `ANYATTN_PRECISION_FAST` where the `ANYATTN_PRECISION`
/// environment variable is "fast".
pub const ANYATTN_PRECISION_DEFAULT: anyattn_precision = 0;
/// P V at f32 accuracy on every path.
pub const ANYATTN_PRECISION_ACCURATE: anyattn_precision = 1;
/// bf16 calls may round each probability to bf16 before P V (see anyattn.h).
pub const ANYATTN_PRECISION_FAST: anyattn_precision = 2;

/// `anyattn_parallel_body`: one body of a host's parallel region, `body(context, worker)`.
pub type anyattn_parallel_body =
    Option<unsafe extern "C" fn(context: *mut core::ffi::c_void, worker: c_int)>;
/// `anyattn_host_parallel_fn`: a host's parallel region (`anyattn_set_host_parallel`).
pub type anyattn_host_parallel_fn = Option<
    unsafe extern "C" fn(threads: c_int, body: anyattn_parallel_body, context: *mut core::ffi::c_void),
>;

/// `anyattn_kernel_info`: one forward kernel of the library's registry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct anyattn_kernel_info {
    /// Static name, e.g. "fwd_f32acc_avx512_6x64".
    pub name: *const c_char,
    /// An `anyattn_isa` value.
    pub isa: i32,
    /// 1 if this CPU can run it.
    pub supported: i32,
    /// Floats per vector register.
    pub vector_lanes: i32,
    /// Query rows per register tile.
    pub tile_rows: i32,
    /// Keys per register tile.
    pub tile_keys: i32,
}

/// `anyattn_kvcache_params`: the cache-specific arguments of [`anyattn_fwd_kvcache`].
/// Initialise with [`anyattn_kvcache_params_init`]; every tensor is optional (null).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct anyattn_kvcache_params {
    /// `size_of::<anyattn_kvcache_params>()`; set by `anyattn_kvcache_params_init`.
    pub struct_size: usize,
    /// New keys (B, S_new, Hk, D), written into the cache before attention.
    pub k_new: *const anyattn_tensor,
    /// New values (B, S_new, Hk, Dv).
    pub v_new: *const anyattn_tensor,
    /// i32 (B): keys already in the cache per sequence.
    pub cache_seqlens: *const anyattn_tensor,
    /// Used when `cache_seqlens` is null; -1 = the whole cache.
    pub cache_seqlen: i64,
    /// i32 (B): cache batch of each sequence (contiguous caches only).
    pub cache_batch_idx: *const anyattn_tensor,
    /// i32 (B): first cache position of each sequence.
    pub cache_leftpad: *const anyattn_tensor,
    /// i32 (B, max_blocks): paged cache block table.
    pub block_table: *const anyattn_tensor,
    /// Rotary cosines (S_ro, rotary_dim / 2).
    pub rotary_cos: *const anyattn_tensor,
    /// Rotary sines (S_ro, rotary_dim / 2).
    pub rotary_sin: *const anyattn_tensor,
    /// Non-zero: GPT-J interleaved pairs; zero: GPT-NeoX halves.
    pub rotary_interleaved: i32,
    /// f32 (1), (Hk) or (B, Hk) descale of an 8-bit key cache; null = 1.
    pub k_descale: *const anyattn_tensor,
    /// f32 descale of an 8-bit value cache, shaped like `k_descale`; null = 1.
    pub v_descale: *const anyattn_tensor,
    /// f32 (B_cache, S_cache, Hk) or paged (num_blocks, page_size, Hk) per-position key scales;
    /// written by the append. Null = none; both or neither.
    pub k_token_scale: *const anyattn_tensor,
    /// f32 per-position value scales, shaped like `k_token_scale`.
    pub v_token_scale: *const anyattn_tensor,
}

/// `anyattn_fwd_params`: options of a forward call. Initialise with [`anyattn_fwd_params_init`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct anyattn_fwd_params {
    /// `size_of::<anyattn_fwd_params>()`; set by `anyattn_fwd_params_init`.
    pub struct_size: usize,
    /// Multiplies `<q_i, k_j>`. 0 selects `1/sqrt(D)`. Must be finite.
    pub softmax_scale: f32,
    /// If > 0, scores become `softcap * tanh(score / softcap)`. 0 = off.
    pub softcap: f32,
    /// Non-zero: causal mask (`window_right = 0`, bottom-right aligned).
    pub causal: i32,
    /// Left window; -1 = unbounded.
    pub window_left: i32,
    /// Right window; -1 = unbounded.
    pub window_right: i32,
    /// Optional f32 ALiBi slopes of shape (Hq) or (B, Hq); null = off.
    pub alibi_slopes: *const anyattn_tensor,
    /// Optional f32 per-head sink logits of shape (Hq); null = off.
    pub sinks: *const anyattn_tensor,
    /// Dropout probability in [0, 1).
    pub dropout_p: f32,
    /// Seed of the dropout RNG.
    pub dropout_seed: u64,
    /// Offset of the dropout RNG.
    pub dropout_offset: u64,
    /// Splits of the key dimension; 0 = chosen from the problem shape.
    pub num_splits: i32,
    /// An `anyattn_isa` value; `ANYATTN_ISA_AUTO` picks the fastest.
    pub isa: i32,
    /// Backward only: non-zero promises that the out and lse handed to the backward are this
    /// library's forward results for these inputs and params (see anyattn.h); 0 uses them as
    /// handed over.
    pub bwd_own_forward: i32,
    /// An `anyattn_precision` value; `ANYATTN_PRECISION_DEFAULT` reads the environment.
    pub precision: i32,
}

extern "C" {
    /// The version of the linked library, encoded like [`ANYATTN_VERSION`].
    pub fn anyattn_version() -> c_int;
    /// The version as a static "major.minor.patch" string.
    pub fn anyattn_version_string() -> *const c_char;
    /// The thread-local message of the last failure on this thread, or "".
    pub fn anyattn_last_error() -> *const c_char;
    /// A static name for a status code.
    pub fn anyattn_status_name(status: anyattn_status) -> *const c_char;
    /// Fills `t` as a C-contiguous tensor of the given shape over `data`.
    pub fn anyattn_tensor_init_contiguous(
        t: *mut anyattn_tensor,
        data: *mut c_void,
        dtype: anyattn_dtype,
        ndim: i32,
        shape: *const i64,
    ) -> anyattn_status;
    /// Bytes per element of `dtype` (4, 2 or 1), or 0 for a value that is no dtype.
    pub fn anyattn_dtype_size(dtype: i32) -> i64;
    /// 1 if this build contains the path and the CPU can run it, else 0.
    pub fn anyattn_isa_supported(isa: anyattn_isa) -> c_int;
    /// The path `ANYATTN_ISA_AUTO` resolves to on this machine.
    pub fn anyattn_isa_default() -> anyattn_isa;
    /// A static name for an instruction-set path.
    pub fn anyattn_isa_name(isa: anyattn_isa) -> *const c_char;
    /// Number of forward kernels compiled into this build.
    pub fn anyattn_fwd_kernel_count() -> c_int;
    /// Fills `info` for kernel `index` in `[0, anyattn_fwd_kernel_count())`.
    pub fn anyattn_fwd_kernel_info(index: c_int, info: *mut anyattn_kernel_info) -> anyattn_status;
    /// Sets the process-wide thread count of later calls; `n <= 0` restores the default.
    pub fn anyattn_set_num_threads(n: c_int);
    /// The thread count later calls will use.
    pub fn anyattn_get_num_threads() -> c_int;
    /// Runs the parallel phases of later calls on the host's threads through `parallel`; `None`
    /// restores the library's pool (see `anyattn.h`).
    pub fn anyattn_set_host_parallel(parallel: anyattn_host_parallel_fn);
    /// Fills `params` with defaults and sets `struct_size`.
    pub fn anyattn_fwd_params_init(params: *mut anyattn_fwd_params);
    /// Dense forward attention; see `anyattn.h` for the full contract.
    pub fn anyattn_fwd(
        q: *const anyattn_tensor,
        k: *const anyattn_tensor,
        v: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse: *const anyattn_tensor,
        params: *const anyattn_fwd_params,
    ) -> anyattn_status;
    /// Variable-length forward over packed sequences (`cu_seqlens`); see `anyattn.h`.
    pub fn anyattn_fwd_varlen(
        q: *const anyattn_tensor,
        k: *const anyattn_tensor,
        v: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse: *const anyattn_tensor,
        cu_seqlens_q: *const anyattn_tensor,
        cu_seqlens_k: *const anyattn_tensor,
        seqused_k: *const anyattn_tensor,
        max_seqlen_q: i64,
        max_seqlen_k: i64,
        params: *const anyattn_fwd_params,
    ) -> anyattn_status;
    /// Fills `cache` with defaults (no new keys, whole cache, no paging, no rotary).
    pub fn anyattn_kvcache_params_init(cache: *mut anyattn_kvcache_params);
    /// Forward attention against a KV cache with optional append and rotary; see `anyattn.h`.
    pub fn anyattn_fwd_kvcache(
        q: *const anyattn_tensor,
        k_cache: *const anyattn_tensor,
        v_cache: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse: *const anyattn_tensor,
        cache: *const anyattn_kvcache_params,
        params: *const anyattn_fwd_params,
    ) -> anyattn_status;
    /// Packed variable-length queries against a KV cache that the call only reads (paged
    /// varlen); see `anyattn.h`.
    pub fn anyattn_fwd_kvcache_varlen(
        q: *const anyattn_tensor,
        k_cache: *const anyattn_tensor,
        v_cache: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse: *const anyattn_tensor,
        cu_seqlens_q: *const anyattn_tensor,
        max_seqlen_q: i64,
        cache: *const anyattn_kvcache_params,
        params: *const anyattn_fwd_params,
    ) -> anyattn_status;
    /// Merges two partial attentions over disjoint key sets; see `anyattn.h`.
    pub fn anyattn_merge_attention_states(
        out_a: *const anyattn_tensor,
        lse_a: *const anyattn_tensor,
        out_b: *const anyattn_tensor,
        lse_b: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse_out: *const anyattn_tensor,
    ) -> anyattn_status;
    /// Dense backward attention: dq, dk, dv (and dsinks) from dout and the forward's inputs,
    /// output and LSE; see `anyattn.h` for the full contract.
    pub fn anyattn_bwd(
        dout: *const anyattn_tensor,
        q: *const anyattn_tensor,
        k: *const anyattn_tensor,
        v: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse: *const anyattn_tensor,
        dq: *const anyattn_tensor,
        dk: *const anyattn_tensor,
        dv: *const anyattn_tensor,
        dsinks_or_null: *const anyattn_tensor,
        params: *const anyattn_fwd_params,
    ) -> anyattn_status;
    /// Variable-length backward; see `anyattn.h`.
    pub fn anyattn_bwd_varlen(
        dout: *const anyattn_tensor,
        q: *const anyattn_tensor,
        k: *const anyattn_tensor,
        v: *const anyattn_tensor,
        out: *const anyattn_tensor,
        lse: *const anyattn_tensor,
        dq: *const anyattn_tensor,
        dk: *const anyattn_tensor,
        dv: *const anyattn_tensor,
        dsinks_or_null: *const anyattn_tensor,
        cu_seqlens_q: *const anyattn_tensor,
        cu_seqlens_k: *const anyattn_tensor,
        seqused_k_or_null: *const anyattn_tensor,
        max_seqlen_q: i64,
        max_seqlen_k: i64,
        params: *const anyattn_fwd_params,
    ) -> anyattn_status;
}

/// The name of every function declared above, in header order. `tests/abi.rs` checks this list
/// against the functions `anyattn.h` exports, so a function added to the header fails the tests
/// until it is declared here.
pub const DECLARED_FUNCTIONS: &[&str] = &[
    "anyattn_version",
    "anyattn_version_string",
    "anyattn_last_error",
    "anyattn_status_name",
    "anyattn_tensor_init_contiguous",
    "anyattn_dtype_size",
    "anyattn_isa_supported",
    "anyattn_isa_default",
    "anyattn_isa_name",
    "anyattn_fwd_kernel_count",
    "anyattn_fwd_kernel_info",
    "anyattn_set_num_threads",
    "anyattn_get_num_threads",
    "anyattn_set_host_parallel",
    "anyattn_fwd_params_init",
    "anyattn_fwd",
    "anyattn_fwd_varlen",
    "anyattn_kvcache_params_init",
    "anyattn_fwd_kvcache",
    "anyattn_fwd_kvcache_varlen",
    "anyattn_merge_attention_states",
    "anyattn_bwd",
    "anyattn_bwd_varlen",
];

/// The value of every integer constant declared above, by its C name. `tests/abi.rs` compares
/// each with the header.
pub const DECLARED_CONSTANTS: &[(&str, i64)] = &[
    ("ANYATTN_VERSION_MAJOR", ANYATTN_VERSION_MAJOR as i64),
    ("ANYATTN_VERSION_MINOR", ANYATTN_VERSION_MINOR as i64),
    ("ANYATTN_VERSION_PATCH", ANYATTN_VERSION_PATCH as i64),
    ("ANYATTN_VERSION", ANYATTN_VERSION as i64),
    ("ANYATTN_OK", ANYATTN_OK as i64),
    (
        "ANYATTN_E_INVALID_ARGUMENT",
        ANYATTN_E_INVALID_ARGUMENT as i64,
    ),
    ("ANYATTN_E_UNSUPPORTED", ANYATTN_E_UNSUPPORTED as i64),
    ("ANYATTN_E_OUT_OF_MEMORY", ANYATTN_E_OUT_OF_MEMORY as i64),
    ("ANYATTN_E_INTERNAL", ANYATTN_E_INTERNAL as i64),
    ("ANYATTN_DTYPE_F32", ANYATTN_DTYPE_F32 as i64),
    ("ANYATTN_DTYPE_F16", ANYATTN_DTYPE_F16 as i64),
    ("ANYATTN_DTYPE_BF16", ANYATTN_DTYPE_BF16 as i64),
    ("ANYATTN_DTYPE_I32", ANYATTN_DTYPE_I32 as i64),
    ("ANYATTN_DTYPE_FP8_E4M3", ANYATTN_DTYPE_FP8_E4M3 as i64),
    ("ANYATTN_DTYPE_FP8_E5M2", ANYATTN_DTYPE_FP8_E5M2 as i64),
    ("ANYATTN_DTYPE_I8", ANYATTN_DTYPE_I8 as i64),
    ("ANYATTN_MAX_NDIM", ANYATTN_MAX_NDIM as i64),
    ("ANYATTN_ISA_AUTO", ANYATTN_ISA_AUTO as i64),
    ("ANYATTN_ISA_PORTABLE", ANYATTN_ISA_PORTABLE as i64),
    ("ANYATTN_ISA_AVX2", ANYATTN_ISA_AVX2 as i64),
    ("ANYATTN_ISA_AVX512", ANYATTN_ISA_AVX512 as i64),
    ("ANYATTN_ISA_AVX512_AMX", ANYATTN_ISA_AVX512_AMX as i64),
    ("ANYATTN_ISA_NEON", ANYATTN_ISA_NEON as i64),
];
