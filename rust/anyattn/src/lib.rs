//! Safe Rust API of anyattn: exact attention with FlashAttention 2.x semantics on any CPU.
//!
//! The C++ library is built from this repository and linked statically by `anyattn-sys`.
//!
//! - [`fwd`]: dense forward attention over strided views ([`View`], [`ViewMut`]), with causal and
//!   sliding-window masks (bottom-right aligned), softcap, ALiBi, sinks and GQA/MQA, for `f32`,
//!   `half::f16` and `half::bf16`, optionally writing the log-sum-exp.
//! - [`bwd`]: dense backward attention (dq, dk, dv and the sinks' gradient).
//! - [`fwd_varlen`] and [`bwd_varlen`]: packed variable-length sequences (`cu_seqlens`).
//! - [`fwd_kvcache`]: attention against a contiguous or paged KV cache with in-place append and
//!   rotary embedding ([`KvCacheOptions`]); [`fwd_kvcache_varlen`]: packed variable-length
//!   queries against such a cache (paged varlen). [`fwd_kvcache_quantized`] and
//!   [`fwd_kvcache_varlen_quantized`] do the same over an 8-bit cache ([`QuantizedKvCache`]:
//!   [`F8E4M3`], [`F8E5M2`] or `i8` with descales and per-token scales).
//! - [`fwd_kvcache_latent`] and [`fwd_kvcache_varlen_latent`]: absorbed multi-head latent
//!   attention (MLA decode) against one shared latent cache ([`LatentCache`]), float or 8-bit,
//!   whose first `dv` columns are the values.
//! - [`merge_attention_states`] (and its in-place form): merging partial attentions over
//!   disjoint key sets.
//! - [`kernels`]: the forward kernel registry.
//! - Thread control ([`set_num_threads`], [`num_threads`]), instruction-set paths ([`Isa`]) and
//!   version queries.
//!
//! Every failure is an [`Error`] carrying the C library's message, which names the parameter, the
//! value given and what is supported.
//!
//! ```
//! use anyattn::{fwd, FwdOptions, View, ViewMut};
//! // One batch, 2 queries, 3 keys, 1 head, head dim 4.
//! let q = vec![0.5f32; 2 * 4];
//! let k = vec![0.25f32; 3 * 4];
//! let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
//! let mut out = vec![0f32; 2 * 4];
//! fwd(
//!     &View::contiguous(&q, &[1, 2, 1, 4])?,
//!     &View::contiguous(&k, &[1, 3, 1, 4])?,
//!     &View::contiguous(&v, &[1, 3, 1, 4])?,
//!     &mut ViewMut::contiguous(&mut out, &[1, 2, 1, 4])?,
//!     None,
//!     &FwdOptions { causal: true, ..Default::default() },
//! )?;
//! // Bottom-right aligned causal mask: the last query sees all three keys (equal scores).
//! assert!((out[4] - 4.0).abs() < 1e-5);
//! # Ok::<(), anyattn::Error>(())
//! ```
#![warn(missing_docs)]

mod error;
mod fp8;
mod fwd;
mod kvcache;
mod latent;
mod merge;
mod view;

use std::ffi::CStr;

use anyattn_sys as sys;

pub use error::{Error, Result, Status};
pub use fwd::{bwd, bwd_varlen, fwd, fwd_varlen, Dropout, FwdOptions, VarlenSeqs};
pub use half::{bf16, f16};
pub use fp8::{F8E4M3, F8E5M2};
pub use kvcache::{
    fwd_kvcache, fwd_kvcache_quantized, fwd_kvcache_varlen, fwd_kvcache_varlen_quantized,
    BlockTable, CacheSeqlens, KvCacheOptions, QuantizedKvCache, Rotary, TokenScales,
};
pub use latent::{fwd_kvcache_latent, fwd_kvcache_varlen_latent, LatentCache};
pub use merge::{merge_attention_states, merge_attention_states_in_place};
pub use view::{contiguous_strides, DType, Element, Quantized, Storage, View, ViewMut, MAX_NDIM};

/// The version of the linked C library as `(major, minor, patch)`.
pub fn version() -> (u32, u32, u32) {
    // SAFETY: no preconditions.
    let v = unsafe { sys::anyattn_version() }.max(0) as u32;
    (v / 10000, (v / 100) % 100, v % 100)
}

/// The version of the linked C library as `"major.minor.patch"`.
pub fn version_string() -> &'static str {
    // SAFETY: the C library returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(sys::anyattn_version_string()) }
        .to_str()
        .unwrap_or("unknown")
}

/// Sets the number of threads later calls use, process-wide; 0 restores the default (the
/// `ANYATTN_NUM_THREADS` environment variable if set, else the CPUs in the process's affinity
/// mask). Values above `i32::MAX` are clamped. Results do not depend on the thread count.
///
/// Concurrent calls share one pool and never oversubscribe it: a call that finds the pool busy
/// runs on its caller's thread alone.
pub fn set_num_threads(n: usize) {
    let n = i32::try_from(n).unwrap_or(i32::MAX);
    // SAFETY: no preconditions.
    unsafe { sys::anyattn_set_num_threads(n) }
}

/// The number of threads later calls will use.
pub fn num_threads() -> usize {
    // SAFETY: no preconditions.
    unsafe { sys::anyattn_get_num_threads() }.max(1) as usize
}

