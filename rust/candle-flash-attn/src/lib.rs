//! candle-flash-attn 0.11.1's public API on the CPU, through anyattn.
//!
//! This crate is named `candle-flash-attn` so that it can replace the crates.io crate in a whole
//! build with one `[patch]`, which makes candle-transformers' models (llama, mistral, qwen2,
//! gemma, phi3, ...) built with `use_flash_attn = true` run their CPU tensors:
//!
//! ```toml
//! [patch.crates-io]
//! candle-flash-attn = { path = "/path/to/anyattn/rust/candle-flash-attn" }
//! ```
//!
//! Every public item of candle-flash-attn 0.11.1 is here with the same signature: [`FlashAttn`]
//! (a `CustomOp3` with the same public fields) and the functions [`flash_attn`],
//! [`flash_attn_windowed`], [`flash_attn_alibi`], [`flash_attn_alibi_windowed`],
//! [`flash_attn_alibi_windowed_softcap`], [`flash_attn_varlen`], [`flash_attn_varlen_windowed`],
//! [`flash_attn_varlen_paged_windowed`], [`flash_attn_varlen_alibi`],
//! [`flash_attn_varlen_alibi_windowed`] and [`flash_attn_varlen_alibi_windowed_softcap`]. They
//! are computed by `candle-anyattn`, whose documentation lists the semantics and the (few,
//! more permissive) differences from the CUDA kernels.
//!
//! # CPU only
//!
//! CUDA (and Metal) tensors are an error that says so. This crate cannot hand them to
//! candle-flash-attn's CUDA kernels: a `[patch]` replaces crates.io's `candle-flash-attn` for
//! every dependent, and cargo keeps one semver-compatible version of a package per source, with
//! the patch counting as the crates.io source, so a dependency of this crate on
//! `candle-flash-attn = "=0.11.1"` (renamed or not) resolves to this crate itself, or makes
//! cargo drop the patch. The `cuda` feature is therefore a compile error.
#![warn(missing_docs)]

#[cfg(feature = "cuda")]
compile_error!(
    "candle-flash-attn (anyattn) has no CUDA kernels: as a [patch] of crates.io's \
     candle-flash-attn it cannot also depend on that crate's CUDA kernels (the patch counts as \
     crates.io's candle-flash-attn and cargo keeps one semver-compatible version per source, so \
     such a dependency resolves to this crate itself or makes cargo drop the patch). Build \
     without the `cuda` feature of this crate; to run CUDA tensors, remove the [patch] (and use \
     candle-anyattn with its `cuda` feature in code you edit). See docs/rust.md."
);

mod functions;

pub use candle_anyattn::FlashAttn;
pub use functions::*;