/// How a forward call multiplies the probabilities by V, and a backward call its gradient
/// products (`anyattn_precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// [`Precision::Accurate`], or [`Precision::Fast`] where the `ANYATTN_PRECISION` environment
    /// variable is "fast".
    #[default]
    Default,
    /// P V, and the backward's products, at f32 accuracy on every path.
    Accurate,
    /// bf16 calls may round each probability to bf16 (to nearest even) before P V, and the
    /// backward P Z and dS before dV, dK and dQ, as flash-attn's CUDA kernels do; paths with bf16
    /// dot products then run those products at twice the rate. f32 and f16 calls compute as
    /// accurate.
    Fast,
}

impl Precision {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Precision::Default => sys::ANYATTN_PRECISION_DEFAULT,
            Precision::Accurate => sys::ANYATTN_PRECISION_ACCURATE,
            Precision::Fast => sys::ANYATTN_PRECISION_FAST,
        }
    }
}

/// An instruction-set path of the CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isa {
    /// The fastest path the CPU supports, or the one named by the `ANYATTN_ISA` environment
    /// variable.
    #[default]
    Auto,
    /// Plain C++ that every machine runs.
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/DQ.
    Avx512,
    /// [`Isa::Avx512`] with bf16 forward products on AMX tiles (AVX512_BF16, AMX-TILE, AMX-BF16);
    /// every other call runs as on [`Isa::Avx512`].
    Avx512Amx,
    /// AArch64 Advanced SIMD (NEON).
    Neon,
}

impl Isa {
    /// Every path, `Auto` first.
    pub const ALL: [Isa; 6] = [
        Isa::Auto,
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Amx,
        Isa::Neon,
    ];

    pub(crate) fn raw(self) -> i32 {
        match self {
            Isa::Auto => sys::ANYATTN_ISA_AUTO,
            Isa::Portable => sys::ANYATTN_ISA_PORTABLE,
            Isa::Avx2 => sys::ANYATTN_ISA_AVX2,
            Isa::Avx512 => sys::ANYATTN_ISA_AVX512,
            Isa::Avx512Amx => sys::ANYATTN_ISA_AVX512_AMX,
            Isa::Neon => sys::ANYATTN_ISA_NEON,
        }
    }

    pub(crate) fn from_raw(raw: i32) -> Option<Isa> {
        match raw {
            sys::ANYATTN_ISA_AUTO => Some(Isa::Auto),
            sys::ANYATTN_ISA_PORTABLE => Some(Isa::Portable),
            sys::ANYATTN_ISA_AVX2 => Some(Isa::Avx2),
            sys::ANYATTN_ISA_AVX512 => Some(Isa::Avx512),
            sys::ANYATTN_ISA_AVX512_AMX => Some(Isa::Avx512Amx),
            sys::ANYATTN_ISA_NEON => Some(Isa::Neon),
            _ => None,
        }
    }

    /// Whether this build contains the path and the running CPU can execute it.
    pub fn is_supported(self) -> bool {
        // SAFETY: no preconditions.
        unsafe { sys::anyattn_isa_supported(self.raw()) != 0 }
    }

    /// The path [`Isa::Auto`] resolves to on this machine.
    pub fn resolved_default() -> Isa {
        // SAFETY: no preconditions.
        match unsafe { sys::anyattn_isa_default() } {
            sys::ANYATTN_ISA_AVX512_AMX => Isa::Avx512Amx,
            sys::ANYATTN_ISA_NEON => Isa::Neon,
            sys::ANYATTN_ISA_AVX512 => Isa::Avx512,
            sys::ANYATTN_ISA_AVX2 => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// The library's name for the path: "auto", "portable", "avx2", "avx512", "avx512_amx" or
    /// "neon".
    pub fn name(self) -> &'static str {
        // SAFETY: the C library returns a static NUL-terminated string.
        unsafe { CStr::from_ptr(sys::anyattn_isa_name(self.raw())) }
            .to_str()
            .unwrap_or("unknown")
    }
}

/// One forward kernel of the library's registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelInfo {
    /// The kernel's name, e.g. `"fwd_f32acc_avx512_6x64"`: the ISA, then the score tile's rows x
    /// keys.
    pub name: &'static str,
    /// The instruction-set path the kernel belongs to; `None` for a path these bindings do not
    /// know (a newer library).
    pub isa: Option<Isa>,
    /// Whether this CPU can run the kernel.
    pub supported: bool,
    /// Floats per vector register.
    pub vector_lanes: usize,
    /// Query rows per register tile.
    pub tile_rows: usize,
    /// Keys per register tile.
    pub tile_keys: usize,
}

/// The forward kernels compiled into the linked library, in registry order, supported or not.
pub fn kernels() -> Vec<KernelInfo> {
    // SAFETY: no preconditions.
    let count = unsafe { sys::anyattn_fwd_kernel_count() }.max(0);
    let mut list = Vec::with_capacity(count as usize);
    for index in 0..count {
        let mut info = std::mem::MaybeUninit::<sys::anyattn_kernel_info>::zeroed();
        // SAFETY: `index` is in [0, count) and `info` is valid for writes.
        let status = unsafe { sys::anyattn_fwd_kernel_info(index, info.as_mut_ptr()) };
        if status != sys::ANYATTN_OK {
            continue;
        }
        // SAFETY: a successful call filled every field.
        let info = unsafe { info.assume_init() };
        let name = if info.name.is_null() {
            "unknown"
        } else {
            // SAFETY: the registry's names are static NUL-terminated strings.
            unsafe { CStr::from_ptr(info.name) }
                .to_str()
                .unwrap_or("unknown")
        };
        list.push(KernelInfo {
            name,
            isa: Isa::from_raw(info.isa),
            supported: info.supported != 0,
            vector_lanes: info.vector_lanes.max(0) as usize,
            tile_rows: info.tile_rows.max(0) as usize,
            tile_keys: info.tile_keys.max(0) as usize,
        });
    }
    list
}
